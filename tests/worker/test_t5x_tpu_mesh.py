"""The model-parallel tile tpuft gives T5X on the TPUs its mesh table does not know (v5e, v5p, v6e, TPU7x):
T5X's own rule (both cores of a two-device chip first, then x, y, z), for any bounds. The real meshes are
built and compiled for TPU7x and v6e topologies in tests/test_compile_fit.py."""

from __future__ import annotations

import pytest

from tpuft.worker.t5x.tpu_mesh import submesh


@pytest.mark.parametrize(
    ("partitions", "bounds", "tile"),
    [
        (1, (2, 2, 2, 2), (1, 1, 1, 1)),  # tpu7x-16: one device per replica
        (2, (2, 2, 2, 2), (1, 1, 1, 2)),  # the chip's two TensorCores
        (4, (2, 2, 2, 2), (2, 1, 1, 2)),
        (8, (2, 2, 2, 2), (2, 2, 1, 2)),
        (16, (2, 2, 2, 2), (2, 2, 2, 2)),
        (2, (2, 4, 1, 1), (2, 1, 1, 1)),  # v6e-8: one device per chip
        (4, (2, 4, 1, 1), (2, 2, 1, 1)),
        (8, (2, 4, 1, 1), (2, 4, 1, 1)),
        (4, (2, 2, 1, 1), (2, 2, 1, 1)),  # v5p-8 (megacore)
    ],
)
def test_the_tile_takes_the_cores_then_x_y_z(
    partitions: int, bounds: tuple[int, ...], tile: tuple[int, ...]
) -> None:
    assert submesh(partitions, bounds) == tile


@pytest.mark.parametrize(("partitions", "bounds"), [(3, (2, 2, 2, 2)), (32, (2, 2, 2, 2)), (0, (2, 4, 1, 1))])
def test_a_number_the_slice_cannot_tile_is_refused_naming_both(
    partitions: int, bounds: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match=f"num_partitions {partitions} .*{bounds[0]}, {bounds[1]}"):
        submesh(partitions, bounds)
