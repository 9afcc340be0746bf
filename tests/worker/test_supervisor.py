"""The supervisors' shared bookkeeping (who failed first, when an attempt is over, run.json's outcome) and the
worker clean-up that frees TPU chips, without a pod. The supervisor process itself is exercised in
tests/ops/test_train.py and the e2e tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tpuft.run import rundir
from tpuft.storage import LocalStorage
from tpuft.worker.supervisor import process as supervisor


def record(worker: int, status: str, ended: float, **extra: object) -> dict[str, object]:
    return {"worker": worker, "status": status, "ended": ended, "final": True, **extra}


def test_the_culprit_is_the_first_to_fail_and_never_a_waiting_peer() -> None:
    records = {
        0: record(0, "failed", 100.2, reason="exit code 1"),  # its collective broke when worker 1 died
        1: record(1, "failed", 100.0, reason="killed by signal 9"),
        2: record(2, "stopped", 101.0),
    }
    assert rundir.failure_culprit(records)["worker"] == 1
    hung = {
        0: record(0, "hung", 50.0, waiting=True, reason="waited"),
        1: record(1, "hung", 60.0, reason="was stopped"),
    }
    assert rundir.failure_culprit(hung)["worker"] == 1
    assert rundir.describe_failure(hung[1]) == "hung: worker 1 was stopped"
    assert rundir.failure_culprit({0: record(0, "finished", 1.0)}) is None


def test_an_attempt_is_over_only_when_every_worker_has_a_final_record() -> None:
    done = {0: record(0, "finished", 1.0), 1: record(1, "finished", 2.0)}
    assert rundir.attempt_outcome({0: done[0]}, 2, None) is None
    assert rundir.attempt_outcome({0: done[0], 1: {**done[1], "final": False}}, 2, None) is None
    assert rundir.attempt_outcome(done, 2, None) == {"status": "finished"}
    stopped = {0: record(0, "stopped", 1.0), 1: record(1, "stopped", 1.0)}
    assert rundir.attempt_outcome(stopped, 2, {"reason": "stopped with tpuft stop"}) == {
        "status": "stopped",
        "cause": "stopped with tpuft stop",
    }
    failed = rundir.attempt_outcome(
        {0: record(0, "stopped", 2.0), 1: record(1, "failed", 1.0, reason="exit code 3", tail=["boom"])},
        2,
        None,
    )
    assert failed == {
        "status": "failed",
        "cause": "worker 1: exit code 3",
        "culprit": 1,
        "culprit_tail": ["boom"],
    }


def test_finalize_writes_the_outcome_once_and_leaves_later_attempts_alone(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    info = {
        "run_id": "r",
        "status": "running",
        "workers": 2,
        "attempt": 1,
        "attempts": [{"attempt": 1, "started": 10.0}],
    }
    storage.write_text(rundir.RUN_INFO, json.dumps(info))
    storage.write_text(rundir.attempt_record(1, 0), json.dumps(record(0, "finished", 11.0)))
    assert rundir.finalize_run(storage, 1) is None  # worker 1 has not reported
    storage.write_text(rundir.attempt_record(1, 1), json.dumps(record(1, "finished", 12.0)))
    final = rundir.finalize_run(storage, 1)
    assert (
        final is not None and final["status"] == "finished" and final["attempts"][0]["status"] == "finished"
    )
    assert rundir.finalize_run(storage, 1) == final  # idempotent
    assert rundir.finalize_run(storage, 2) is None  # not the current attempt


def test_check_frees_the_tpu_chips_held_by_a_dead_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stand-in for /dev/accel0: a process holding it open is killed and the libtpu lock file removed (the
    real device paths cannot exist here; the scan is the same)."""
    device = tmp_path / "dev" / "accel0"
    device.parent.mkdir()
    device.write_text("")
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    holder = subprocess.Popen(["bash", "-c", f"exec 3<{device}; sleep 300"], start_new_session=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and holder.pid not in supervisor.tpu_holders(
            (str(device.parent) + "/accel",)
        ):
            time.sleep(0.05)
        result = supervisor.check_worker(
            free_tpu=True, devices=(str(device.parent) + "/accel",), lockfile=str(lockfile)
        )
        assert result["busy"] is None
        assert f"killed pid {holder.pid}, which held the TPU chips" in result["cleaned"]
        assert f"removed {lockfile}" in result["cleaned"] and not lockfile.exists()
        assert holder.wait(timeout=5) == -signal.SIGKILL
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)


def test_a_live_supervisor_makes_the_worker_busy(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOME", str(tmp_path))
    me = os.getpid()
    supervisor.write_current(
        {
            "run_id": "live-run",
            "status": "running",
            "supervisor_pid": me,
            "supervisor_ticks": supervisor.start_ticks(me),
            "started": 1.0,
        }
    )
    assert supervisor.check_worker(free_tpu=False)["busy"] == "live-run"
    supervisor.write_current(
        {"run_id": "old-run", "status": "running", "supervisor_pid": me, "supervisor_ticks": 1}
    )
    # same pid, another process start: a reused pid, not alive
    result = supervisor.check_worker(free_tpu=False)
    assert result["busy"] is None and "run old-run had lost its supervisor" in result["cleaned"][-1]
    assert supervisor.read_current()["status"] == "ended"


def test_follow_starts_at_the_latest_of_from_line_tail_and_since(tmp_path: Path) -> None:
    """One streaming pass over the log (a week of lines must not be read into memory, nor twice): the first
    line to send, and the byte offset the follow loop reads on from; a line still being written is not
    counted."""
    lines = [f"2026-11-23T13:00:{i:02d}.000Z line {i}\n".encode() for i in range(10)]
    log = tmp_path / "worker-0.log"
    log.write_bytes(b"".join(lines) + b"2026-11-23T13:00:59.000Z still being wri")

    def at(index: int) -> int:
        return sum(len(line) for line in lines[:index])

    assert supervisor.locate_start(log, 0, None, None) == (0, 0, 0)
    assert supervisor.locate_start(log, 3, None, None) == (3, 3, at(3))
    assert supervisor.locate_start(log, 0, 2, None) == (8, 8, at(8))
    assert supervisor.locate_start(log, 0, 0, None) == (10, 10, at(10))
    assert supervisor.locate_start(log, 0, 20, None) == (0, 0, 0)
    assert supervisor.locate_start(log, 0, None, "2026-11-23T13:00:04") == (4, 4, at(4))
    assert supervisor.locate_start(log, 5, 2, "2026-11-23T13:00:01") == (8, 8, at(8))
    assert supervisor.locate_start(log, 0, None, "2027") == (10, 10, at(10))
    # lines 10 and 11 are skipped as they come
    assert supervisor.locate_start(log, 12, None, None) == (
        12,
        10,
        at(10),
    )
    assert supervisor.locate_start(tmp_path / "none.log", 0, 5, None) == (0, 0, 0)


def starting_supervisor(tmp_path: Path, worker: int, workers: int, slices: int, **timeouts: float) -> Any:
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.supervisor.supervision import Supervisor

    ctx = WorkerContext(
        run_id="r",
        run_dir=tmp_path,
        worker_id=worker,
        num_workers=workers,
        coordinator="127.0.0.1:8476",
        num_slices=slices,
    )
    return Supervisor(
        ctx,
        ["true"],
        1,
        timeouts.get("hang", 10.0),
        LocalStorage(tmp_path),
        startup_timeout=timeouts.get("startup", 1800.0),
    )


def test_the_starting_phase_waits_out_startup_timeout_before_a_hang(tmp_path: Path) -> None:
    """A trainer in its rendezvous (phase starting) for 100 s: hung under the old patience (3 x hang_timeout,
    at least a minute), still waiting under train.startup_timeout."""
    patient = starting_supervisor(tmp_path, 0, 2, 1, hang=10.0, startup=1800.0)
    patient.trainer_started = time.time() - 100
    rundir.write_json_atomic(
        rundir.heartbeat_path(tmp_path, 0), {"phase": "starting", "time": time.time() - 100}
    )
    assert patient._hang_check(os.getpid()) is None
    short = starting_supervisor(tmp_path, 0, 2, 1, hang=10.0, startup=50.0)
    short.trainer_started = patient.trainer_started
    hang = short._hang_check(os.getpid())
    assert hang is not None and hang[0].startswith("made no progress for 100 s (phase starting)")


def test_at_startup_timeout_the_missing_hosts_are_named_by_slice(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    now = time.time()
    for worker in (0, 1, 2):  # worker 2 runs but is still in its rendezvous; worker 3 never started
        storage.write_text(
            rundir.attempt_record(1, worker), json.dumps({"worker": worker, "status": "running"})
        )
        phase = "starting" if worker == 2 else "step"
        rundir.write_json_atomic(
            rundir.heartbeat_path(tmp_path, worker), {"phase": phase, "step": 1, "time": now}
        )
    early = starting_supervisor(tmp_path, 0, 4, 2, startup=60.0)
    early.trainer_started = now - 10
    assert early._startup_check() is None  # not yet: nobody is named before the timeout
    late = starting_supervisor(tmp_path, 0, 4, 2, startup=5.0)
    late.trainer_started = now - 10
    what, waiting = late._startup_check()
    assert waiting and what == (
        "waited 10 s (train.startup_timeout 5 s) for slice 1 host 0 (worker 2), "
        "slice 1 host 1 (worker 3) to start"
    )
    assert late._startup_check() is None  # asked once
    record = {"worker": 0, "name": late.record["name"], "status": "hung", "reason": what}
    assert rundir.describe_failure(record).startswith("hung: slice 0 host 0 (worker 0) waited 10 s")
