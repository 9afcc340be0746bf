"""T5X Multislice without a stack (tpuft/worker/t5x/multislice.py): the run gin's ICI/DCN mesh bindings, and
the local pod's stand-in for a device's slice (the processes of one slice are one granule). The real stack's
mesh is proved by the 2-slice training of tests/e2e/test_t5x_e2e.py and the 2-slice TPU compile of
tests/test_compile_fit.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.venvs import t5x_source_settings
from tests.worker.test_t5x_parts import QUICKSTART
from tests.worker.test_t5x_train_keys import SPEC
from tpuft.config import load_recipe
from tpuft.worker.t5x.gin import run_gin
from tpuft.worker.t5x.multislice import mesh_bindings, slice_granules
from tpuft.worker.t5x.train import layout_line


@dataclass(frozen=True)
class Device:
    id: int
    process_index: int


def test_one_slice_binds_no_mesh_shapes() -> None:
    assert mesh_bindings(1, 8, 2) == {}
    recipe = load_recipe(QUICKSTART).value
    assert "ici_mesh_shape" not in run_gin(recipe, SPEC, model_dir="/m", initial_step=0, cpu=True, devices=8)


def test_slices_are_the_outer_axis_and_partitions_stay_in_one_slice() -> None:
    # 2 slices of 8 devices, 2 partitions: replica 2 (DCN) x data 4 x model 2 (ICI)
    assert mesh_bindings(2, 16, 2) == {
        "partitioning.PjitPartitioner.ici_mesh_shape": [1, 4, 2],
        "partitioning.PjitPartitioner.dcn_mesh_shape": [2, 1, 1],
    }
    recipe = load_recipe(QUICKSTART, ["backend.num_partitions=2"]).value
    text = run_gin(recipe, SPEC, model_dir="/m", initial_step=0, cpu=True, slices=2, devices=4)
    assert "partitioning.PjitPartitioner.ici_mesh_shape = [1, 1, 2]\n" in text
    assert "partitioning.PjitPartitioner.dcn_mesh_shape = [2, 1, 1]\n" in text


def test_a_slice_is_its_processes_devices_in_worker_order() -> None:
    # 2 slices x 2 hosts x 2 devices, listed out of order: JAX numbers a Multislice job's processes slice by
    # slice
    devices = [Device(id, id // 2) for id in (7, 0, 5, 2, 1, 6, 3, 4)]
    granules = slice_granules(devices, 2)
    assert [[d.id for d in granule] for granule in granules] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert {d.process_index for d in granules[1]} == {2, 3}
    with pytest.raises(ValueError, match="4 processes do not split into 3 equal slices"):
        slice_granules(devices, 3)


def test_the_layout_line_counts_replicas_over_every_slice() -> None:
    layout = {
        "mesh": {"replica": 2, "data": 1, "model": 2},
        "hosts": 2,
        "devices_per_host": 2,
        "params": 10,
        "params_sharded": 4,
        "sharded_over": ["model"],
    }
    assert layout_line(layout) == (
        "device layout: 2 host(s) x 2 device(s), mesh replica 2 x data 1 x model 2 "
        "(2 replicas x 2 partitions); 4 of 10 parameter arrays split over 'model'"
    )


@pytest.mark.slow
def test_the_compile_of_two_slices_has_the_slices_as_its_replica_axis(
    cli, tmp_path: Path, t5x_python: str
) -> None:  # type: ignore[no-untyped-def]
    """``recipes show --compile`` for a cluster of 2 x v4-8 (gcp.slices): libtpu's topology of 2 slices gives
    its devices a slice_index, T5X's hybrid mesh puts the slices on ``replica``, and the step is compiled for
    it."""
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        "provider: gcp\naccelerator: v4-8\ngcp: {project: my-project, zone: us-central2-b, slices: 2, "
        "queued: true}\n"
    )
    done = cli(
        "recipes",
        "show",
        "--summary",
        "t5x_quickstart",
        "--compile",
        "--json",
        "-c",
        str(cluster),
        "--set",
        "backend.num_partitions=2",
        *t5x_source_settings(),
    )
    assert done.code == 0, done.err
    compiled = json.loads(done.out)["compile"]["compiled"]
    extra = compiled["extra"]
    assert compiled["devices"] == 8 and extra["slices"] == 2 and extra["hosts"] == 2
    assert compiled["mesh"] == {"replica": 2, "data": 2, "model": 2}
    assert extra["global_batch"] == 32 and compiled["argument_bytes"] > 0
