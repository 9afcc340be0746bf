"""A worker kept waiting on a lock says whom it waits for: the worker lock (two supervisors'
``check``/``start``) and the venv build lock (workers sharing a disk). Real processes and real ``flock``; the
holder's name is what it wrote into the lock file."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tpuft.host import bootstrap

HOLD = (
    "from tpuft.host.state import worker_lock\nimport time\nwith worker_lock():\n    "
    "print('held', flush=True)\n    time.sleep(60)\n"
)
TAKE = "from tpuft.host.state import worker_lock\nwith worker_lock():\n    print('got it', flush=True)\n"


class Lines:
    """A process's stream read line by line in the background, with the time each line arrived."""

    def __init__(self, stream: object) -> None:
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen in list(self.lines):
                if text in seen[1]:
                    return seen
            time.sleep(0.02)
        raise AssertionError(f"no line with {text!r} in {timeout} s: {[line for _, line in self.lines]}")


def test_a_process_waiting_for_the_worker_lock_names_its_holder(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "TPUFT_WAIT_SILENT_S": "0.3", "TPUFT_WAIT_EVERY_S": "30"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True)
    taker = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        taker = subprocess.Popen(
            [sys.executable, "-c", TAKE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        err = Lines(taker.stderr)
        seen, line = err.wait_for("waiting for this worker's lock", 10)
        assert f"held by another tpuft process: pid {holder.pid} (-c)" in line and "s so far)" in line, line
        assert seen - started < 5  # the interpreter's start, then 0.3 s: never a silent wait
        holder.kill()  # a holder that dies frees the lock with it
        holder.wait()
        assert taker.wait(timeout=10) == 0 and taker.stdout is not None
        err.thread.join(5)
        assert taker.stdout.read() == "got it\n" and err.lines[-1][1].startswith(
            "done: this worker's lock"
        ), err.lines
    finally:
        for process in (holder, taker):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def test_a_worker_waiting_for_another_ones_venv_build_says_so_and_how_long(tmp_path: Path) -> None:
    spec = {"key": "shared-venv", "requirements": ["pip"], "python": sys.executable, "pip_args": []}
    lock_path = tmp_path / "shared-venv.lock"
    with open(lock_path, "w") as lock:  # another worker on this disk is building it
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 4242 on worker-0, since 12:00:00\n")
        lock.flush()
        env = {**os.environ, "TPUFT_WAIT_EVERY_S": "0.5"}
        waiter = subprocess.Popen(
            [sys.executable, bootstrap.__file__, "--cache", str(tmp_path), "--spec", json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            out = Lines(waiter.stdout)
            _, first = out.wait_for("another tpuft process is building this venv", 10)
            assert "(pid 4242 on worker-0, since 12:00:00)" in first, first
            _, still = out.wait_for("still waiting for the venv build by pid 4242", 5)
            assert "s so far" in still
            venv = tmp_path / "shared-venv"  # the other build finishes: complete, with its marker
            (venv / "bin").mkdir(parents=True)
            (venv / bootstrap.MARKER).write_text(json.dumps({"python": bootstrap.PYTHON}))
            fcntl.flock(lock, fcntl.LOCK_UN)
            assert waiter.wait(timeout=10) == 0
            out.thread.join(5)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
    said = [line for _, line in out.lines]
    assert any("venv ready (built by another worker)" in line for line in said), said
    assert not any("venv built in" in line for line in said)
