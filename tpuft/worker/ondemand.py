"""Checkpoints on demand, the trainer's side: a request its supervisor relayed
(``tpuft/worker/supervisor/supervision.py``) is served at a step boundary through the backend's normal save
path, then acknowledged.

Why here and cheap: the trainer asks once per step, so the question is one ``os.stat`` of its control folder
(:func:`tpuft.run.rundir.checkpoint_control`, on this host's disk) while nothing is new; the bucket is never
read here.

Several hosts must save at the same step (T5X's save is a collective), so a request names ``at_step``. It is
served at that step exactly; a host that sees it only after that step refuses it (an acknowledgement with
``refused``) rather than start a save its peers have gone past: a request is never a deadlock, at worst it is
refused with the reason, and the periodic checkpoints go on. A request with ``stop`` holds the trainer after
its save, beating, until its supervisor (which sees the acknowledgement) stops it as ``tpuft stop`` would: a
resume starts at exactly that step.

Stdlib only: it runs inside every backend's venv.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.run import rundir

HOLD_SECONDS = float(os.environ.get("TPUFT_STOP_HOLD_SECONDS", "300"))
"""How long a trainer that saved for a stop waits to be stopped by its supervisor before it fails, saying
so."""
RECENT_NS = 2_000_000_000
"""A control folder changed this recently is listed again: two relays within the file system's timestamp tick
leave one modification time."""


@dataclass(frozen=True)
class Request:
    id: str
    reason: str
    at_step: int | None
    stop: bool

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Request:
        at_step = data.get("at_step")
        return cls(
            str(data["id"]),
            str(data.get("reason") or "asked"),
            int(at_step) if at_step is not None else None,
            bool(data.get("stop")),
        )


class CheckpointRequests:
    """The requests relayed to this process's worker, and its answers. ``answers``: this process writes the
    worker's acknowledgement (the one that beats: one process per host)."""

    def __init__(self, run_dir: Path, worker: int, attempt: int, *, answers: bool) -> None:
        self.run_dir, self.worker, self.attempt, self.answers = run_dir, worker, attempt, answers
        self.control = rundir.checkpoint_control(run_dir, worker)
        self._seen_ns: int | None = None
        self._pending: dict[str, Request] = {}
        self._done: set[str] = set()

    @classmethod
    def of(cls, ctx: Any, *, answers: bool) -> CheckpointRequests:
        """``ctx``: the WorkerContext; the attempt is the supervisor's ``TPUFT_ATTEMPT``."""
        return cls(ctx.run_dir, ctx.worker_id, int(os.environ.get("TPUFT_ATTEMPT", "1")), answers=answers)

    def due(self, step: int) -> Request | None:
        """The request to serve now, at the boundary after ``step`` (None: none): the first boundary at or
        past its ``at_step`` (a framework that reports every few steps, Keras's executions, may pass it). A
        request found only after its ``at_step`` has passed is refused here."""
        self._look(step)
        for request in sorted(self._pending.values(), key=lambda r: r.id):
            if request.at_step is None or step >= request.at_step:
                del self._pending[request.id]
                self._done.add(request.id)
                return request
        return None

    def within(self, first: int, last: int) -> int | None:
        """The earliest ``at_step`` of a pending request strictly between two boundaries ``first`` and
        ``last`` (T5X, whose loop comes back to Python every ``log_every`` steps, splits its run of steps
        there)."""
        self._look(first)
        inside = [
            r.at_step for r in self._pending.values() if r.at_step is not None and first < r.at_step < last
        ]
        return min(inside) if inside else None

    def _look(self, step: int) -> None:
        try:
            changed = self.control.stat().st_mtime_ns
        except OSError:
            return
        if changed == self._seen_ns and time.time_ns() - changed > RECENT_NS:
            return
        self._seen_ns = changed
        try:
            names = os.listdir(self.control)
        except OSError:
            return
        for name in names:
            match = rundir.CHECKPOINT_REQUEST_NAME.match(name)
            if not match or match.group(1) in self._done or match.group(1) in self._pending:
                continue
            data = rundir.read_json(self.control / name)
            if data is None:
                continue
            request = Request.parse(data)
            if request.at_step is not None and step > request.at_step:
                self._done.add(request.id)
                self.answer(
                    request,
                    step,
                    refused=f"worker {self.worker} was at step {step} when the request for "
                    f"step {request.at_step} reached it (a save at different steps "
                    "would leave its peers waiting); ask again",
                )
            else:
                self._pending[request.id] = request

    def answer(self, request: Request, step: int, *, refused: str | None = None) -> None:
        """``step``: the saved checkpoint's step as the layout names it (T5X's absolute step)."""
        if not self.answers:
            return
        # The time: a refusal says where this host was when (the controller's next pick of ``at_step`` starts
        # there).
        data: dict[str, Any] = (
            {"step": step, "refused": refused, "time": time.time()}
            if refused
            else {"step": step, "saved": time.time()}
        )
        rundir.write_json_atomic(
            self.run_dir / rundir.checkpoint_ack(self.attempt, request.id, self.worker), data
        )


def serve(
    requests: CheckpointRequests,
    step: int,
    save: Callable[[int], Any],
    say: Callable[[str], None],
    beat: Callable[[int], None],
) -> None:
    """At a step boundary: a due request saved with ``save(step)`` (the backend's path: on the chief alone, or
    a collective) and answered; with ``stop``, held here until the supervisor stops this trainer."""
    request = requests.due(step)
    if request is None:
        return
    say(f"checkpoint asked for ({request.reason}): saving step {step}")
    save(step)
    requests.answer(request, step)
    if request.stop:
        hold(step, request, say, beat)


def hold(
    step: int,
    request: Request,
    say: Callable[[str], None],
    beat: Callable[[int], None],
    seconds: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    seconds = HOLD_SECONDS if seconds is None else seconds
    say(f"step {step} saved for a stop ({request.reason}): waiting for the supervisor to stop this trainer")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        beat(step)
        sleep(0.5)
    raise SystemExit(
        f"tpuft: this trainer saved step {step} for a stop, but its supervisor did not stop it within "
        f"{seconds:.0f} s"
    )


class Relay:
    """The supervisor's side: each new request of the attempt in run storage goes, once, into its trainer's
    control folder; a request with ``stop`` is watched for the trainer's answer (a local file), on which the
    supervisor stops the trainer as ``tpuft stop`` would (and the chief's supervisor writes the run's stop
    request, so that every worker stops)."""

    def __init__(self, run_dir: Path, worker: int, attempt: int) -> None:
        self.run_dir, self.worker, self.attempt = run_dir, worker, attempt
        self.relayed: set[str] = set()
        self.stops: dict[str, str] = {}
        """id -> reason of the relayed requests with ``stop`` not answered yet."""

    def clear(self) -> None:
        """At the attempt's start: an earlier attempt's relays are not this trainer's to serve."""
        import shutil

        shutil.rmtree(rundir.checkpoint_control(self.run_dir, self.worker), ignore_errors=True)

    def poll(self, storage: Any) -> None:
        """One listing of the attempt's folder in run storage; a read per new request."""
        prefix = f"{rundir.ATTEMPTS_DIR}/{self.attempt}"
        for relpath in storage.list(prefix):
            parent, _, name = relpath.rpartition("/")
            match = rundir.CHECKPOINT_REQUEST_NAME.match(name)
            if parent != prefix or not match or match.group(1) in self.relayed:
                continue
            data = rundir.read_json_text(storage.read_text(relpath))
            if data is None or "id" not in data:
                continue
            rundir.write_json_atomic(rundir.checkpoint_control(self.run_dir, self.worker) / name, data)
            self.relayed.add(match.group(1))
            if data.get("stop"):
                self.stops[str(data["id"])] = str(
                    data.get("reason") or "stopped after an asked-for checkpoint"
                )

    def stop_reason(self) -> str | None:
        """The reason to stop the trainer now: it has saved a checkpoint asked for with ``stop`` (a refusal
        drops the stop: the run goes on, and the controller's wait says why)."""
        for request_id, reason in list(self.stops.items()):
            answer = rundir.read_json(
                self.run_dir / rundir.checkpoint_ack(self.attempt, request_id, self.worker)
            )
            if answer is None:
                continue
            del self.stops[request_id]
            if not answer.get("refused"):
                return reason
        return None
