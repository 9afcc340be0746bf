"""The checkpoint asked before a maintenance window, as both sides that ask it record it: the supervisors,
which hear of the window from their host (:mod:`tpuft.worker.supervisor.maintenance`), and the controller's
watcher, which reads it from the TPU API (:mod:`tpuft.ops.maintenance`). Whether this attempt already has a
standing request for the window (so every host and the watcher make one checkpoint, not one each), the
``maintenance`` goodput event, and where a host's local notice file is (how the local pod rehearses a window:
``tpuft drill maintenance`` writes it).

Run storage and the records of :mod:`tpuft.run.rundir` only; imported by the controller and the worker alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tpuft.run import rundir
from tpuft.run.goodput import record_controller_event
from tpuft.run.maintenance_window import NOTICE_RELPATH, Window


def notice_file(home: Path | None = None) -> Path:
    return (home or Path(os.environ.get("HOME") or Path.home())) / NOTICE_RELPATH


def already_asked(storage: Any, attempt: int, reason: str) -> str | None:
    """The id of this attempt's standing checkpoint request with ``reason`` (one listing): written and refused
    by no trainer. A refused one (a host had passed its ``at_step`` when it arrived) does not count, so
    whoever hears of the window next asks again, with a later step; a notice is never dropped by a refusal."""
    listing = list(storage.list(f"{rundir.ATTEMPTS_DIR}/{attempt}"))
    for relpath in listing:
        match = rundir.CHECKPOINT_REQUEST_NAME.match(relpath.rpartition("/")[2])
        if match is None:
            continue
        request = rundir.read_json_text(storage.read_text(rundir.checkpoint_request(attempt, match[1]))) or {}
        if request.get("reason") != reason:
            continue
        answers = rundir.checkpoint_answers(storage, attempt, match[1], listing).get(match[1], {})
        if not any(answer.get("refused") for answer in answers.values()):
            return match[1]
    return None


def record_event(
    storage: Any, attempt: int, window: Window, *, source: str, request_id: str | None, now: float
) -> None:
    """The ``maintenance`` event (goodput's controller kind: the supervisor, like the controller, writes run
    storage one object at a time); never raises."""
    record_controller_event(
        storage,
        "maintenance",
        now,
        0.0,
        attempt,
        source=source,
        window_start=window.start,
        window_end=window.end,
        request=request_id,
        reason=window.reason(),
    )
