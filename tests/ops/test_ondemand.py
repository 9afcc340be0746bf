"""Checkpoints on demand, the controller's side (tpuft/ops/ondemand.py): the request in the run dir, the step
a multi-host run saves at, and the wait for a complete checkpoint. The trainers' answers are written here by
hand: tests/worker/test_ondemand_worker.py runs the worker side, tests/e2e the whole path on the local pod."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tpuft.backends.registry import layout
from tpuft.core.errors import UsageError
from tpuft.ops import lifecycle
from tpuft.ops.ondemand import CheckpointRefused, CheckpointTimeout, pick_at_step
from tpuft.readers.runs import Run
from tpuft.run import rundir

BACKEND = "torch_xla"


def _run(
    tmp_path: Path, *, workers: int = 1, status: str = "running", batch: int = 8, log_every: int = 1
) -> Run:
    run = Run.from_url(tmp_path / "runs" / "demo-20261126-120000-0001")
    run.storage.write_text(
        rundir.RUN_INFO, json.dumps({"status": status, "attempt": 2, "workers": workers, "backend": BACKEND})
    )
    run.storage.write_text(
        rundir.RECIPE, f"name: demo\ntrain:\n  batch_size: {batch}\n  log_every: {log_every}\n"
    )
    return run


def _save(run: Run, step: int) -> None:
    """A complete checkpoint as the backend's layout writes it (its manifest last)."""
    folder = layout(BACKEND).checkpoint_dir(Path(run.url), step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    layout(BACKEND).write_manifest(folder)


def test_request_is_written_in_the_attempts_folder(tmp_path: Path) -> None:
    run = _run(tmp_path)
    request_id = lifecycle.request_checkpoint(run, reason="asked with tpuft checkpoint")
    request = json.loads(run.storage.read_text(rundir.checkpoint_request(2, request_id)) or "{}")
    assert request == {
        "id": request_id,
        "time": pytest.approx(time.time(), abs=5),
        "reason": "asked with tpuft checkpoint",
        "at_step": None,
        "stop": False,
    }
    assert rundir.CHECKPOINT_REQUEST_NAME.match(f"checkpoint-{request_id}.json")
    assert not rundir.attempt_records(run.storage, 2), "a request is not mistaken for a worker's record"


def test_a_run_that_is_not_running_is_named(tmp_path: Path) -> None:
    run = _run(tmp_path, status="finished")
    with pytest.raises(UsageError, match=f"run {run.id} is not running \\(status: finished\\)") as caught:
        lifecycle.request_checkpoint(run, reason="x")
    assert caught.value.exit_code == 2
    run.storage.write_text(rundir.RUN_INFO, json.dumps({**run.info(), "status": "running", "job": "predict"}))
    with pytest.raises(UsageError, match="is a predict job: it has no checkpoints"):
        lifecycle.request_checkpoint(run, reason="x")


def test_multi_host_step_covers_the_relay_at_the_measured_speed(tmp_path: Path) -> None:
    run = _run(tmp_path, workers=2, batch=8)
    now = time.time()
    # 40 examples/s at a batch of 8: 5 steps/s. The freshest beat (worker 1, step 100) is 1 s old.
    for worker, step in ((0, 99), (1, 100)):
        run.storage.write_text(
            f"heartbeat/worker-{worker}.json",
            json.dumps({"step": step, "time": now - 1.0, "examples_per_s": 40.0}),
        )
    # travel = 1 s old + 0.5 s poll + 3 s slack = 4.5 s -> 22.5 steps, rounded up, + 2 margin
    assert pick_at_step(run, run.info(), now) == 100 + 23 + 2
    request_id = lifecycle.request_checkpoint(run, reason="maintenance")
    assert (
        json.loads(run.storage.read_text(rundir.checkpoint_request(2, request_id)) or "{}")["at_step"] >= 125
    )
    # Before any speed is known (compiling), only the margin.
    run.storage.write_text(
        "heartbeat/worker-1.json", json.dumps({"step": 0, "time": now, "phase": "starting"})
    )
    run.storage.write_text("heartbeat/worker-0.json", json.dumps({"step": 0, "time": now}))
    assert pick_at_step(run, run.info(), now) == 2
    # Rounded up to where every backend's loop comes back to Python: T5X's every log_every steps.
    logging_every_10 = _run(tmp_path / "b", workers=2, log_every=10)
    logging_every_10.storage.write_text(
        "heartbeat/worker-0.json", json.dumps({"step": 100, "time": now - 1.0, "examples_per_s": 40.0})
    )
    assert pick_at_step(logging_every_10, logging_every_10.info(), now) == 130


def test_wait_returns_once_the_chiefs_step_is_complete(tmp_path: Path) -> None:
    run = _run(tmp_path, workers=2)
    request_id = lifecycle.request_checkpoint(run, reason="asked", at_step=7)

    def trainers() -> None:
        time.sleep(0.3)
        run.storage.write_text(
            rundir.checkpoint_ack(2, request_id, 0), json.dumps({"step": 7, "saved": time.time()})
        )
        time.sleep(0.3)  # acknowledged, but the manifest is not there yet: not complete
        _save(run, 7)

    thread = threading.Thread(target=trainers)
    thread.start()
    done = lifecycle.wait_checkpoint(run, request_id, timeout=20, poll=0.05)
    thread.join()
    assert done.step == 7 and done.id == request_id
    assert done.path == f"{run.url}/checkpoints/{layout(BACKEND).checkpoint_format.format(step=7)}"
    assert 0.5 <= done.latency_s < 10 and done.complete - done.asked == pytest.approx(done.latency_s)
    events = [json.loads(run.storage.read_text(p) or "{}") for p in run.storage.list("events/controller")]
    assert [(e["kind"], e["id"], e["step"], e["at_step"], e["attempt"]) for e in events] == [
        ("checkpoint_ask", request_id, 7, 7, 2)
    ]
    assert events[0]["latency_s"] == pytest.approx(done.latency_s, abs=0.01)


def test_timeout_names_the_workers_that_did_not_answer(tmp_path: Path) -> None:
    run = _run(tmp_path, workers=3)
    request_id = lifecycle.request_checkpoint(run, reason="asked", at_step=5)
    run.storage.write_text(
        rundir.checkpoint_ack(2, request_id, 1), json.dumps({"step": 5, "saved": time.time()})
    )
    with pytest.raises(CheckpointTimeout, match="worker\\(s\\) 0, 2 did not acknowledge") as caught:
        lifecycle.wait_checkpoint(run, request_id, timeout=0.3, poll=0.05)
    assert caught.value.exit_code == 1


def test_a_refusal_and_a_run_that_ended_say_why(tmp_path: Path) -> None:
    run = _run(tmp_path, workers=2)
    refused = lifecycle.request_checkpoint(run, reason="asked", at_step=3)
    run.storage.write_text(
        rundir.checkpoint_ack(2, refused, 0), json.dumps({"step": 9, "refused": "passed step 3 at step 9"})
    )
    with pytest.raises(CheckpointRefused, match="refused the checkpoint: passed step 3 at step 9"):
        lifecycle.wait_checkpoint(run, refused, timeout=5, poll=0.05)
    time.sleep(0.002)
    unanswered = lifecycle.request_checkpoint(run, reason="asked", at_step=3)
    run.storage.write_text(rundir.RUN_INFO, json.dumps({**run.info(), "status": "failed"}))
    with pytest.raises(CheckpointRefused, match="ended \\(failed\\) before"):
        lifecycle.wait_checkpoint(run, unanswered, timeout=5, poll=0.05)


def test_the_verbs_exit_2_for_a_run_that_is_not_running_and_1_on_a_timeout(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: ask\nbucket: {tmp_path / 'bucket'}\nlocal:\n  workers: 2\n")
    run = _run(tmp_path / "bucket", workers=2, status="finished")
    for args in (["checkpoint", run.id], ["stop", run.id, "--checkpoint"]):
        result = cli(*args, "-c", str(cluster))
        assert result.code == 2 and f"run {run.id} is not running (status: finished)" in result.err, (
            result.err
        )
    run.storage.write_text(rundir.RUN_INFO, json.dumps({**run.info(), "status": "running"}))
    result = cli("checkpoint", run.id, "-c", str(cluster), "--timeout", "1", "--json")
    assert result.code == 1 and "Traceback" not in result.err + result.out
    assert json.loads(result.out)["error"].endswith(
        "no complete checkpoint 1 s after the ask: worker(s) 0, 1 did not acknowledge"
    )
    request = next(
        p
        for p in run.storage.list("attempts/2")
        if rundir.CHECKPOINT_REQUEST_NAME.match(p.rpartition("/")[2])
    )
    assert json.loads(run.storage.read_text(request) or "{}")["reason"] == "asked with tpuft checkpoint"


def test_at_step_goes_into_the_request_and_needs_checkpoint_on_stop(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: ask\nbucket: {tmp_path / 'bucket'}\nlocal:\n  workers: 2\n")
    run = _run(tmp_path / "bucket", workers=2)
    result = cli("stop", run.id, "--at-step", "40", "-c", str(cluster))
    assert (
        result.code == 2 and "--at-step is the step of the checkpoint that --checkpoint saves" in result.err
    )
    assert cli("checkpoint", run.id, "--at-step", "40", "--timeout", "1", "-c", str(cluster)).code == 1
    request = next(
        p
        for p in run.storage.list("attempts/2")
        if rundir.CHECKPOINT_REQUEST_NAME.match(p.rpartition("/")[2])
    )
    assert json.loads(run.storage.read_text(request) or "{}")["at_step"] == 40
