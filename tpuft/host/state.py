"""A worker host's own state, for the supervisor (:mod:`tpuft.worker.supervisor.process`): which run it holds,
on its disk (``$HOME/.tpuft/supervisor/current.json``, under a lock), whether a process is still the one that
was recorded, and ``check``: is this worker free, and what did dead runs leave behind (a trainer that outlived
its supervisor, a process still holding the TPU chips) that must go before the next run starts.

Stdlib only, as the supervisor's ``check`` and ``follow`` must start fast. Shared with the controller, which
reads the same names (the state folder, the TPU device files and libtpu's lockfile for ``doctor`` and
``drill``; whether a recorded process lives, for the recovery watcher).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpuft.core.waiting import waiting
from tpuft.run import rundir

STATE_DIR = ".tpuft/supervisor"
"""Under the worker's HOME."""
TPU_DEVICES = ("/dev/accel", "/dev/vfio/")
TPU_LOCKFILE = "/tmp/libtpu_lockfile"


def state_dir() -> Path:
    return Path(os.environ.get("HOME") or Path.home()) / STATE_DIR


def current_path() -> Path:
    return state_dir() / "current.json"


@contextlib.contextmanager
def worker_lock() -> Iterator[None]:
    """One ``check``/``start`` at a time on a worker: two ``tpuft train`` racing cannot both claim it. The
    holder writes its pid and command into the lock file, so a process kept waiting can say whom it waits for
    (on stderr, which reaches the controller's terminal as this worker's lines)."""
    state_dir().mkdir(parents=True, exist_ok=True)
    # not "w": that would erase the holder's name
    fd = os.open(state_dir() / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+") as handle:
        if not _try_lock(handle):
            holder = handle.read().strip() or "a process that did not say"
            with waiting(
                f"this worker's lock ({state_dir() / 'lock'}), held by another tpuft process: {holder}"
            ):
                # blocks until the holder lets go; the wait line tells the time
                fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} ({' '.join(os.path.basename(a) for a in sys.argv[:3])[:120]})\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def _try_lock(handle: Any) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def read_current() -> dict[str, Any]:
    return rundir.read_json(current_path()) or {}


def write_current(data: dict[str, Any]) -> None:
    rundir.write_json_atomic(current_path(), data)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): with the pid it names one process, not
    whichever later one reuses the number."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def process_state(pid: int) -> str | None:
    """``R``, ``S``, ``D``, ``T`` (stopped), ``Z``...; None when there is no such process."""
    fields = _stat(pid)
    return fields[0] if fields else None


def is_alive(pid: int | None, ticks: int | None = None) -> bool:
    fields = _stat(pid) if pid else None
    if fields is None or fields[0] in {"Z", "X"}:
        return False
    return ticks is None or int(fields[19]) == ticks


def supervisor_alive(current: dict[str, Any]) -> bool:
    return current.get("status") in {"starting", "running"} and is_alive(
        current.get("supervisor_pid"), current.get("supervisor_ticks")
    )


def process_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# ----------------------------------------------------------------------------------------------------------
# check: is this worker free? clean what dead runs left behind


def leftover_processes(home: str, keep_run: str | None) -> list[tuple[int, str]]:
    """(pid, run id) of processes of this worker (its HOME) that belong to a tpuft run other than
    ``keep_run``: the trainers, supervisors and followers of runs that are no longer alive."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in {me, os.getppid()}:
            continue
        env = process_environ(int(entry.name))
        run = env.get("TPUFT_RUN_ID")
        if run and env.get("HOME") == home and run != keep_run:
            found.append((int(entry.name), run))
    return found


def tpu_holders(devices: tuple[str, ...] = TPU_DEVICES) -> list[int]:
    """Processes holding a TPU chip open (``/dev/accel*``, ``/dev/vfio/*``): a crashed run's trainer keeps the
    chips and the next one fails with "TPU in use", as MaxText's multihost runner knows."""
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(devices):
                holders.append(int(entry.name))
                break
    return holders


def check_worker(
    *, free_tpu: bool, devices: tuple[str, ...] = TPU_DEVICES, lockfile: str = TPU_LOCKFILE
) -> dict[str, Any]:
    """Under the worker lock: {"busy": run id of a live run, or None; "cleaned": what was stopped or
    removed}."""
    current = read_current()
    if supervisor_alive(current):
        return {
            "busy": current.get("run_id"),
            "since": current.get("started"),
            "attempt": current.get("attempt"),
            "cleaned": [],
        }
    cleaned = []
    home = os.environ.get("HOME") or str(Path.home())
    for pid, run in leftover_processes(home, None):
        with contextlib.suppress(OSError):
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                kill_group(pgid, signal.SIGKILL)
        kill_pid(pid, signal.SIGKILL)
        cleaned.append(f"killed pid {pid}, left over from run {run}")
    if free_tpu:
        for pid in tpu_holders(devices):
            kill_pid(pid, signal.SIGKILL)
            cleaned.append(f"killed pid {pid}, which held the TPU chips")
        if os.path.exists(lockfile):
            with contextlib.suppress(OSError):
                os.remove(lockfile)
                cleaned.append(f"removed {lockfile}")
    if current and current.get("status") in {"starting", "running"}:
        write_current({**current, "status": "ended", "cleaned": time.time()})
        cleaned.append(
            f"run {current.get('run_id')} had lost its supervisor (pid {current.get('supervisor_pid')})"
        )
    return {"busy": None, "cleaned": cleaned}
