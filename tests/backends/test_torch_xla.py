"""What the PyTorch/XLA backend tells shared code: its recipe section, its check and launch plan for a cluster
shape, its run layout, and its part of the train summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE
from tpuft.backends import kinds
from tpuft.backends.base import ClusterShape, get_backend
from tpuft.backends.spec import RunOutcome
from tpuft.backends.torch_xla import LAYOUT, TorchXlaBackend
from tpuft.config import load_recipe
from tpuft.readers.runs import RunSnapshot, WorkerView
from tpuft.storage import open_storage

BACKEND = get_backend("torch_xla")


@pytest.fixture
def recipe(recipe_dir: Path):  # type: ignore[no-untyped-def]
    path = recipe_dir / "r.yaml"
    path.write_text(MINIMAL_RECIPE.replace("batch_size: 4", "batch_size: 24"))
    return load_recipe(path).value


def test_the_registry_builds_the_recipe_union() -> None:
    assert kinds() == ["keras", "t5x", "torch_xla"] and BACKEND.config_model is TorchXlaBackend
    assert TorchXlaBackend().torch_version == "2.9.0"


def test_batch_is_checked_against_replicas_not_hosts(recipe) -> None:  # type: ignore[no-untyped-def]
    # 24 over 2 workers
    assert BACKEND.check(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu")) == []
    # 16 chips
    ((path, message),) = BACKEND.check(recipe, ClusterShape(hosts=4, chips_per_host=4, target="tpu"))
    assert path == ("train", "batch_size")
    assert (
        "24 does not split evenly over 16 replicas (4 hosts x 4 devices)" in message and "e.g. 16" in message
    )
    ((_, message),) = BACKEND.check(
        recipe, ClusterShape(hosts=2, chips_per_host=4, target="tpu", devices_per_chip=2)
    )
    # a v3-16: 16 TensorCores
    assert "24 does not split evenly over 16 replicas (2 hosts x 8 devices)" in message
    accumulated = recipe.model_copy(update={"train": recipe.train.model_copy(update={"grad_accum_steps": 5})})
    ((_, message),) = BACKEND.check(accumulated, ClusterShape(hosts=2, chips_per_host=4, target="cpu"))
    assert "24 does not split evenly over 2 workers x 5 accumulation steps (use a multiple of 10" in message

    fsdp = recipe.model_copy(
        update={
            "train": recipe.train.model_copy(update={"sharding": "fsdp"}),
            "data": recipe.data.model_copy(update={"test": recipe.data.train}),
        }
    )
    assert BACKEND.check(fsdp, ClusterShape(hosts=1, chips_per_host=4, target="tpu")) == []
    assert BACKEND.check(fsdp, ClusterShape(hosts=2, chips_per_host=4, target="cpu")) == []
    ((path, message),) = BACKEND.check(fsdp, ClusterShape(hosts=2, chips_per_host=4, target="tpu"))
    assert path == ("data", "test") and "fsdp runs on one TPU host only (2 here" in message


def test_launch_plan_runs_on_every_host_with_the_runtime_env(recipe) -> None:  # type: ignore[no-untyped-def]
    cpu = BACKEND.plan(recipe, ClusterShape(hosts=3, chips_per_host=4, target="cpu"))
    assert cpu.workers == (0, 1, 2) and cpu.env["PJRT_DEVICE"] == "CPU" and cpu.argv == ("-m", "tpuft.worker")
    tpu = BACKEND.plan(recipe, ClusterShape(hosts=2, chips_per_host=4, target="tpu"))
    assert tpu.env["PJRT_DEVICE"] == "TPU" and "TF_CPP_MIN_LOG_LEVEL" not in tpu.env
    assert cpu.ship == ("train", "eval", "test", "preprocess")


def test_layout_names_and_finds_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (10, 200, 30, 300):
        LAYOUT.checkpoint_dir(run, step).mkdir(parents=True)
        (LAYOUT.checkpoint_dir(run, step) / "model.safetensors").write_bytes(b"w" * step)
        if step != 300:  # step 300's manifest was never written: not a checkpoint
            LAYOUT.write_manifest(LAYOUT.checkpoint_dir(run, step))
    (run / "checkpoints" / "step_00000400.tmp").mkdir()  # half-written: not a checkpoint
    (run / "checkpoints" / "notes").mkdir()
    assert LAYOUT.checkpoint_dir(run, 10).name == "step_00000010"
    assert [step for step, _ in LAYOUT.local_checkpoints(run / "checkpoints")] == [10, 30, 200]
    assert LAYOUT.checkpoint_steps(open_storage(str(run))) == {
        10: "step_00000010",
        30: "step_00000030",
        200: "step_00000200",
    }
    assert (LAYOUT.metrics, LAYOUT.writes_to_bucket, LAYOUT.exports_hf, LAYOUT.manifest) == (
        "jsonl",
        False,
        True,
        "manifest.json",
    )


def _snap(digests: list[str | None]) -> RunOutcome:
    """The outcome a snapshot of workers with these digests gives the backend's summary."""
    workers = [WorkerView(i, "finished", 10, 1.0, False, digest) for i, digest in enumerate(digests)]
    return RunSnapshot(
        run_id="r", run_dir=Path("."), info={}, status="finished", step=10, total_steps=10, workers=workers
    ).outcome


def test_summary_says_whether_every_replica_ended_with_the_same_weights() -> None:
    extras, rows = BACKEND.summarize(_snap(["a", "a"]), launched=2)
    assert extras == {"weight_digests": {0: "a", 1: "a"}} and rows == [
        ("weights", "identical on all workers")
    ]
    assert BACKEND.summarize(_snap(["a", "b"]), launched=2)[1] == [("weights", "DIFFER between workers")]
    # one missing
    assert BACKEND.summarize(_snap(["a", None]), launched=2)[1] == [("weights", "DIFFER between workers")]
    assert BACKEND.summarize(_snap([None, None]), launched=2) == ({"weight_digests": {}}, [])


def test_a_local_worker_with_several_devices_is_that_many_replicas(recipe) -> None:  # type: ignore[no-untyped-def]
    """``local.devices_per_worker``: the CPU pod has the slice's replica count (a v4-32 rehearsed as 4 workers
    x 4 devices is 16 replicas, as on the slice), each worker is told its count and the batch splits over
    all."""
    rehearsal = ClusterShape(hosts=4, chips_per_host=4, target="cpu", local_devices=4)
    assert (
        BACKEND.replicas(rehearsal)
        == 16
        == BACKEND.replicas(ClusterShape(hosts=4, chips_per_host=4, target="tpu"))
    )
    ((path, message),) = BACKEND.check(recipe, rehearsal)
    assert path == ("train", "batch_size")
    assert (
        "24 does not split evenly over 16 replicas (4 workers x 4 devices)" in message
        and "e.g. 16" in message
    )
    assert BACKEND.check(recipe, ClusterShape(hosts=3, chips_per_host=4, target="cpu", local_devices=2)) == []
    assert BACKEND.plan(recipe, rehearsal).env["TPUFT_LOCAL_DEVICES"] == "4"  # the trainer's CPU_NUM_DEVICES
    assert (
        BACKEND.plan(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu")).env["TPUFT_LOCAL_DEVICES"]
        == "1"
    )
    assert (
        "TPUFT_LOCAL_DEVICES"
        not in BACKEND.plan(recipe, ClusterShape(hosts=4, chips_per_host=4, target="tpu")).env
    )


def test_several_tpu_slices_run_one_spmd_program_per_host_and_refuse_the_test_set(recipe) -> None:  # type: ignore[no-untyped-def]
    """Multislice over HybridMesh is SPMD: every host of every slice launched with XLA_USE_SPMD, and (as FSDP
    over several hosts) no test evaluation on the workers; the CPU pod's slices need neither."""
    two_slices = ClusterShape(hosts=4, chips_per_host=4, target="tpu", slices=2)
    plan = BACKEND.plan(recipe, two_slices)
    assert plan.workers == (0, 1, 2, 3) and plan.env["XLA_USE_SPMD"] == "1"
    assert (
        "XLA_USE_SPMD" not in BACKEND.plan(recipe, ClusterShape(hosts=4, chips_per_host=4, target="tpu")).env
    )
    tested = recipe.model_copy(update={"data": recipe.data.model_copy(update={"test": recipe.data.train})})
    ((path, message),) = BACKEND.check(tested, two_slices)
    assert (
        path == ("data", "test")
        and "the test evaluation of 2 slices (Multislice) runs on one TPU host only" in message
    )
    assert BACKEND.check(tested, ClusterShape(hosts=2, chips_per_host=4, target="cpu", slices=2)) == []
