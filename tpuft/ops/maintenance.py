"""Maintenance-aware runs, the controller's side: the recovery watcher asks for a checkpoint before an announced
maintenance window, and resumes the run once the window is over.

The watcher (:mod:`tpuft.ops.recover`) asks the provider about the node every ``recover.poll`` seconds anyway; the
provider's answer carries the node's health, symptoms and upcoming maintenance (``maintenance: KIND STATUS START ..
END`` in the cluster's details, :mod:`tpuft.maintenance_window`). On a pending window due within the lead time, it
writes an on-demand checkpoint request with ``stop`` (:func:`tpuft.ops.lifecycle.request_checkpoint`), unless a
worker's supervisor, which hears of it from its metadata server (:mod:`tpuft.worker.maintenance`), asked first, and
records a ``maintenance`` event. The trainers save at the next step boundary and stop; the run is ``stopped`` with
the window as its cause, and :func:`wait_out_window` holds the watcher (renewing its lease) until the window's end,
after which the watch resumes it (on the node as it is, or recreated when the maintenance left it not READY). Zero
steps are lost when the notice comes at least one step and one save ahead of the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpuft.maintenance_window import Window, rfc3339, window_of_reason
from tpuft.ops.lifecycle import request_checkpoint
from tpuft.records import Cluster
from tpuft.runs import Run
from tpuft.worker.maintenance import already_asked, record_event


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
            if window is None or window.reason() in self.acted or not window.due(now):
                continue
            self.acted.add(window.reason())
            return self.ask(window, source=f"TPU API ({key} of {cluster.name})", now=now)
        return None

    def ask(self, window: Window, *, source: str, now: float) -> str | None:
        info = self.run.info()
        if info.get("status") != "running":
            return None
        attempt = int(info.get("attempt", 1))
        earlier = already_asked(self.run.storage, attempt, window.reason())
        if earlier is not None:
            self.notice(f"maintenance announced ({source}): {window.describe()}; a worker asked for its checkpoint "
                        f"already ({earlier})")
            return None
        request_id = request_checkpoint(self.run, reason=window.reason(), stop=True)
        self.asked.append((request_id, now))
        record_event(self.run.storage, attempt, window, source=source, request_id=request_id, now=now)
        self.notice(f"maintenance announced ({source}): {window.describe()}: checkpoint {request_id} asked for; the "
                    f"run stops after it and resumes after the window")
        return request_id


def wait_out_window(info: dict[str, Any], notice: Callable[[str], None], renew: Callable[[], None], poll: float,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """A run stopped for a maintenance window (its cause names it): wait, renewing the watcher's lease, until the
    window is over; True when the caller should resume it, False for a run stopped for anything else."""
    window = window_of_reason(str(info.get("cause") or ""))
    if window is None:
        return False
    until = window.end if window.end is not None else time.time()
    left = until - time.time()
    if left > 0:
        notice(f"run stopped with a checkpoint before maintenance; it resumes after the window ends at "
               f"{rfc3339(until)} (in {left:.0f} s)")
    while (left := until - time.time()) > 0:
        renew()
        sleep(min(poll, left))
    return True
