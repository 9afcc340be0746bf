"""Checkpoints on demand, from the controller: ask a running run's trainers to save now, and wait until that
checkpoint is complete in run storage (``tpuft checkpoint``, ``tpuft stop --checkpoint``, a maintenance
notice, a cost limit).

The ask is a file in the run dir (``attempts/<n>/checkpoint-<id>.json``), like a stop request: it reaches
every worker, even one this machine cannot reach, because each supervisor polls the run dir and relays it to
its trainer (``tpuft/worker/supervisor/supervision.py``). The trainers save through their backend's normal
save path at a step boundary and acknowledge; the wait ends when the layout's manifest check finds the step's
checkpoint complete in run storage (for a bucket run that includes the run-dir sync's upload), which is what a
resume would restore.

On several hosts every process must save at the same step (T5X's save is a collective), so the request names
``at_step``: the freshest heartbeat step plus the steps the run makes while the request travels (the
supervisors' control poll and, on a bucket, the heartbeat's sync lag) at its measured speed. A host that has
already passed that step when the request reaches it refuses it (``tpuft/worker/ondemand.py``): no host waits
in a save its peers never start, and the wait here says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuft.core.errors import TpuftError, UsageError
from tpuft.core.safe_yaml import resolved_section
from tpuft.core.waiting import waiting
from tpuft.readers.runs import Run
from tpuft.run import rundir
from tpuft.run.goodput import record_controller_event
from tpuft.storage.sync import SYNC_SECONDS

RELAY_SLACK_SECONDS = 3.0
"""Beyond the control poll: the supervisor's read of the request and the write of its relay."""


class CheckpointTimeout(TpuftError):
    """The checkpoint was not complete in time (exit code 1): names the workers that had not acknowledged."""


class CheckpointRefused(TpuftError):
    """The trainers refused the request (a host had passed ``at_step``; the run ended first)."""


@dataclass(frozen=True)
class CheckpointDone:
    id: str
    step: int
    path: str
    """The checkpoint's run url (``<run dir>/checkpoints/step-120``)."""
    asked: float
    complete: float
    """When this machine found it complete in run storage (unix seconds)."""
    latency_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "step": self.step,
            "path": self.path,
            "asked": self.asked,
            "complete": self.complete,
            "latency_s": round(self.latency_s, 2),
        }


def _running_attempt(run: Run) -> tuple[dict[str, Any], int]:
    info = run.info()
    if info.get("status") != "running":
        status = info.get("status") or "unknown (no run.json)"
        raise UsageError(
            f"run {run.id} is not running (status: {status}): there is no trainer to ask for a checkpoint",
            hint=f"See it: tpuft monitor {run.id} --once   Continue it: tpuft resume {run.id}",
        )
    if info.get("job") == "predict":
        raise UsageError(f"run {run.id} is a predict job: it has no checkpoints to save")
    return info, int(info.get("attempt", 1))


def request_checkpoint(run: Run, *, reason: str, stop: bool = False, at_step: int | None = None) -> str:
    """Write the request and return its id (``<unix_ms>``). On several hosts, with no ``at_step`` given, one
    is picked (:func:`pick_at_step`) so that every process saves at the same step."""
    info, attempt = _running_attempt(run)
    now = time.time()
    request_id = str(int(now * 1000))
    if at_step is None and int(info.get("workers") or 1) > 1:
        at_step = pick_at_step(run, info, now)
    request = {"id": request_id, "time": now, "reason": reason, "at_step": at_step, "stop": stop}
    run.storage.write_text(rundir.checkpoint_request(attempt, request_id), json.dumps(request))
    return request_id


def pick_at_step(run: Run, info: dict[str, Any], now: float) -> int:
    """The freshest heartbeat's step, advanced by what the run trains until the heartbeat is read here (its
    age) and until every supervisor has relayed the request (poll, slack, and a bucket's sync lag), at the
    speed the heartbeat reports (``examples_per_s`` over the recipe's batch), plus a margin, rounded up to a
    multiple of ``train.log_every`` (:func:`tpuft.run.rundir.checkpoint_at_step`). A refusal of an earlier
    request of the attempt (its host's step and time) is a fresher point than a bucket's heartbeat, and the
    steps between two points over their seconds a truer speed than an early heartbeat's, whose window may hold
    the compilation: so an ask after a refusal does not name a step already passed again."""
    attempt = int(info.get("attempt", 1))
    beats = [b for w in range(int(info.get("workers") or 1)) if (b := rundir.read_heartbeat(run.storage, w))]
    points = [
        (int(b.get("step") or 0), float(b["time"])) for b in beats if isinstance(b.get("time"), (int, float))
    ]
    points += _refusal_points(run, attempt)
    train = _recipe_train(run)
    step, steps_per_s, travel = 0, 0.0, 0.0
    if beats or points:
        step, seen = max(points) if points else (0, now)
        freshest = (
            max(beats, key=lambda b: (int(b.get("step") or 0), float(b.get("time") or 0.0))) if beats else {}
        )
        batch, rate = float(train.get("batch_size") or 0), float(freshest.get("examples_per_s") or 0.0)
        steps_per_s = rate / batch if batch > 0 and rate > 0 else 0.0
        steps_per_s = max(
            [steps_per_s] + [(step - s) / (seen - t) for s, t in points if seen - t >= 2.0 and step > s]
        )
        poll = 2.5 if run.remote else 0.5
        travel = max(0.0, now - seen) + poll + RELAY_SLACK_SECONDS
        travel += SYNC_SECONDS if run.remote else 0.0  # how stale a bucket run's heartbeat can be
    return rundir.checkpoint_at_step(step, steps_per_s, travel, int(train.get("log_every") or 1))


def _refusal_points(run: Run, attempt: int) -> list[tuple[int, float]]:
    """(step, time) of each refusal the attempt's trainers wrote (one listing)."""
    return [
        (int(answer["step"]), float(answer["time"]))
        for answers in rundir.checkpoint_answers(run.storage, attempt).values()
        for answer in answers.values()
        if answer.get("refused")
        and isinstance(answer.get("time"), (int, float))
        and isinstance(answer.get("step"), int)
    ]


def _recipe_train(run: Run) -> dict[str, Any]:
    return resolved_section(run.storage.read_text(rundir.RECIPE), "train")


def request_state(run: Run, attempt: int, request_id: str) -> dict[str, Any] | None:
    return rundir.read_json_text(run.storage.read_text(rundir.checkpoint_request(attempt, request_id)))


def acks(run: Run, attempt: int, request_id: str) -> dict[int, dict[str, Any]]:
    """worker -> its trainer's answer to the request (one listing of the attempt's folder)."""
    return rundir.checkpoint_answers(run.storage, attempt, request_id).get(request_id, {})


def wait_checkpoint(
    run: Run,
    request_id: str,
    timeout: float,
    *,
    sleep: Callable[[float], None] = time.sleep,
    poll: float | None = None,
) -> CheckpointDone:
    """Until the chief has acknowledged and the layout's manifest check finds that step's checkpoint complete
    in run storage; then the ``checkpoint_ask`` event (the goodput timeline's marker, with the latency). A
    refusal, a run that ends first, or ``timeout`` raise, naming the workers without an answer."""
    info = run.info()
    attempt = int(info.get("attempt", 1))
    request = request_state(run, attempt, request_id)
    if request is None:
        raise UsageError(f"run {run.id} has no checkpoint request {request_id} in attempt {attempt}")
    workers = int(info.get("workers") or 1)
    asked = float(request["time"])
    poll = poll if poll is not None else (2.0 if run.remote else 0.25)
    chief: dict[str, Any] | None = None
    with waiting(f"the checkpoint that run {run.id} was asked for ({request['reason']})", timeout) as wait:
        while True:
            answers = acks(run, attempt, request_id) if chief is None else {0: chief}
            chief = answers.get(0)
            if chief is not None and chief.get("refused"):
                raise CheckpointRefused(f"run {run.id} refused the checkpoint: {chief['refused']}")
            if chief is not None:
                step = int(chief["step"])
                layout = run.layout()
                names = layout.checkpoint_steps(run.storage)
                if step in names:
                    complete = time.time()
                    path = f"{run.url.rstrip('/')}/{layout.checkpoints}/{names[step]}"
                    record_controller_event(
                        run.storage,
                        "checkpoint_ask",
                        asked,
                        complete - asked,
                        attempt,
                        id=request_id,
                        at_step=request.get("at_step"),
                        step=step,
                        latency_s=round(complete - asked, 2),
                        reason=request.get("reason"),
                    )
                    return CheckpointDone(request_id, step, path, asked, complete, complete - asked)
            if run.info().get("status") != "running" and chief is None:
                raise CheckpointRefused(
                    f"run {run.id} ended ({run.info().get('status')}) before its trainers saved the "
                    "checkpoint"
                )
            if wait.expired():
                missing = [w for w in range(workers) if w not in answers] if chief is None else []
                who = (
                    f"worker(s) {', '.join(map(str, missing))} did not acknowledge"
                    if missing
                    else f"the chief saved step {chief['step'] if chief else '?'} but it was not complete in "
                    "run storage"
                )
                raise CheckpointTimeout(
                    f"run {run.id}: no complete checkpoint {timeout:.0f} s after the ask: {who}"
                )
            sleep(poll)
