"""Start-up as one unit: which launched trainers are not up yet (no first step), read from the run dir.

A Multislice runtime waits until every host of every slice has joined; one host that never comes leaves the
others waiting in their rendezvous, silent. Both sides read the same records to say who is missing: the
controller's live view every ~30 s ("waiting for slice 1 host 3 (worker 7) to start: 4 of 8 up"), and each
supervisor once ``train.startup_timeout`` has passed, to fail the run naming the missing hosts rather than the
waiting ones.

Stdlib and :mod:`tpuft.run.rundir` only (the supervisor's imports stay light); ``storage`` is the run dir,
local or in a bucket (heartbeats reach a bucket with the staging copy's sync).
"""

from __future__ import annotations

from typing import Any

from tpuft.core.records import SliceLayout
from tpuft.run import rundir


def is_up(record: dict[str, Any] | None, beat: dict[str, Any] | None, since: float) -> bool:
    """A trainer is up once its supervisor runs it and its heartbeat of this attempt has left ``starting``
    (its first step is done: the runtime's rendezvous is behind it); an ended one is no longer waited for (a
    failure is the fail-fast's business, not the start-up's)."""
    if record is None:
        return False
    if record.get("status") in rundir.TERMINAL:
        return True
    if beat is None or float(beat.get("time") or 0.0) < since:
        return False
    return beat.get("status") in rundir.TERMINAL or str(beat.get("phase") or "step") != "starting"


def not_up(storage: Any, attempt: int, workers: int, since: float) -> list[int]:
    """The launched workers (ranks) whose trainer is not up: no supervisor record of ``attempt``, or no
    heartbeat newer than ``since`` (the attempt's start) past its ``starting`` phase."""
    records = rundir.attempt_records(storage, attempt)
    missing = []
    for worker in range(workers):
        record = records.get(worker)
        beat = rundir.read_heartbeat(storage, worker) if record else None
        if not is_up(record, beat, since):
            missing.append(worker)
    return missing


def names(layout: SliceLayout, workers: list[int], most: int = 8) -> str:
    """``slice 1 host 3 (worker 7), slice 1 host 4 (worker 8) and 3 more``."""
    shown = ", ".join(layout.name(w) for w in workers[:most])
    return shown + (f" and {len(workers) - most} more" if len(workers) > most else "")


def waiting_line(layout: SliceLayout, missing: list[int], left_s: float, timeout_s: float) -> str:
    """The live view's report while trainers are not up."""
    up = layout.workers - len(missing)
    left = f"{left_s / 60:.0f}m left" if left_s >= 60 else f"{max(left_s, 0):.0f}s left"
    return (
        f"waiting for {names(layout, missing)} to start: {up} of {layout.workers} up, {left} of "
        f"train.startup_timeout ({timeout_s:.0f} s)"
    )
