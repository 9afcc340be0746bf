"""Checkpoints on demand, the worker's side (tpuft/worker/ondemand.py): the shared RunLoop serving a relayed
request at its step (plain hooks, no backend venv), a request whose step has passed refused, and a real
supervisor relaying a ``stop`` request to a real (tiny, framework-free) trainer process, stopping it after the
save; the controller's ``request_checkpoint``/``wait_checkpoint`` on the other end."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_loop import Hooks, kept, recipe, start
from tpuft.ops import lifecycle
from tpuft.readers.runs import Run
from tpuft.run import rundir
from tpuft.worker import loop as loop_mod
from tpuft.worker import ondemand
from tpuft.worker.context import WorkerContext


def relay(run_dir: Path, request_id: str, **fields: Any) -> None:
    """What the supervisor's Relay writes (the last test runs the real one)."""
    rundir.write_json_atomic(
        rundir.checkpoint_control(run_dir, 0) / f"checkpoint-{request_id}.json",
        {"id": request_id, "reason": "asked", "at_step": None, "stop": False, **fields},
    )


class AskingHooks(Hooks):
    """Plain hooks whose run gets requests relayed while it trains: ``asks`` = {step: (id, fields)}."""

    def __init__(self, loop: Any, asks: dict[int, tuple[str, dict[str, Any]]]) -> None:
        super().__init__(loop)
        self.asks = asks

    def train_step(self, step: int) -> None:
        super().train_step(step)
        if step in self.asks:
            request_id, fields = self.asks[step]
            relay(self.loop.ctx.run_dir, request_id, **fields)


def answer(run_dir: Path, request_id: str) -> dict[str, Any] | None:
    return rundir.read_json(run_dir / rundir.checkpoint_ack(1, request_id, 0))


def test_the_loop_saves_at_the_asked_step_and_refuses_a_passed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUFT_ATTEMPT", "1")
    loop = start(tmp_path, recipe(steps=10, checkpoint_every=None, eval_every=None))
    # at step 1: "now" (no at_step) -> saved after step 2; at step 3: for step 6 -> saved after step 6
    # exactly; at step 7: for step 5, already passed -> refused, nothing saved.
    hooks = AskingHooks(loop, {1: ("100", {}), 3: ("200", {"at_step": 6}), 7: ("300", {"at_step": 5})})
    loop_mod.run(loop, hooks)
    assert hooks.named("save") == [2, 6, 10]
    assert kept(tmp_path) == ["step_00000002", "step_00000006", "step_00000010"]
    assert answer(tmp_path, "100")["step"] == 2 and answer(tmp_path, "200")["step"] == 6
    refused = answer(tmp_path, "300")
    assert (
        refused["step"] == 8 and "was at step 8 when the request for step 5 reached it" in refused["refused"]
    )
    saves = [
        json.loads(line)
        for line in next((tmp_path / "events").glob("worker-0-attempt-*.jsonl")).read_text().splitlines()
    ]
    assert [(e["step"], e["reason"]) for e in saves if e["kind"] == "checkpoint_save"] == [
        (2, "request"),
        (6, "request"),
        (10, "final"),
    ]


def test_only_the_process_that_answers_for_its_worker_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = ondemand.CheckpointRequests(tmp_path, 0, 1, answers=False)
    relay(tmp_path, "5")
    saved: list[int] = []
    ondemand.serve(requests, 3, saved.append, lambda _: None, lambda _: None)
    assert saved == [3] and answer(tmp_path, "5") is None
    ondemand.serve(requests, 4, saved.append, lambda _: None, lambda _: None)
    assert saved == [3], "a request is served once"


def test_a_stop_request_holds_the_trainer_after_its_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUFT_ATTEMPT", "1")
    monkeypatch.setattr(ondemand, "HOLD_SECONDS", 0.3)
    loop = start(tmp_path, recipe(steps=10, checkpoint_every=None, eval_every=None))
    hooks = AskingHooks(loop, {3: ("7", {"stop": True})})
    with pytest.raises(SystemExit, match="saved step 4 for a stop, but its supervisor did not stop it"):
        loop_mod.run(loop, hooks)
    assert hooks.named("step") == [0, 1, 2, 3] and hooks.named("save") == [4]
    assert answer(tmp_path, "7")["step"] == 4


TRAINER = """
import sys, time
from pathlib import Path
from tpuft.backends.registry import layout
from tpuft.worker import ondemand
from tpuft.worker.metrics import Heartbeat

run_dir = Path(sys.argv[1])
beat = Heartbeat(run_dir, 0, 1000)
requests = ondemand.CheckpointRequests(run_dir, 0, 1, answers=True)
def save(step):
    folder = layout("torch_xla").checkpoint_dir(run_dir, step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_text("weights")
    layout("torch_xla").write_manifest(folder)
for step in range(1, 1000):
    time.sleep(0.02)
    beat.beat(step, examples_per_s=400.0)
    ondemand.serve(requests, step, save, print, lambda at: beat.beat(at, phase="checkpoint"))
"""


def supervise_a_stop(run: Run, staging: Path) -> Any:
    """A supervisor of worker 0 whose (framework-free) trainer gets a ``stop`` request from the controller's
    side at step 5 or later; returns what ``wait_checkpoint`` returned."""
    from tpuft.worker.supervisor.supervision import Supervisor

    storage = run.storage
    storage.write_text(
        rundir.RUN_INFO,
        json.dumps(
            {
                "status": "running",
                "attempt": 1,
                "workers": 1,
                "backend": "torch_xla",
                "attempts": [{"attempt": 1, "started": time.time()}],
            }
        ),
    )
    storage.write_text(rundir.RECIPE, "name: demo\n")
    ctx = WorkerContext(
        run_id=run.id, run_dir=staging, worker_id=0, num_workers=1, coordinator="", run_url=run.url
    )
    supervisor = Supervisor(ctx, [sys.executable, "-c", TRAINER, str(staging)], 1, 30.0, storage)
    done: list[Any] = []

    def controller() -> None:
        while (rundir.read_json(rundir.heartbeat_path(staging, 0)) or {}).get("step", 0) < 5:
            time.sleep(0.05)
        request_id = lifecycle.request_checkpoint(
            run, reason="stopped with tpuft stop --checkpoint", stop=True
        )
        done.append(lifecycle.wait_checkpoint(run, request_id, timeout=30, poll=0.05))

    thread = threading.Thread(target=controller)
    thread.start()
    assert supervisor.run() == 0
    thread.join(timeout=30)
    info = run.info()
    assert info["status"] == "stopped" and info["cause"] == "stopped with tpuft stop --checkpoint"
    saved = done[0].step
    assert saved >= 5 and saved in run.layout().checkpoint_steps(storage)
    assert rundir.read_heartbeat(storage, 0)["step"] == saved, (
        "no step after the checkpoint: a resume loses none"
    )
    return done[0]


def test_a_supervisor_relays_a_stop_request_and_stops_its_trainer_after_the_save(tmp_path: Path) -> None:
    done = supervise_a_stop(Run.from_url(tmp_path), tmp_path)
    assert 0 < done.latency_s < 10


def test_a_bucket_run_is_asked_through_the_bucket_and_answers_through_the_sync(
    gcs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run dir in a bucket (the GCS emulator): the supervisor reads the request there, the trainer's
    answer and checkpoint reach it through the run-dir sync (every 0.5 s here, 15 s on a real run), and the
    relay never goes up."""
    from tpuft.storage import open_storage, sync

    monkeypatch.setattr(sync, "SYNC_SECONDS", 0.5)
    monkeypatch.setenv("TPUFT_CONTROL_POLL_SECONDS", "0.2")
    open_storage("gs://ondemand").ensure_bucket(None)
    run = Run.from_url("gs://ondemand/runs/bucket-run")
    done = supervise_a_stop(run, tmp_path / "staging")
    assert (
        done.path == f"gs://ondemand/runs/bucket-run/checkpoints/step_{done.step:08d}"
        and 0 < done.latency_s < 20
    )
    assert not [p for p in run.storage.list("") if rundir.CONTROL_DIR in p]
    assert run.storage.exists(rundir.checkpoint_ack(1, done.id, 0))


def test_t5x_serves_between_its_runs_of_steps_and_splits_one_at_the_asked_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sequencer's boundaries of a framework that runs its own loop, with T5X's save (through a fake
    trainer and manager: T5X and JAX live in their own venv; the local-pod e2e test runs the real ones,
    barrier included). T5X's steps are absolute: the run's initial checkpoint is at 1000."""
    from types import SimpleNamespace

    from tpuft.worker.loop.framework import Boundaries, Timeline
    from tpuft.worker.t5x import hooks as t5x_hooks

    monkeypatch.setenv("TPUFT_ATTEMPT", "1")
    agreement = {"all": True}
    saved: list[int] = []

    class Manager:
        def all_steps(self) -> list[int]:
            return list(saved)

        def save(self, state: Any, fns: Any, force: bool) -> bool:
            saved.append(state.step)
            return True

    trainer = SimpleNamespace(train_state=SimpleNamespace(step=1004))
    monkeypatch.setattr(t5x_hooks, "_MANAGER", [Manager()])
    monkeypatch.setattr(t5x_hooks, "_TRAINER", [trainer])
    said: list[str] = []
    ctx = WorkerContext(
        run_id="r", run_dir=tmp_path, worker_id=0, num_workers=1, coordinator="", run_url=str(tmp_path)
    )
    loop = SimpleNamespace(
        ctx=ctx,
        beats=True,
        say=said.append,
        beat=lambda *a, **k: None,
        recipe=SimpleNamespace(train=SimpleNamespace(steps=100, time_limit=None, log_every=4)),
        attempt_started=None,
        start_step=0,
    )
    boundaries = Boundaries(
        loop,  # type: ignore[arg-type]
        Timeline(1000, 1100),
        save=t5x_hooks.save_now,
        agree_request=lambda request: agreement["all"],  # JAX's barrier: mocked here only
        agree=lambda flag: flag,
        barrier_seconds=t5x_hooks.BARRIER_SECONDS,
    )
    ran: list[tuple[int, int]] = []

    def steps(count: int, start: int) -> str:
        ran.append((start, count))
        trainer.train_state.step = start + count
        return f"summary of {start}+{count}"

    relay(tmp_path, "1", at_step=7)
    assert boundaries.run_steps(steps, 1004, 4) == "summary of 1007+1"
    assert ran == [(1004, 3), (1007, 1)] and saved == [1007] and answer(tmp_path, "1")["step"] == 1007
    relay(tmp_path, "2")  # "now": before the next run of steps
    boundaries.run_steps(steps, 1008, 4)
    assert ran[-1] == (1008, 4) and saved == [1007, 1008] and answer(tmp_path, "2")["step"] == 1008
    relay(tmp_path, "3", at_step=9)  # found at step 12: passed
    agreement["all"] = False
    relay(tmp_path, "4")  # a host without it: the barrier fails, and every host that came refuses
    boundaries.run_steps(steps, 1012, 4)
    assert saved == [1007, 1008] and ran[-1] == (1012, 4)
    assert "was at step 12 when the request for step 9" in answer(tmp_path, "3")["refused"]
    assert answer(tmp_path, "4")["refused"].startswith("not every host had the request at step 12")
    agreement["all"] = True
    saved.append(1016)  # T5X's own periodic checkpoint at that step: answered, not written twice
    relay(tmp_path, "5")
    boundaries.run_steps(steps, 1016, 4)
    assert saved == [1007, 1008, 1016] and answer(tmp_path, "5")["step"] == 1016

    # train.time_limit at a boundary: the hosts agree, the framework saves there, RunEnded leaves its loop
    from tpuft.worker.loop.framework import RunEnded

    loop.recipe.train.time_limit = 1.0
    loop.attempt_started = time.time() - 2.0
    loop.ended = None
    with pytest.raises(RunEnded):
        boundaries.run_steps(steps, 1020, 4)
    assert saved[-1] == 1020 and ran[-1] == (1016, 4) and loop.ended == "time_limit" and loop.step == 20
