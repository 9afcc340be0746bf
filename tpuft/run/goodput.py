"""Goodput per run, from the timeline tpuft records with no change to the user's code (``events/`` in the run
dir).

Goodput is the time in step windows whose steps were kept, over the run's wall time. The wall time is laid out
once, second by second in effect: every instant belongs to the one event that covers it with the highest
precedence (a checkpoint saved inside a step window is checkpoint time, not step time; the first step's
compile is start-up, not steps), and what no event covers is ``other`` inside an attempt and ``idle`` between
attempts. So the causes add up to the wall time exactly, by construction, never by a remainder forced to fit.

Steps are "lost" when a later attempt resumed from a checkpoint before them: they were redone, so their
window's time is badput (``lost``), not goodput.

Where the user's code also records with ml-goodput-measurement (the ``TPUFT_GOODPUT_EXTERNAL`` flag in the
workers' environment, or the library loaded in the trainer), the breakdown says so (``external``): tpuft's
numbers are read from its own timeline and never added to Cloud Logging's.

Computed on demand, never stored. The controller's events are one object each (a bucket object cannot be
appended to); events of a cluster created or set up before any run exists wait in the cluster's state folder
and go to the next run launched on it (:func:`remember_cluster_event`, :func:`adopt_cluster_events`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.run import rundir

CONTROLLER_KINDS = (
    "queue_wait",
    "provision",
    "setup",
    "launch",
    "recovery_wait",
    "checkpoint_ask",
    "maintenance",
    "cost_stop",
)
WORKER_KINDS = ("startup", "steps", "checkpoint_save", "checkpoint_restore", "eval", "test", "export")
EVENT_KINDS = frozenset(CONTROLLER_KINDS + WORKER_KINDS)
MARKERS = frozenset({"checkpoint_ask", "maintenance", "cost_stop"})
"""Events that mark a moment (and carry facts) rather than take time of their own: the time around them
belongs to whatever else ran then (a checkpoint asked for is saved inside a step window:
``checkpoint_save``)."""

PRECEDENCE = (
    "checkpoint_save",
    "checkpoint_restore",
    "eval",
    "test",
    "export",
    "startup",
    "steps",
    "launch",
    "setup",
    "queue_wait",
    "provision",
    "recovery_wait",
)
"""Who owns an instant two events cover, first wins: the trainer's own phases over its step windows, the
trainer over the controller (which only sees a launch from outside)."""
_RANK = {kind: rank for rank, kind in enumerate(PRECEDENCE)}

CAUSES = (
    "queue_wait",
    "provision",
    "setup",
    "launch",
    "startup",
    "checkpoint_save",
    "checkpoint_restore",
    "eval",
    "test",
    "export",
    "data_wait",
    "lost",
    "recovery_wait",
    "idle",
    "other",
)
"""Badput's causes, in the order a table shows them."""

SHORT = {
    "checkpoint_save": "checkpoints",
    "checkpoint_restore": "restore",
    "queue_wait": "queue",
    "recovery_wait": "recovery wait",
    "data_wait": "data wait",
}


@dataclass
class Goodput:
    wall_s: float
    good_s: float
    badput: dict[str, float] = field(default_factory=dict)
    steps_lost: int = 0
    attempts: int = 1
    events: int = 0
    external: str | None = None
    """The name the user's code records goodput under with ml-goodput-measurement, when it does."""
    maintenance: list[dict[str, Any]] = field(default_factory=list)
    """Each maintenance window the run was told of (:func:`maintenance_of`): the one fact goodput's seconds do
    not show, whether its checkpoint came in time."""

    @property
    def goodput(self) -> float:
        return self.good_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 1),
            "good_s": round(self.good_s, 1),
            "goodput": round(self.goodput, 4),
            "badput": {cause: round(seconds, 1) for cause, seconds in self.badput.items()},
            "steps_lost": self.steps_lost,
            "attempts": self.attempts,
            "events": self.events,
            "external": self.external,
            "maintenance": self.maintenance,
        }

    def summary(self, limit: int = 5) -> str:
        """``goodput 87% (badput: startup 3m, checkpoints 40s, lost 2m ...)``: the largest causes first."""
        if not self.events:
            return "goodput: no events recorded"
        top = sorted(((s, c) for c, s in self.badput.items() if s >= 0.5), reverse=True)
        shown = ", ".join(f"{SHORT.get(c, c)} {duration(s)}" for s, c in top[:limit])
        more = " ..." if len(top) > limit else ""
        note = (
            f"; the job's code also records with ml-goodput-measurement ({self.external})"
            if self.external
            else ""
        )
        for window in self.maintenance:
            note += f"; {describe_maintenance(window)}"
        return (
            f"goodput {self.goodput:.0%} of {duration(self.wall_s)}"
            + (f" (badput: {shown}{more})" if shown else "")
            + note
        )


def maintenance_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per announced window (its ``maintenance`` events, first heard), with its checkpoint's step
    and latencies when the watcher read them back (the ``checkpoint_ask`` event of the same request)."""
    asks = [e for e in events if e["kind"] == "checkpoint_ask"]
    answered = {str(e.get("id")): e for e in asks} | {
        str(e.get("reason")): e for e in asks if e.get("reason")
    }
    windows: dict[Any, dict[str, Any]] = {}
    for event in events:
        if event["kind"] != "maintenance" or event.get("window_start") in windows:
            continue
        entry = {
            "attempt": event.get("attempt"),
            "heard": event["t"],
            "source": event.get("source"),
            "window_start": event.get("window_start"),
            "window_end": event.get("window_end"),
        }
        # By the window's reason: a refused ask is asked again under another id.
        done = answered.get(str(event.get("reason"))) or answered.get(str(event.get("request")))
        if (
            done is not None
        ):  # the ask's latency counts from its own ask; a refused first ask is in after_notice_s
            entry.update(
                {k: done.get(k) for k in ("step", "latency_s", "saved_s", "stored_s", "before_window_s")}
            )
            entry["after_notice_s"] = round(float(done["t"]) + float(done["s"]) - float(event["t"]), 2)
        windows[event.get("window_start")] = entry
    return list(windows.values())


def describe_maintenance(window: dict[str, Any]) -> str:
    if window.get("step") is None:
        return "maintenance announced; no checkpoint recorded for it"
    margin = window.get("before_window_s")
    ahead = (
        ""
        if margin is None
        else f", {margin:.0f}s before the window"
        if margin >= 0
        else f", {-margin:.0f}s late"
    )
    return (
        f"maintenance: checkpoint at step {window['step']} {window['after_notice_s']:.1f}s after the "
        f"notice{ahead}"
    )


def total(results: list[Goodput]) -> Goodput:
    """Several runs' breakdowns as one (``tpuft goodput``'s total row): seconds and lost steps added up."""
    badput: dict[str, float] = {}
    for result in results:
        for cause, seconds in result.badput.items():
            badput[cause] = badput.get(cause, 0.0) + seconds
    externals = sorted({r.external for r in results if r.external})
    return Goodput(
        sum(r.wall_s for r in results),
        sum(r.good_s for r in results),
        badput,
        sum(r.steps_lost for r in results),
        sum(r.attempts for r in results),
        sum(r.events for r in results),
        ", ".join(externals) or None,
    )


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m" if seconds >= 600 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds / 3600:.1f}h"


# -- reading the events ------------------------------------------------------------------------------------
def read_events(storage: Any) -> list[dict[str, Any]]:
    """Every event of the run: the trainers' lines and the controller's objects, in time order (torn or
    foreign entries skipped: a worker killed mid-line leaves one)."""
    found: list[dict[str, Any]] = []
    try:
        names = list(storage.list(rundir.EVENTS_DIR))
    except Exception:  # noqa: BLE001 - an unreadable folder is a run without events, said as such
        names = []
    for relpath in names:
        text = storage.read_text(relpath) if relpath.endswith((".json", ".jsonl")) else None
        for line in (text or "").splitlines() if relpath.endswith(".jsonl") else [text or ""]:
            event = rundir.read_json_text(line)
            if event is not None and _valid(event):
                found.append(event)
    return sorted(found, key=lambda e: float(e["t"]))


def _valid(event: dict[str, Any]) -> bool:
    return (
        event.get("kind") in EVENT_KINDS
        and isinstance(event.get("t"), (int, float))
        and isinstance(event.get("s"), (int, float))
        and event["s"] >= 0
    )


# -- the breakdown -----------------------------------------------------------------------------------------
def breakdown(storage: Any, info: dict[str, Any], now: float | None = None) -> Goodput:
    """The run's goodput and badput by cause (``info``: its run.json)."""
    return breakdown_of(read_events(storage), info, now)


def breakdown_of(events: list[dict[str, Any]], info: dict[str, Any], now: float | None = None) -> Goodput:
    now = time.time() if now is None else now
    spans = _attempt_spans(info, now)
    timed = [e for e in events if e["kind"] not in MARKERS]
    created = [float(info["created"])] if isinstance(info.get("created"), (int, float)) else []
    starts = [float(e["t"]) for e in timed] + [s for s, _ in spans] + created
    if not starts:
        return Goodput(0.0, 0.0, attempts=len(spans))
    begin = min(starts)
    running = info.get("status") in (None, "running")
    end = now if running else float(info.get("ended") or now)
    end = max([end] + [float(e["t"]) + float(e["s"]) for e in timed])
    owned = _lay_out(timed, begin, end)
    badput = dict.fromkeys(CAUSES, 0.0)
    good = 0.0
    limits = _kept_limits(events)
    lost_steps = 0
    for index, event in enumerate(timed):
        seconds = owned.get(index, 0.0)
        if event["kind"] != "steps":
            badput[event["kind"]] += seconds
            continue
        waited = min(float(event.get("data_wait_s") or 0.0) * seconds / max(float(event["s"]), 1e-9), seconds)
        badput["data_wait"] += waited
        first, last = int(event.get("from_step", 0)), int(event.get("to_step", 0))
        limit = limits.get(int(event.get("attempt", 1)))
        kept = (
            1.0
            if limit is None or last <= first
            else min(max(limit - first, 0), last - first) / (last - first)
        )
        if limit is not None and last > limit:
            lost_steps += last - max(first, limit)
        good += (seconds - waited) * kept
        badput["lost"] += (seconds - waited) * (1 - kept)
    uncovered_inside, uncovered_between = _uncovered(timed, owned, spans, begin, end)
    badput["other"] += uncovered_inside
    badput["idle"] += uncovered_between
    external = next((str(e["external_goodput"]) for e in events if e.get("external_goodput")), None)
    return Goodput(
        end - begin,
        good,
        {c: s for c, s in badput.items() if s > 0},
        lost_steps,
        attempts=max(len(spans), 1),
        events=len(events),
        external=external,
        maintenance=maintenance_of(events),
    )


def _attempt_spans(info: dict[str, Any], now: float) -> list[tuple[float, float]]:
    spans = []
    for attempt in info.get("attempts") or []:
        if isinstance(attempt, dict) and isinstance(attempt.get("started"), (int, float)):
            spans.append((float(attempt["started"]), float(attempt.get("ended") or now)))
    if not spans and isinstance(info.get("started"), (int, float)):
        spans.append((float(info["started"]), float(info.get("ended") or now)))
    return spans


def _lay_out(timed: list[dict[str, Any]], begin: float, end: float) -> dict[int, float]:
    """Event index -> the seconds it owns: at each instant, the covering event first in :data:`PRECEDENCE`
    (ties: the later one, a nested window)."""
    edges = sorted(
        {begin, end} | {min(max(float(e["t"]) + d, begin), end) for e in timed for d in (0.0, float(e["s"]))}
    )
    owned: dict[int, float] = {}
    order = sorted(range(len(timed)), key=lambda i: float(timed[i]["t"]))
    active: list[int] = []
    cursor = 0
    for left, right in zip(edges, edges[1:]):
        while cursor < len(order) and float(timed[order[cursor]]["t"]) <= left:
            active.append(order[cursor])
            cursor += 1
        active = [i for i in active if float(timed[i]["t"]) + float(timed[i]["s"]) > left]
        if active:
            winner = min(active, key=lambda i: (_RANK[timed[i]["kind"]], -float(timed[i]["t"])))
            owned[winner] = owned.get(winner, 0.0) + (right - left)
    return owned


def _uncovered(
    timed: list[dict[str, Any]],
    owned: dict[int, float],
    spans: list[tuple[float, float]],
    begin: float,
    end: float,
) -> tuple[float, float]:
    """Seconds no event covers, inside an attempt (``other``) and outside every attempt (``idle``)."""
    covered = sorted((max(float(e["t"]), begin), min(float(e["t"]) + float(e["s"]), end)) for e in timed)
    gaps, cursor = [], begin
    for left, right in covered:
        if left > cursor:
            gaps.append((cursor, left))
        cursor = max(cursor, right)
    if cursor < end:
        gaps.append((cursor, end))
    inside = 0.0
    for left, right in gaps:
        inside += sum(max(0.0, min(right, b) - max(left, a)) for a, b in _merged(spans))
    total = sum(right - left for left, right in gaps)
    return inside, total - inside


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for left, right in sorted(spans):
        if out and left <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], right))
        else:
            out.append((left, right))
    return out


def _kept_limits(events: list[dict[str, Any]]) -> dict[int, int]:
    """attempt -> the highest step of its that no later attempt redid: the lowest step a later attempt resumed
    from (its restored checkpoint, else where its start-up or first window began). Attempts absent: all
    kept."""
    resumed: dict[int, int] = {}
    for event in events:
        step = (
            event.get("step")
            if event["kind"] in ("checkpoint_restore", "startup")
            else event.get("from_step")
        )
        if event["kind"] in ("checkpoint_restore", "startup", "steps") and isinstance(step, int):
            attempt = int(event.get("attempt", 1))
            resumed[attempt] = min(resumed.get(attempt, step), step)
    limits: dict[int, int] = {}
    for attempt in {int(e.get("attempt", 1)) for e in events}:
        later = [step for other, step in resumed.items() if other > attempt]
        if later:
            limits[attempt] = min(later)
    return limits


# -- the controller's events -------------------------------------------------------------------------------
def controller_event(
    kind: str, started: float, seconds: float, attempt: int, **extra: Any
) -> tuple[str, str]:
    """The object's path in the run dir and its text."""
    if kind not in EVENT_KINDS:
        raise ValueError(f"unknown goodput event kind {kind!r}")
    event = {
        "kind": kind,
        "t": round(started, 3),
        "s": round(max(seconds, 0.0), 3),
        "attempt": attempt,
        **extra,
    }
    return f"{rundir.CONTROLLER_EVENTS}/{int(started * 1000)}-{kind}.json", json.dumps(event, sort_keys=True)


def record_controller_event(
    storage: Any, kind: str, started: float, seconds: float, attempt: int, **extra: Any
) -> bool:
    """One controller event, one object; never raises (a failed write costs the event and is said on
    stderr)."""
    try:
        path, text = controller_event(kind, started, seconds, attempt, **extra)
        storage.write_text(path, text)
        return True
    except Exception as exc:  # noqa: BLE001 - the run matters more than its timeline
        print(f"warning: goodput event {kind} not recorded: {exc}", file=sys.stderr)
        return False


PENDING = "goodput-events.jsonl"
"""In a cluster's state folder: its create and setup events, waiting for the next run launched on it."""


def remember_cluster_event(state_dir: Path, kind: str, started: float, seconds: float, **extra: Any) -> None:
    """An event of the cluster before any run exists (``create``, ``setup``); never raises."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with (state_dir / PENDING).open("a", encoding="utf-8") as handle:
            handle.write(
                json.dumps({"kind": kind, "t": round(started, 3), "s": round(max(seconds, 0.0), 3), **extra})
                + "\n"
            )
    except (OSError, TypeError, ValueError) as exc:
        print(f"warning: goodput event {kind} not recorded: {exc}", file=sys.stderr)


def adopt_cluster_events(state_dir: Path, storage: Any, attempt: int) -> int:
    """The cluster's waiting events become the run's (as this attempt's), then are forgotten; returns how
    many."""
    path = state_dir / PENDING
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        path.unlink()
    except OSError:
        return 0
    adopted = 0
    for line in lines:
        event = rundir.read_json_text(line)
        if (
            event is not None
            and event.get("kind") in EVENT_KINDS
            and isinstance(event.get("t"), (int, float))
        ):
            extra = {k: v for k, v in event.items() if k not in ("kind", "t", "s", "attempt")}
            adopted += record_controller_event(
                storage, event["kind"], float(event["t"]), float(event.get("s") or 0.0), attempt, **extra
            )
    return adopted
