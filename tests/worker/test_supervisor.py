"""The supervisors' shared bookkeeping (who failed first, when an attempt is over, run.json's outcome) and the worker
clean-up that frees TPU chips, without a pod. The supervisor process itself is exercised in tests/ops/test_train.py
and the e2e tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tpuft import rundir
from tpuft.storage import LocalStorage
from tpuft.worker import supervisor


def record(worker: int, status: str, ended: float, **extra: object) -> dict[str, object]:
    return {"worker": worker, "status": status, "ended": ended, "final": True, **extra}


def test_the_culprit_is_the_first_to_fail_and_never_a_waiting_peer() -> None:
    records = {
        0: record(0, "failed", 100.2, reason="exit code 1"),  # its collective broke when worker 1 died
        1: record(1, "failed", 100.0, reason="killed by signal 9"),
        2: record(2, "stopped", 101.0),
    }
    assert rundir.failure_culprit(records)["worker"] == 1
    hung = {0: record(0, "hung", 50.0, waiting=True, reason="waited"), 1: record(1, "hung", 60.0, reason="was stopped")}
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
        "status": "stopped", "cause": "stopped with tpuft stop"}
    failed = rundir.attempt_outcome({0: record(0, "stopped", 2.0), 1: record(1, "failed", 1.0, reason="exit code 3", tail=["boom"])}, 2, None)
    assert failed == {"status": "failed", "cause": "worker 1: exit code 3", "culprit": 1, "culprit_tail": ["boom"]}


def test_finalize_writes_the_outcome_once_and_leaves_later_attempts_alone(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    info = {"run_id": "r", "status": "running", "workers": 2, "attempt": 1, "attempts": [{"attempt": 1, "started": 10.0}]}
    storage.write_text(rundir.RUN_INFO, json.dumps(info))
    storage.write_text(rundir.attempt_record(1, 0), json.dumps(record(0, "finished", 11.0)))
    assert rundir.finalize_run(storage, 1) is None  # worker 1 has not reported
    storage.write_text(rundir.attempt_record(1, 1), json.dumps(record(1, "finished", 12.0)))
    final = rundir.finalize_run(storage, 1)
    assert final is not None and final["status"] == "finished" and final["attempts"][0]["status"] == "finished"
    assert rundir.finalize_run(storage, 1) == final  # idempotent
    assert rundir.finalize_run(storage, 2) is None  # not the current attempt


def test_check_frees_the_tpu_chips_held_by_a_dead_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stand-in for /dev/accel0: a process holding it open is killed and the libtpu lock file removed (the real
    device paths cannot exist here; the scan is the same)."""
    device = tmp_path / "dev" / "accel0"
    device.parent.mkdir()
    device.write_text("")
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.write_text("")
    holder = subprocess.Popen(["bash", "-c", f"exec 3<{device}; sleep 300"], start_new_session=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and holder.pid not in supervisor.tpu_holders((str(device.parent) + "/accel",)):
            time.sleep(0.05)
        result = supervisor.check_worker(free_tpu=True, devices=(str(device.parent) + "/accel",), lockfile=str(lockfile))
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
    supervisor.write_current({"run_id": "live-run", "status": "running", "supervisor_pid": me,
                              "supervisor_ticks": supervisor.start_ticks(me), "started": 1.0})
    assert supervisor.check_worker(free_tpu=False)["busy"] == "live-run"
    supervisor.write_current({"run_id": "old-run", "status": "running", "supervisor_pid": me, "supervisor_ticks": 1})
    result = supervisor.check_worker(free_tpu=False)  # same pid, another process start: a reused pid, not alive
    assert result["busy"] is None and "run old-run had lost its supervisor" in result["cleaned"][-1]
    assert supervisor.read_current()["status"] == "ended"


def test_follow_starts_at_the_latest_of_from_line_tail_and_since(tmp_path: Path) -> None:
    """One streaming pass over the log (a week of lines must not be read into memory, nor twice): the first line to
    send, and the byte offset the follow loop reads on from; a line still being written is not counted."""
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
    assert supervisor.locate_start(log, 12, None, None) == (12, 10, at(10))  # lines 10 and 11 are skipped as they come
    assert supervisor.locate_start(tmp_path / "none.log", 0, 5, None) == (0, 0, 0)
