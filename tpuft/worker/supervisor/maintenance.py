"""Maintenance notices on a worker: the supervisor asks for a checkpoint before the window, not after the node
is gone.

A TPU VM hears of maintenance from its metadata server first (``instance/upcoming-maintenance``: 404 while
nothing is announced, JSON with the window once something is), often before the TPU API's node shows it to a
watcher that polls every ``recover.poll`` seconds, and the supervisor is the one process of the run that lives
on the host for the whole attempt. So each supervisor polls its host's key every :data:`POLL_SECONDS` from a
daemon thread and, on a window it has not acted on, writes a checkpoint request in the run dir (the on-demand
checkpoint's contract, ``rundir.checkpoint_request``: every supervisor relays it to its trainer) and a
``maintenance`` event beside the controller's (``tpuft.run.goodput.record_controller_event``).

Where the notice comes from: the file ``~/.tpuft/upcoming-maintenance.json`` when it exists (how the local
pod, whose workers have no metadata server, rehearses it: ``tpuft drill maintenance`` writes it in the
worker's home), else the metadata server at ``$GCE_METADATA_HOST`` (google-auth's variable; the rigs point it
at a loopback server) or, on TPU hosts, ``metadata.google.internal``. A worker that has neither (a local
worker without the file) polls nothing.

A window is acted on once it starts within ``TPUFT_MAINTENANCE_LEAD_SECONDS`` (15 min; scheduled maintenance
is announced days ahead). The request asks to stop after the checkpoint (``stop: true``): the steps trained
between a checkpoint and the window would be lost with the node, and the watcher (``--recover``) resumes the
run once the window is over. Its reason names the window (:meth:`Window.reason`), and a request with that
reason in the attempt's folder means it was asked already, so every host that hears of the window and a
watcher that reads it from the API (:mod:`tpuft.ops.maintenance`) make one checkpoint, not one each. Its
``at_step`` is this host's heartbeat step plus what the run trains while the request reaches every trainer, by
the one rule the controller's ``tpuft checkpoint`` uses too (:func:`tpuft.run.rundir.checkpoint_at_step`), so
that on several hosts every process saves at the same step.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuft.core.safe_yaml import resolved_section
from tpuft.host.launch_env import TARGET_ENV
from tpuft.run import rundir
from tpuft.run.maintenance_asks import already_asked, notice_file, record_event
from tpuft.run.maintenance_window import Window
from tpuft.storage.sync import SYNC_SECONDS
from tpuft.worker.context import WorkerContext

POLL_SECONDS = float(os.environ.get("TPUFT_MAINTENANCE_POLL_SECONDS", "10"))
"""How often a supervisor asks its metadata server (a loopback-cheap GET on the host)."""
METADATA_PREFIX = "/computeMetadata/v1/instance/"
RELAY_SECONDS = 6.0
"""The request's way to every trainer: the supervisors' control poll and the relay's write, with slack."""


def metadata_host() -> str | None:
    """The metadata server to ask, or None where there is none (a local worker)."""
    configured = os.environ.get("GCE_METADATA_HOST")
    if configured:
        return configured
    return "metadata.google.internal" if os.environ.get(TARGET_ENV) == "tpu" else None


def _metadata(host: str, key: str, timeout: float) -> str | None:
    """One metadata key's text; None for a 404 (nothing announced) and for a server that does not answer (the
    next poll asks again)."""
    request = urllib.request.Request(
        f"http://{host}{METADATA_PREFIX}{key}", headers={"Metadata-Flavor": "Google"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(response.read().decode())
    except (OSError, ValueError):
        return None


def read_notice(home: Path | None = None, timeout: float = 2.0) -> tuple[dict[str, Any] | None, str]:
    """(the announced window, where it was read); (None, source) when nothing is announced.
    ``maintenance-event`` is asked too when no window is: GCE changes it 60 s before an event, and gives that
    warning only to a VM that has asked for the key since its last event; a value other than NONE is a window
    starting now."""
    path = notice_file(home)
    if path.exists():
        return rundir.read_json(path), f"file {path}"
    host = metadata_host()
    if host is None:
        return None, "none"
    source = f"metadata server {host}"
    try:
        window = json.loads(_metadata(host, "upcoming-maintenance", timeout) or "null")
    except ValueError:
        window = None
    if isinstance(window, dict) and window:
        return window, source
    event = (_metadata(host, "maintenance-event", timeout) or "NONE").strip()
    if event and event != "NONE":
        return {"type": event, "maintenance_status": "PENDING"}, f"{source} (maintenance-event)"
    return None, source


def at_step_from(beat: dict[str, Any], batch: float, now: float, remote: bool, log_every: int = 1) -> int:
    """The step every host saves at (:func:`tpuft.run.rundir.checkpoint_at_step`), from this host's
    heartbeat."""
    rate = float(beat.get("examples_per_s") or 0.0)
    steps_per_s = rate / batch if batch > 0 and rate > 0 else 0.0
    travel = (
        max(0.0, now - float(beat.get("time") or now)) + RELAY_SECONDS + (SYNC_SECONDS if remote else 0.0)
    )
    return rundir.checkpoint_at_step(int(beat.get("step") or 0), steps_per_s, travel, log_every)


def ask_before(
    storage: Any,
    attempt: int,
    window: Window,
    *,
    source: str,
    at_step: int | None,
    now: float | None = None,
    again: bool = False,
) -> str | None:
    """Write the checkpoint-and-stop request for ``window`` and its event, unless one stands already (another
    host, the watcher); the request's id when this call asked. ``again``: this asker's earlier request was
    refused; the new one is not a new window, so no second ``maintenance`` event."""
    now = time.time() if now is None else now
    if already_asked(storage, attempt, window.reason()) is not None:
        return None
    request_id = str(int(now * 1000))
    request = {"id": request_id, "time": now, "reason": window.reason(), "at_step": at_step, "stop": True}
    storage.write_text(rundir.checkpoint_request(attempt, request_id), json.dumps(request))
    if not again:
        record_event(storage, attempt, window, source=source, request_id=request_id, now=now)
    return request_id


class MaintenanceNotices:
    """The supervisor's poll of its host's maintenance key, in a daemon thread for the attempt's life."""

    def __init__(
        self,
        ctx: WorkerContext,
        storage: Any,
        attempt: int,
        say: Callable[[str], None],
        home: Path | None = None,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.ctx, self.storage, self.attempt, self.say = ctx, storage, attempt, say
        self.home, self.poll = home, poll
        self.seen: set[str] = set()
        self.asked: list[tuple[str, float]] = []
        """(request id, unix time of the ask) of each request this supervisor wrote: the latency's end
        points."""
        self.stopped = threading.Event()

    @classmethod
    def start(
        cls, ctx: WorkerContext, storage: Any, attempt: int, say: Callable[[str], None]
    ) -> MaintenanceNotices | None:
        """Started where there is something to poll (a metadata server, or the local pod's notice folder)."""
        notices = cls(ctx, storage, attempt, say, poll=POLL_SECONDS)
        if metadata_host() is None and not notice_file().parent.exists():
            return None
        threading.Thread(target=notices.loop, name="maintenance-notices", daemon=True).start()
        return notices

    def loop(self) -> None:
        while not self.stopped.wait(self.poll):
            self.check()

    def check(self) -> str | None:
        """One poll; the request id when this poll asked for a checkpoint. Never raises: a run is not failed
        for a notice it could not act on (the watcher reads the API too)."""
        try:
            announced, source = read_notice(self.home)
            if announced is None:
                return None
            window = Window.of(announced)
            now = time.time()
            if not window.due(now):
                return None
            again = window.reason() in self.seen
            if again and already_asked(self.storage, self.attempt, window.reason()) is not None:
                return None  # its request stands (ours or another's): the trainers are on it
            self.seen.add(window.reason())
            beat = rundir.read_json(rundir.heartbeat_path(self.ctx.run_dir, self.ctx.worker_id)) or {}
            train = self._train()
            at_step = (
                at_step_from(
                    beat,
                    float(train.get("batch_size") or 0),
                    now,
                    self.ctx.remote,
                    int(train.get("log_every") or 1),
                )
                if self.ctx.num_workers > 1
                else None
            )
            request_id = ask_before(
                self.storage,
                self.attempt,
                window,
                source=f"{source} (worker {self.ctx.worker_id})",
                at_step=at_step,
                now=now,
                again=again,
            )
            if request_id is None:
                if not again:
                    self.say(f"maintenance announced ({source}); its checkpoint was asked for already")
                return None
            self.asked.append((request_id, now))
            step = f" at step {at_step}" if at_step is not None else " at the next step"
            self.say(
                f"maintenance announced ({source}): {window.describe()}: checkpoint {request_id} "
                f"asked for{step}, then a stop"
            )
            return request_id
        except Exception as exc:  # noqa: BLE001 - see above
            self.say(f"maintenance notice not acted on: {type(exc).__name__}: {exc}")
            return None

    def _train(self) -> dict[str, Any]:
        """The recipe's ``train`` section ({} when it cannot be read: the request then names the next
        steps)."""
        path = self.ctx.run_dir / rundir.RECIPE
        return resolved_section(path.read_text() if path.is_file() else None, "train")
