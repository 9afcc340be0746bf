"""The trainer's side of the run's timeline (``events/``, read by :mod:`tpuft.run.goodput`): what the run
spent its time on, recorded as it happens so that goodput needs no change to the user's code.

The chief process alone appends, one JSON line per event, to ``events/worker-<i>-attempt-<n>.jsonl`` in its
LOCAL run dir; the run-dir sync uploads it like metrics.jsonl. The file is per attempt because a bucket object
cannot be appended to: an attempt recovered onto a fresh node starts with an empty staging folder, and one
file for every attempt would be overwritten there with the new attempt's events alone.

Cheap by design: the loop records one ``steps`` event per log interval, not per step; a line is written and
flushed (the file stays open, line-buffered); nothing here ever raises into training (a full disk costs the
events, not the run). ``TPUFT_EVENTS=0`` turns recording off (``benchmarks/goodput_overhead.py`` measures the
difference).

Stdlib only: it runs inside every backend's venv.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from tpuft.run import rundir

EVENTS_ENV = "TPUFT_EVENTS"
EXTERNAL_ENV = "TPUFT_GOODPUT_EXTERNAL"
"""Set (in ``worker_env``) to the job name the user's code records with ml-goodput-measurement: goodput's
output says so, and tpuft's numbers are not added to Cloud Logging's."""
EXTERNAL_MODULE = "ml_goodput_measurement"


def enabled() -> bool:
    return os.environ.get(EVENTS_ENV, "1") != "0"


def process_started() -> float:
    """When this process started (unix seconds): the kernel's record, so that the start-up event includes the
    interpreter and the framework's imports that ran before tpuft's code did; the import time of this module
    where /proc is not there."""
    # the start in ticks since boot, against the clock since boot now (/proc/stat's btime is whole seconds)
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age if 0 <= age < 30 * 86400 else _IMPORTED
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED


_IMPORTED = time.time()


def external_recorder() -> str | None:
    """The name under which the user's code records goodput with ml-goodput-measurement, if it does: the
    ``TPUFT_GOODPUT_EXTERNAL`` flag, or the library imported in this process (by a data hook, say)."""
    flagged = os.environ.get(EXTERNAL_ENV, "").strip()
    if flagged:
        return flagged
    return EXTERNAL_MODULE if EXTERNAL_MODULE in sys.modules else None


class EventWriter:
    """Appends this process's events (only a chief's writer is ever opened)."""

    def __init__(self, path: Path, attempt: int) -> None:
        self.path, self.attempt = path, attempt
        self._handle: IO[str] | None = None
        self.broken = False

    def write(self, kind: str, started: float, seconds: float, extra: dict[str, Any]) -> None:
        if self.broken:
            return
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("a", encoding="utf-8", buffering=1)
            event = {
                "kind": kind,
                "t": round(started, 3),
                "s": round(max(seconds, 0.0), 3),
                "attempt": self.attempt,
                **extra,
            }
            self._handle.write(json.dumps(event, separators=(",", ":")) + "\n")
        except (OSError, TypeError, ValueError) as exc:
            self.broken = True  # said once; training goes on without events
            print(f"[tpuft] cannot record run events in {self.path}: {exc}", flush=True)

    def close(self) -> None:
        if self._handle is not None:
            try:
                self._handle.close()
            except OSError:
                pass
            self._handle = None


_writer: EventWriter | None = None


def events_file(run_dir: Path, worker: int, attempt: int) -> Path:
    return run_dir / rundir.EVENTS_DIR / f"worker-{worker}-attempt-{attempt}.jsonl"


def open_for(run_dir: Path, worker: int, *, chief: bool) -> None:
    """Make this process the run's event writer (the loop calls it once it knows whether it is the chief); a
    process that is not the chief, or a run with ``TPUFT_EVENTS=0``, records nothing."""
    global _writer
    close()
    if chief and enabled():
        attempt = int(os.environ.get("TPUFT_ATTEMPT", "1") or 1)
        _writer = EventWriter(events_file(run_dir, worker, attempt), attempt)


def record(kind: str, started: float, seconds: float, **extra: Any) -> None:
    """One event of ``kind`` that began at ``started`` (unix seconds) and lasted ``seconds``. A no-op on a
    process that is not the chief (or before the loop has opened the writer); never raises."""
    if _writer is not None:
        _writer.write(kind, started, seconds, extra)


def recording() -> bool:
    return _writer is not None


def close() -> None:
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None
