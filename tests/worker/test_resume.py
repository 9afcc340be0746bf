"""Resuming a PyTorch/XLA run: which checkpoint is complete (locally, and in a bucket that a background syncer
fills file by file), what metrics survive a restart, and, in the backend's venv, that a run killed after a
checkpoint and resumed ends with exactly the weights of the run uninterrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.backends.base import manifest_gaps
from tpuft.backends.torch_xla import LAYOUT
from tpuft.run import rundir
from tpuft.storage import open_storage
from tpuft.worker import resume
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import MetricsWriter

BUCKET = "tpuft-resume-test"


def make_checkpoint(run: Path, step: int) -> Path:
    """A checkpoint as the trainer writes it: files (one in a sub-folder), then the manifest."""
    folder = LAYOUT.checkpoint_dir(run, step)
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(1000 + step))
    (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
    (folder / "sub" / "extra.bin").write_bytes(b"")
    LAYOUT.write_manifest(folder)
    return folder


def damaged_run(run: Path) -> None:
    """Step 4 is complete; every later one is not, each in its own way."""
    make_checkpoint(run, 4)
    (make_checkpoint(run, 8) / "model.safetensors").unlink()  # a file never arrived
    with (make_checkpoint(run, 12) / "model.safetensors").open("r+b") as handle:  # a file arrived cut short
        handle.truncate(500)
    (make_checkpoint(run, 16) / LAYOUT.manifest).unlink()  # written before the manifest
    (make_checkpoint(run, 20) / LAYOUT.manifest).write_text('{"format": "tpuft-checkpoint-manifest-1", "fil')
    make_checkpoint(run, 24).rename(run / "checkpoints" / "step_00000024.tmp")  # never renamed into place


def local_ctx(run: Path) -> WorkerContext:
    return WorkerContext(
        run_id="r", run_dir=run, worker_id=0, num_workers=1, coordinator="", run_url=str(run)
    )


def test_only_a_checkpoint_with_every_listed_file_at_its_size_is_picked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    damaged_run(run)
    assert [step for step, _ in LAYOUT.local_checkpoints(run / "checkpoints")] == [4]
    assert LAYOUT.checkpoint_steps(open_storage(str(run))) == {4: "step_00000004"}
    assert resume.find_resume_checkpoint(local_ctx(run), LAYOUT) == (4, "step_00000004")
    assert resume.fetch_checkpoint(local_ctx(run), LAYOUT, "step_00000004") == LAYOUT.checkpoint_dir(run, 4)
    with pytest.raises(RuntimeError, match="step_00000012: the checkpoint is incomplete"):
        resume.fetch_checkpoint(local_ctx(run), LAYOUT, "step_00000012")

    manifest = (LAYOUT.checkpoint_dir(run, 12) / LAYOUT.manifest).read_text()
    assert json.loads(manifest)["files"] == {
        "model.safetensors": 1012,
        "sub/extra.bin": 0,
        "trainer_state.json": 12,
    }
    gaps = manifest_gaps(manifest, {"model.safetensors": 500, "sub/extra.bin": 0})
    assert gaps == ["model.safetensors: 500 bytes, expected 1012", "trainer_state.json: missing"]
    assert manifest_gaps(None, {}) == ["no readable manifest"]
    assert resume.find_resume_checkpoint(local_ctx(tmp_path / "fresh"), LAYOUT) is None


def test_a_bucket_run_resumes_from_its_latest_complete_checkpoint(gcs: GcsEmulator, tmp_path: Path) -> None:
    """Every worker lists the bucket and downloads the checkpoint into its staging folder. The syncer uploads
    a checkpoint file by file in name order, so the bucket's newest step_N has its manifest before its
    weights."""
    gcs.reset()
    written = tmp_path / "written"
    damaged_run(written)
    bucket = open_storage(f"gs://{BUCKET}")
    bucket.ensure_bucket(None)
    bucket.upload_tree(written / "checkpoints", "runs/r/checkpoints")
    staging = tmp_path / "staging"
    url = f"gs://{BUCKET}/runs/r"
    ctx = WorkerContext(run_id="r", run_dir=staging, worker_id=1, num_workers=2, coordinator="", run_url=url)

    assert resume.find_resume_checkpoint(ctx, LAYOUT) == (4, "step_00000004")
    local = resume.fetch_checkpoint(ctx, LAYOUT, "step_00000004")
    assert local == LAYOUT.checkpoint_dir(staging, 4)
    source = LAYOUT.checkpoint_dir(written, 4)
    assert {p.relative_to(local): p.read_bytes() for p in local.rglob("*") if p.is_file()} == {
        p.relative_to(source): p.read_bytes() for p in source.rglob("*") if p.is_file()
    }

    later = make_checkpoint(tmp_path / "later", 28)
    step_28 = "runs/r/checkpoints/step_00000028"
    bucket.upload_file(later / LAYOUT.manifest, f"{step_28}/{LAYOUT.manifest}")  # first in name order
    assert resume.find_resume_checkpoint(ctx, LAYOUT) == (4, "step_00000004")
    bucket.upload_file(
        LAYOUT.checkpoint_dir(written, 12) / "model.safetensors", f"{step_28}/model.safetensors"
    )
    # the right name, not the right size
    assert resume.find_resume_checkpoint(ctx, LAYOUT) == (
        4,
        "step_00000004",
    )
    bucket.upload_tree(later, step_28)
    # every file its manifest lists is there
    assert resume.find_resume_checkpoint(ctx, LAYOUT) == (
        28,
        "step_00000028",
    )


def test_a_restart_keeps_the_metrics_up_to_its_checkpoint(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsWriter(tmp_path, chief=True)
    for step in range(1, 11):
        first.log(step, {"loss": float(step)})
        if step % 4 == 0:
            first.log(step, {"eval_loss": step / 10})
    first.close()
    with (tmp_path / rundir.METRICS).open("ab") as handle:
        handle.write(b'{"step": 11, "loss": 1')  # killed in the middle of a line

    # TensorBoard reads event files in name order (events.out.tfevents.SECONDS.host.pid.N): a second writer in
    # the same process and second sorts first once its N gains a digit (9 -> 10, in a lane that ran other
    # tests), and the purge would come before the points it purges. A resumed trainer is a new process, later.
    time.sleep(1.01 - time.time() % 1)
    again = MetricsWriter(tmp_path, chief=True)
    assert again.restart_at(6) == 6  # steps 7 to 10 and the eval at 8, and the cut line
    again.log(7, {"loss": 70.0})
    again.close()

    log = rundir.read_metrics(tmp_path)
    assert log.skipped == []
    assert [(r["step"], r.get("loss", r.get("eval_loss"))) for r in log.rows] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
        (4, 0.4),
        (5, 5.0),
        (6, 6.0),
        (7, 70.0),
    ]
    events = EventAccumulator(str(tmp_path / rundir.TB_DIR))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("train/loss")]
    # the first attempt's 7 to 10 are purged
    assert points == [(s, float(s)) for s in range(1, 7)] + [(7, 70.0)]
    # the eval at step 8 is gone from TensorBoard too
    assert [e.step for e in events.Scalars("eval/loss")] == [4]


# ---- the real trainer, in the backend's venv -------------------------------------------------------------


RECIPE = """\
name: resume
backend:
  kind: torch_xla
model:
  tokenizer: byt5
  config: {{d_model: 16, d_ff: 32, num_layers: 1, num_heads: 2, d_kv: 8, dropout_rate: 0.1}}
data:
  train: {data}/train.jsonl
  eval: {data}/eval.jsonl
  max_source_length: 16
  max_target_length: 8
train:
  steps: 12
  batch_size: 4
  optimizer: adamw
  warmup_steps: 2
  log_every: 1
  checkpoint_every: 4
  keep_checkpoints: 2
eval:
  every: 4
  batch_size: 8
export:
  hf: false
"""


def new_run(root: Path, name: str) -> Path:
    data = root / "data"
    if not data.exists():
        data.mkdir()
        rows = [{"source": f"add {i} {i + 1}", "target": str(2 * i + 1)} for i in range(36)]
        (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:30]))
        (data / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[30:]))
    run = root / name
    run.mkdir()
    (run / rundir.RECIPE).write_text(RECIPE.format(data=data))
    return run


def start(torch_python: str, run: Path, *, resume: bool = False) -> subprocess.Popen[bytes]:
    """The trainer as ``tpuft.worker`` runs it on one worker of a local pod; its output goes to
    ``<run>.log``."""
    from tests.conftest import REPO

    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(run.parent),
        "PYTHONPATH": str(REPO),
        "PJRT_DEVICE": "CPU",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TPUFT_RUN_ID": run.name,
        "TPUFT_RUN_DIR": str(run),
        "TPUFT_WORKER_ID": "0",
        "TPUFT_NUM_WORKERS": "1",
    }
    if resume:
        env["TPUFT_RESUME"] = "1"
    with run.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [torch_python, "-m", "tpuft.worker"], env=env, cwd=run, stdout=log, stderr=log
        )


def finish(proc: subprocess.Popen[bytes], run: Path) -> str:
    proc.wait(timeout=300)
    out = run.with_suffix(".log").read_text()
    assert proc.returncode == 0, out[-4000:]
    return out


def digest(run: Path, out: str) -> str:
    beat = rundir.read_json(rundir.heartbeat_path(run, 0)) or {}
    assert beat.get("status") == "finished"
    assert f"weights sha256 {beat['params_sha256'][:16]} (replica 0)" in out
    return str(beat["params_sha256"])


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights(
    torch_python: str, tmp_path: Path
) -> None:
    """The uninterrupted run trains beside the one that is killed: each is one process, mostly importing
    torch, so on two cores the pair takes about the time of one."""
    whole = new_run(tmp_path, "whole")
    uninterrupted = start(torch_python, whole)
    run = new_run(tmp_path, "killed")
    proc = start(torch_python, run)
    step_8 = LAYOUT.checkpoint_dir(run, 8)
    deadline = time.monotonic() + 300
    while not (
        step_8.is_dir() and (rundir.read_json(rundir.heartbeat_path(run, 0)) or {}).get("step", 0) > 8
    ):
        assert proc.poll() is None and time.monotonic() < deadline, run.with_suffix(".log").read_text()[
            -4000:
        ]
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not LAYOUT.checkpoint_dir(run, 12).exists()  # killed before the end
    logged = [row["step"] for row in rundir.read_metrics(run).rows]
    assert max(logged) > 8
    expected = digest(whole, finish(uninterrupted, whole))

    proc = start(torch_python, run, resume=True)
    first_beat: dict[str, object] = {}
    while (
        not first_beat and proc.poll() is None
    ):  # the killed trainer's last beat is there until the new one's
        beat = rundir.read_json(rundir.heartbeat_path(run, 0)) or {}
        first_beat = beat if beat.get("pid") == proc.pid else {}
        time.sleep(0.005)
    out = finish(proc, run)
    assert "[tpuft] resuming from checkpoint step_00000008 (step 8 of 12)" in out
    assert (first_beat.get("step"), first_beat.get("phase")) == (8, "starting")
    assert digest(run, out) == expected

    rows = rundir.read_metrics(run).rows
    train = [row for row in rows if "loss" in row]
    assert [row["step"] for row in train] == list(range(1, 13))  # no step twice, none missing
    assert [row["step"] for row in rows if "eval_loss" in row] == [4, 8, 12]
    assert [row["step"] for row in rows] == sorted(row["step"] for row in rows)
    assert train[8]["elapsed_s"] >= train[7]["elapsed_s"]  # the training time goes on from the checkpoint's
    reference = [row["loss"] for row in rundir.read_metrics(whole).rows if "loss" in row]
    assert [
        row["loss"] for row in train
    ] == reference  # the same losses step by step, before and after the kill
