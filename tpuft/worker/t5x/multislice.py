"""T5X Multislice: the slices as the outer data-parallel axis, through T5X's own settings, and the local pod's
stand-in for the devices' slice numbers.

T5X runs Multislice when its partitioner has both ``ici_mesh_shape`` (the mesh within a slice, over its fast
inter-chip links) and ``dcn_mesh_shape`` (the mesh of slices, over the data-centre network): the mesh then has
the axes ``replica`` x ``data`` x ``model``, ``PjitPartitioner`` maps the logical ``batch`` axis onto
``('replica', 'data')`` (and its ``data_partition_spec`` too, so each host reads the rows of the replicas its
devices hold), and the weights stay split over ``model`` only. tpuft binds ``replica`` = the slices (DCN),
``data`` = the replicas within a slice, ``model`` = ``num_partitions`` within a slice: the only traffic
between slices is the gradients' all-reduce over ``replica``, never a model-parallel collective.

T5X's ``default_mesh`` builds that mesh with JAX's ``create_hybrid_device_mesh``, which groups the devices by
their ``slice_index``. A TPU device has one (the runtime sets it from ``MEGASCALE_SLICE_ID``); a CPU device
has none in one process and 0 in every process of a distributed run (the CPU client has no slices), so on the
local pod
:func:`install_cpu_slice_granules` stands in for it: the devices of processes
``s * hosts_per_slice .. (s + 1) * hosts_per_slice - 1`` are slice ``s`` (workers are numbered slice by slice,
as JAX numbers a Multislice job's processes). That is JAX's own ``process_is_granule`` fallback with the
processes of one slice as one granule; each slice's block is still cut by JAX's ``create_device_mesh``. Only
CPU devices are regrouped: on TPU (and in the offline TPU compile, whose topology devices carry
``slice_index``) JAX's function runs as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PARTITIONER = "partitioning.PjitPartitioner"


def mesh_bindings(slices: int, devices: int, partitions: int) -> dict[str, list[int]]:
    """The run gin's Multislice bindings for ``devices`` in all (every slice the same), or {} on one slice."""
    if slices <= 1:
        return {}
    per_slice = devices // slices
    return {
        f"{PARTITIONER}.ici_mesh_shape": [1, max(1, per_slice // partitions), partitions],
        f"{PARTITIONER}.dcn_mesh_shape": [slices, 1, 1],
    }


def slice_granules(devices: Sequence[Any], slices: int) -> list[list[Any]]:
    """The devices of each slice, slice by slice, each in (process, id) order: a device's slice is its
    process's rank over the hosts of one slice."""
    processes = len({device.process_index for device in devices})
    if slices < 1 or processes % slices:
        raise ValueError(f"{processes} processes do not split into {slices} equal slices")
    hosts = processes // slices
    granules: list[list[Any]] = [[] for _ in range(slices)]
    for device in sorted(devices, key=lambda d: (d.process_index, d.id)):
        granules[device.process_index // hosts].append(device)
    return granules


def cpu_hybrid_device_mesh(
    mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int], devices: Sequence[Any] | None = None
) -> Any:
    """``create_hybrid_device_mesh`` for CPU devices, slices as the granules (see the module's docstring)."""
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    devices = list(jax.devices() if devices is None else devices)
    slices = int(np.prod(dcn_mesh_shape))
    blocks = [
        mesh_utils.create_device_mesh(mesh_shape, granule) for granule in slice_granules(devices, slices)
    ]
    order = np.arange(slices).reshape(dcn_mesh_shape)
    return np.block(np.vectorize(lambda i: blocks[i], otypes=[object])(order).tolist())


def install_cpu_slice_granules() -> None:
    """T5X's ``create_hybrid_device_mesh`` regroups CPU devices by slice (once per process); any other device
    goes to JAX's own function."""
    from t5x import partitioning

    real = partitioning.create_hybrid_device_mesh
    if getattr(real, "_tpuft_slices", False):
        return

    def create_hybrid_device_mesh(
        mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int],
        devices: Sequence[Any] | None = None,
        **options: Any,
    ) -> Any:
        import jax

        chosen = list(jax.devices() if devices is None else devices)
        if chosen and chosen[-1].platform == "cpu":
            return cpu_hybrid_device_mesh(mesh_shape, dcn_mesh_shape, chosen)
        return real(mesh_shape, dcn_mesh_shape, devices, **options)

    create_hybrid_device_mesh._tpuft_slices = True  # type: ignore[attr-defined]
    partitioning.create_hybrid_device_mesh = create_hybrid_device_mesh
