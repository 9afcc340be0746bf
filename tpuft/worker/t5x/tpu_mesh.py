"""T5X's mesh on the TPUs its ``default_mesh`` has no table for: v5e, v5p, v6e, TPU7x.

T5X builds a single-slice mesh from a ``model_parallel_submesh`` (the x, y, z, core tile that one model
replica spans), which it picks from a table keyed by the device kind: 'TPU v2', 'TPU v3' and 'TPU v4' (and v4
lite) only. Any other kind raises "No default mesh for this configuration: specify
config.model_parallel_submesh explicitly", so a T5X recipe ran on no TPU newer than v4. tpuft's compile for
the slice (``recipes show --compile``) found it on v5p, v6e and TPU7x alike.

:func:`submesh` is the tile by T5X's own rule, written for any bounds: on a chip with two devices (v2/v3 and
TPU7x show both TensorCores) the partitions take both cores first, then the torus axes x, y, z in turn, each
as far as it divides; ``num_partitions`` 1 is one device. For T5X's known kinds nothing changes
(:func:`install` wraps ``t5x.partitioning.default_mesh`` only for the others).
"""

from __future__ import annotations

import math
from typing import Any

T5X_KINDS = frozenset({"TPU v2", "TPU v3", "TPU v4", "TPU v4 lite"})
"""The device kinds T5X's ``default_mesh`` has a table for."""


def submesh(num_partitions: int, bounds: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The x, y, z, core tile of ``num_partitions`` devices within ``bounds`` (the slice's x, y, z and the
    devices per chip); a ValueError naming both when it does not fit."""
    x, y, z, cores = (tuple(bounds) + (1, 1, 1, 1))[:4]
    if num_partitions < 1 or num_partitions > x * y * z * cores:
        raise ValueError(f"num_partitions {num_partitions} does not fit a slice of bounds {tuple(bounds)}")
    core = cores if num_partitions % cores == 0 else math.gcd(num_partitions, cores)
    rest = num_partitions // core
    tile = [1, 1, 1]
    for axis, size in enumerate((x, y, z)):
        tile[axis] = math.gcd(rest, size)
        rest //= tile[axis]
    if rest != 1:
        raise ValueError(
            f"num_partitions {num_partitions} cannot be tiled on a slice of bounds {tuple(bounds)} "
            "(x, y, z, cores): choose a number that divides its devices along its axes"
        )
    return tile[0], tile[1], tile[2], core


def install() -> None:
    """Let ``t5x.partitioning.default_mesh`` build the mesh of a TPU kind it has no table for (T5X reads its
    devices through its module's ``jax``, which the compile for a topology replaces: so does this)."""
    from t5x import partitioning

    original = partitioning.default_mesh
    if getattr(original, "tpuft_tpu_mesh", False):
        return

    def default_mesh(
        num_partitions: int,
        model_parallel_submesh: Any = None,
        backend: str | None = None,
        ici_mesh_shape: Any = None,
        dcn_mesh_shape: Any = None,
    ) -> Any:
        last = partitioning.jax.devices(backend)[-1]
        if (
            last.platform == "tpu"
            and last.device_kind not in T5X_KINDS
            and not model_parallel_submesh
            and ici_mesh_shape is None
        ):
            tile = submesh(num_partitions, tuple(partitioning.bounds_from_last_device(last)))
            return partitioning.get_mesh(tile, backend=backend)
        return original(num_partitions, model_parallel_submesh, backend, ici_mesh_shape, dcn_mesh_shape)

    default_mesh.tpuft_tpu_mesh = True  # type: ignore[attr-defined]
    partitioning.default_mesh = default_mesh
