"""Maintenance-aware runs, the controller's side: the recovery watcher asks for a checkpoint before an
announced maintenance window, and resumes the run once the window is over.

The watcher (:mod:`tpuft.ops.recover`) asks the provider about the node every ``recover.poll`` seconds anyway;
the provider's answer carries the node's health, symptoms and upcoming maintenance (``maintenance: KIND STATUS
START .. END`` in the cluster's details, :mod:`tpuft.run.maintenance_window`). On a pending window due within
the lead time, it writes an on-demand checkpoint request with ``stop``
(:func:`tpuft.ops.lifecycle.request_checkpoint`), unless a worker's supervisor, which hears of it from its
metadata server (:mod:`tpuft.worker.supervisor.maintenance`), asked first, and records a ``maintenance``
event. The trainers save at the next step boundary and stop; the run is ``stopped`` with the window as its
cause, and :func:`wait_out_window` holds the watcher (renewing its lease) until the window's end, after which
the watch resumes it (on the node as it is, or recreated when the maintenance left it not READY). Zero steps
are lost when the notice comes at least one step and one save ahead of the window.

Before it waits, it reads back how the checkpoint went (:func:`checkpoint_before`): the step, the latency from
the ask to the save on the chief and to the checkpoint's arrival in run storage (the chief supervisor's last
record, written after its final upload), and the margin left before the window. That is the figure that says
whether the notice came early enough; it is printed, and kept as the ``checkpoint_ask`` event (the goodput
timeline's marker, as ``tpuft checkpoint`` records it), whoever of the watcher and the supervisors asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpuft.core.records import Cluster
from tpuft.ops.lifecycle import request_checkpoint
from tpuft.ops.ondemand import acks, request_state
from tpuft.readers.runs import Run
from tpuft.run import rundir
from tpuft.run.goodput import record_controller_event
from tpuft.run.maintenance_asks import already_asked, record_event
from tpuft.run.maintenance_window import Window, rfc3339, window_of_reason


class MaintenanceWatch:
    """One attached attempt's view of the maintenance the provider announces; acts once per window."""

    def __init__(self, run: Run, notice: Callable[[str], None]) -> None:
        self.run = run
        self.notice = notice
        self.acted: set[str] = set()
        self.asked: list[tuple[str, float]] = []
        """(request id, when it was asked) of each checkpoint this watch asked for."""

    def see(self, cluster: Cluster, now: float | None = None) -> str | None:
        """Called with each poll's cluster; the id of the checkpoint request it wrote, if it wrote one."""
        now = time.time() if now is None else now
        for key, line in cluster.details.items():
            if key != "maintenance" and not key.startswith("maintenance "):
                continue
            window = Window.parse(str(line))
            if window is None or not window.due(now):
                continue
            return self.ask(window, source=f"TPU API ({key} of {cluster.name})", now=now)
        return None

    def ask(self, window: Window, *, source: str, now: float) -> str | None:
        """Ask unless a request for the window stands; asked again (each poll, while the window is due and the
        run runs) when the trainers refused it: a host had passed the step it named."""
        info = self.run.info()
        if info.get("status") != "running":
            return None
        attempt = int(info.get("attempt", 1))
        earlier = already_asked(self.run.storage, attempt, window.reason())
        again = window.reason() in self.acted
        self.acted.add(window.reason())
        if earlier is not None:
            if not again:
                self.notice(
                    f"maintenance announced ({source}): {window.describe()}; a worker asked for its "
                    f"checkpoint already ({earlier})"
                )
            return None
        request_id = request_checkpoint(self.run, reason=window.reason(), stop=True)
        self.asked.append((request_id, now))
        if again:
            self.notice(
                f"the checkpoint before maintenance was refused (a host had passed its step): asked again "
                f"({request_id})"
            )
            return request_id
        record_event(self.run.storage, attempt, window, source=source, request_id=request_id, now=now)
        self.notice(
            f"maintenance announced ({source}): {window.describe()}: checkpoint {request_id} asked for; the "
            f"run stops after it and resumes after the window"
        )
        return request_id


def checkpoint_before(run: Run, info: dict[str, Any], window: Window) -> dict[str, Any] | None:
    """The checkpoint the stopped attempt saved for ``window``, read back from the run dir and recorded as the
    ``checkpoint_ask`` event: ``{id, step, asked, saved_s, stored_s, before_window_s, in_storage}`` (seconds
    from the ask to the chief's save, and to its supervisor's last record after the final upload; the window's
    start minus the latter). None when no trainer saved for it (a refusal, a stop before any step).
    Idempotent: the event's object is named after the ask, so a watcher that takes over during the window
    writes the same one again."""
    attempt = int(info.get("attempt", 1))
    request_id = already_asked(run.storage, attempt, window.reason())
    request = request_state(run, attempt, request_id) if request_id is not None else None
    chief = acks(run, attempt, request_id).get(0) if request_id is not None else None
    if (
        request is None
        or chief is None
        or chief.get("refused")
        or not isinstance(chief.get("saved"), (int, float))
    ):
        return None
    asked, saved, step = float(request["time"]), float(chief["saved"]), int(chief["step"])
    final = rundir.attempt_records(run.storage, attempt).get(0) or {}
    stored = (
        float(final["alive"]) if final.get("final") and isinstance(final.get("alive"), (int, float)) else None
    )
    landed = stored if stored is not None else saved
    found = {
        "id": request_id,
        "step": step,
        "asked": asked,
        "saved_s": round(saved - asked, 2),
        "stored_s": round(stored - asked, 2) if stored is not None else None,
        "before_window_s": round(window.start - landed, 1) if window.start is not None else None,
        "in_storage": step in run.layout().checkpoint_steps(run.storage),
    }
    record_controller_event(
        run.storage,
        "checkpoint_ask",
        asked,
        landed - asked,
        attempt,
        id=request_id,
        at_step=request.get("at_step"),
        step=step,
        latency_s=round(landed - asked, 2),
        reason=window.reason(),
        **{k: found[k] for k in ("saved_s", "stored_s", "before_window_s", "in_storage")},
    )
    return found


def describe_checkpoint(found: dict[str, Any]) -> str:
    """The checkpoint-before-maintenance line a user reads."""
    stored = f", in run storage {found['stored_s']} s after it" if found.get("stored_s") is not None else ""
    margin = found.get("before_window_s")
    when = (
        ""
        if margin is None
        else f", {margin} s before the window"
        if margin >= 0
        else f", {-margin} s AFTER the window began (the notice came too late)"
    )
    missing = (
        ""
        if found.get("in_storage")
        else " (but not found complete in run storage: a resume restores an earlier one)"
    )
    return (
        f"checkpoint before maintenance: step {found['step']}, saved {found['saved_s']} s after "
        f"the ask{stored}{when}{missing}"
    )


def wait_out_window(
    info: dict[str, Any],
    notice: Callable[[str], None],
    renew: Callable[[], None],
    poll: float,
    sleep: Callable[[float], None] = time.sleep,
    run: Run | None = None,
) -> bool:
    """A run stopped for a maintenance window (its cause names it): say how its checkpoint went (with
    ``run``), then wait, renewing the watcher's lease, until the window is over; True when the caller should
    resume it, False for a run stopped for anything else."""
    window = window_of_reason(str(info.get("cause") or ""))
    if window is None:
        return False
    found = checkpoint_before(run, info, window) if run is not None else None
    if found is not None:
        notice(describe_checkpoint(found))
    until = window.end if window.end is not None else time.time()
    left = until - time.time()
    if left > 0:
        notice(
            f"run stopped with a checkpoint before maintenance; it resumes after the window ends at "
            f"{rfc3339(until)} (in {left:.0f} s)"
        )
    while (left := until - time.time()) > 0:
        renew()
        sleep(min(poll, left))
    return True
