"""``local.devices_per_worker``: the devices each local worker exposes, so the local pod rehearses the slice's
layout (replicas x partitions, the batch split), and what the T5X backend makes of it: its check and its
launch plan. Pure: no backend venv, no process started."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuft.backends.spec import LOCAL_DEVICES_ENV, ClusterShape
from tpuft.backends.t5x import BACKEND, T5x
from tpuft.config import load_cluster, load_recipe
from tpuft.worker.t5x.train import layout_line, with_host_device_count

REPO = Path(__file__).resolve().parents[2]


def shape_of(tmp_path: Path, text: str) -> ClusterShape:
    path = tmp_path / "tpuft.yaml"
    path.write_text(text)
    return load_cluster(path).value.shape()


def test_the_default_is_the_accelerators_chips_per_host(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, "provider: local\naccelerator: v4-32\n")
    # 4 workers x 4 devices
    assert (shape.hosts, shape.local_devices, shape.local_devices_set) == (
        4,
        4,
        False,
    )
    shape = shape_of(tmp_path, "provider: local\naccelerator: v5litepod-8\n")  # one host of 8 chips
    assert (shape.hosts, shape.local_devices, shape.local_devices_set) == (1, 8, False)


def test_an_explicit_count_is_kept_and_marked_as_set(tmp_path: Path) -> None:
    shape = shape_of(
        tmp_path, "provider: local\naccelerator: v4-16\nlocal:\n  workers: 3\n  devices_per_worker: 2\n"
    )
    assert (shape.hosts, shape.local_devices, shape.local_devices_set) == (3, 2, True)


def test_a_tpu_host_ignores_it(tmp_path: Path) -> None:
    shape = shape_of(
        tmp_path, "provider: gcp\naccelerator: v4-32\ngcp: {project: my-project, zone: us-central2-b}\n"
    )
    assert (shape.target, shape.chips, shape.local_devices) == ("tpu", 16, 1)


def quickstart(*overrides: str, eval_batch: int = 240):  # type: ignore[no-untyped-def]
    """The T5X quickstart; its eval batch 240 splits over 2, 3, 4, 8 and 16 replicas (the recipe's 250 over
    2)."""
    return load_recipe(
        REPO / "tpuft" / "recipes" / "t5x_quickstart.yaml", [f"eval.batch_size={eval_batch}", *overrides]
    ).value


def local(hosts: int, devices: int) -> ClusterShape:
    return ClusterShape(
        hosts=hosts, chips_per_host=4, target="cpu", local_devices=devices, local_devices_set=True
    )


def test_t5x_splits_the_batch_over_every_local_device_as_on_the_slice() -> None:
    v4_32 = ClusterShape(hosts=4, chips_per_host=4, target="tpu")
    recipe = quickstart("backend.num_partitions=2")  # batch 32
    assert T5x.data_parallel(recipe, local(4, 4)) == T5x.data_parallel(recipe, v4_32) == 8
    assert BACKEND.check(recipe, local(4, 4)) == BACKEND.check(recipe, v4_32) == []
    assert T5x.data_parallel(quickstart(), local(2, 2)) == 4
    ((path, message),) = BACKEND.check(quickstart("train.batch_size=6"), local(2, 2))
    assert (
        path == ("train", "batch_size")
        and message == "6 does not split evenly over 4 data-parallel replicas (use a multiple of 4)"
    )
    # the inference eval's batch too: T5X stops at its first evaluation otherwise (the quickstart's 250 on 8
    # replicas)
    ((path, message),) = BACKEND.check(quickstart(eval_batch=250), local(2, 4))
    assert path == ("eval", "batch_size") and message.startswith(
        "250 does not split evenly over 8 data-parallel replicas"
    )
    assert BACKEND.check(quickstart(eval_batch=250), local(2, 1)) == []
    ((path, message),) = BACKEND.check(quickstart("backend.num_partitions=8"), local(2, 2))
    assert path == ("backend", "num_partitions") and message == "8 does not divide the 4 devices"


def test_t5x_partitions_must_tile_the_local_workers() -> None:
    # in a worker
    assert BACKEND.check(quickstart("backend.num_partitions=4", "train.batch_size=36"), local(3, 4)) == []
    assert BACKEND.check(quickstart("backend.num_partitions=4"), local(4, 2)) == []  # over 2 whole workers
    ((path, message),) = BACKEND.check(
        quickstart("backend.num_partitions=3", "train.batch_size=36"), local(3, 2)
    )
    assert (
        path == ("backend", "num_partitions") and "do not tile the local workers' 2 devices each" in message
    )


def test_t5x_plan_tells_the_local_trainer_its_device_count() -> None:
    plan = BACKEND.plan(quickstart(), local(2, 2))
    assert plan.env[LOCAL_DEVICES_ENV] == "2" and plan.env["JAX_PLATFORMS"] == "cpu"
    assert (
        LOCAL_DEVICES_ENV
        not in BACKEND.plan(quickstart(), ClusterShape(hosts=2, chips_per_host=4, target="tpu")).env
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("", "--xla_force_host_platform_device_count=2"),
        ("--xla_dump_to=/tmp/d", "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=2"),
        (
            "--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false",
            "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2",
        ),
    ],
)
def test_the_device_count_joins_the_workers_own_xla_flags(flags: str, expected: str) -> None:
    assert with_host_device_count(flags, 2) == expected


def test_the_layout_line_names_the_mesh_and_a_sharded_parameter() -> None:
    layout = {
        "mesh": {"data": 2, "model": 2},
        "hosts": 2,
        "devices_per_host": 2,
        "params": 52,
        "params_sharded": 40,
        "example": {
            "name": "token_embedder/embedding",
            "shape": [384, 128],
            "spec": "P('model', None)",
            "per_device": [192, 128],
        },
    }
    assert layout_line(layout) == (
        "device layout: 2 host(s) x 2 device(s), mesh data 2 x model 2 (2 replicas x 2 partitions); 40 of 52 "
        "parameter arrays split over 'model', e.g. token_embedder/embedding (384, 128) as P('model', None): "
        "(192, 128) per device"
    )


def test_the_dry_run_shows_the_layout(tmp_path: Path) -> None:
    from tpuft.ops.plan import lines, plan

    path = tmp_path / "tpuft.yaml"
    path.write_text(
        "name: lp\nprovider: local\naccelerator: v4-16\nlocal:\n  devices_per_worker: 2\n  state_dir: "
        f"{tmp_path}\n"
    )
    recipe = load_recipe(
        REPO / "tpuft" / "recipes" / "t5x_quickstart.yaml",
        ["backend.num_partitions=2", "eval.batch_size=240"],
    )
    shown = lines(plan(load_cluster(path).value, "up", recipe))
    assert (
        "  device layout: 2 worker(s) x 2 CPU device(s) = 4 devices: 2 replica(s) x 2 partition(s)" in shown
    )
    gcp = tmp_path / "gcp.yaml"
    gcp.write_text(
        "name: tp\nprovider: gcp\naccelerator: v4-32\ngcp: {project: my-project, zone: us-central2-b}\n"
    )
    assert (
        plan(load_cluster(gcp).value, "up", recipe).layout
        == "4 worker(s) x 4 TPU device(s) = 16 devices: 8 replica(s) x 2 partition(s)"
    )
