"""Preemption recovery: watch a run from the controller and bring it back when the infrastructure loses it.

Spot and preemptible TPU VMs are reclaimed; maintenance repairs nodes; a node may come back with new
addresses. The trainers and their supervisors live on the workers, so the only thing that can notice a whole
node going away is a watcher outside it. This one attaches like ``tpuft attach`` and asks the provider about
the node every ``recover.poll`` seconds (a reclaimed VM's connections may hang instead of dropping). When the
node is not READY, is gone, or answers on other addresses, it waits (back-off), recreates the node the way
``create`` does (queued resources included, waiting for capacity), runs ``setup`` again, and resumes the run
from its last complete checkpoint through the resume path: a new attempt, recorded in run.json's
``recoveries``.

What it does not retry: a run that failed on a healthy node (the user's code), a run that was stopped, and
more than ``recover.max_attempts`` recoveries. A watcher holds a lease in the run dir (``watcher.json``,
:mod:`tpuft.ops.watcher_lease`), so two never recreate the same node; one that died (its laptop closed, its
process killed) is taken over by ``tpuft resume RUN --recover`` on any machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuft.backends.base import get_backend
from tpuft.config import ClusterConfig, RecoverConfig, recipe_from_text
from tpuft.core.errors import Interrupted, TpuftError, UsageError
from tpuft.core.records import DOWN_WORKERS, Cluster, Progress, SliceLayout, State
from tpuft.fleet.base import LineSink
from tpuft.ops.cluster import capacity_wait
from tpuft.ops.common import open_session
from tpuft.ops.lifecycle import (
    Launch,
    attach,
    finalize,
    request_stop,
    run_is_alive,
    signal_supervisors,
    stop,
    wait_for_outcome,
)
from tpuft.ops.maintenance import MaintenanceWatch, wait_out_window
from tpuft.ops.setup import setup
from tpuft.ops.train import Notice, TrainResult, finished_result, resume
from tpuft.ops.watcher_lease import WatchTakenOver, watcher_lease
from tpuft.providers import get_provider
from tpuft.readers.runs import Run, resolve_run
from tpuft.run import goodput, rundir
from tpuft.storage.network import CloudUnreachable

CAPACITY_ERRORS = {"ResourceExhausted", "TooManyRequests", "ServiceUnavailable", "InternalServerError"}
"""API refusals that mean "not now" (a zone stocked out, quota busy, the API down): the recovery is tried
again after the next back-off, and the try counts against ``recover.max_attempts``."""


@dataclass
class Callbacks:
    """How the watcher talks to whoever runs it (the CLI renders; tests collect)."""

    on_line: LineSink | None = None
    on_notice: Notice | None = None
    on_progress: Progress | None = None

    def notice(self, text: str) -> None:
        if self.on_notice is not None:
            self.on_notice(text)


def node_problem(
    config: ClusterConfig, info: dict[str, Any], seen: Callable[[Cluster], Any] | None = None
) -> str | None:
    """Why the run's workers are gone, in the provider's words; None while the node is READY on the run's
    addresses. On a multislice cluster the lost slice(s) are named: ``node NAME-1 (slice 1) PREEMPTED``.
    ``seen`` gets the provider's answer too (its health, symptoms and upcoming maintenance:
    :class:`MaintenanceWatch`)."""
    cluster = get_provider(config).get()
    if seen is not None:
        seen(cluster)
    if cluster.state != State.READY:
        lost = lost_slices(cluster)
        if lost:
            return ", ".join(f"node {node} (slice {slice_id}) {state}" for slice_id, node, state in lost)
        problem = cluster.details.get("problem") or cluster.details.get("symptoms")
        return f"node {cluster.state}" + (f" ({problem})" if problem else "")
    hosts = (info.get("launch") or {}).get("hosts") or []
    recorded = info.get("addresses")
    if recorded and hosts:
        now = [cluster.workers[h].address if h < len(cluster.workers) else None for h in hosts]
        if now != recorded:
            return "the workers came back with new addresses"
    return None


def slice_states(cluster: Cluster) -> list[tuple[int, str, str]]:
    """(slice, node id, state) per slice of a multislice cluster, from the provider's ``slice S`` details
    (``"NAME-S STATE"``); empty on one slice."""
    found = []
    for key, value in cluster.details.items():
        label, _, number = key.partition(" ")
        node, _, state = str(value).rpartition(" ")
        if label == "slice" and number.isdigit() and node:
            found.append((int(number), node, state))
    return sorted(found)


def lost_slices(cluster: Cluster) -> list[tuple[int, str, str]]:
    """The slices whose node is not READY (preempted, suspended, gone): any one of them loses the whole
    run."""
    return [entry for entry in slice_states(cluster) if entry[2] != State.READY]


# ----------------------------------------------------------------------------------------------------------
# Watching


def watch(
    config: ClusterConfig,
    run_id: str,
    callbacks: Callbacks,
    *,
    policy: RecoverConfig | None = None,
    stop_on_interrupt: bool = False,
    tail: int | None = None,
    resume_ended: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> TrainResult:
    """Attach to a run and recover it from infrastructure failures until it finishes; returns its summary, or
    raises how it ended otherwise (the user's failure, a stop, recoveries used up). ``resume_ended``: the user
    asked to resume, so a stopped or failed run is resumed first (on a recreated node if its node is gone)."""
    policy = policy or config.recover
    run = resolve_run(config, run_id)
    with watcher_lease(run, policy) as renew:
        outage = _Outage(callbacks, policy.poll)
        while True:
            try:
                info = finalize(run) or run.info()
                outage.over()
                status = info.get("status")
                launch = Launch.of(run, info)
                if (
                    status == "stopped"
                    and not resume_ended
                    and wait_out_window(info, callbacks.notice, renew, policy.poll, sleep, run)
                ):
                    resume_ended = (
                        True  # stopped with a checkpoint before maintenance: resumed now that it is over
                    )
                    continue
                if status == "finished" or (status == "stopped" and not resume_ended):
                    return finished_result(
                        run, info, get_backend(str(info.get("backend"))), len(launch.hosts)
                    )
                problem = node_problem(config, info)
                if problem is None and status in {"failed", "stopped"}:
                    if not resume_ended:  # the user's code failed on a healthy node: not retried
                        return finished_result(
                            run, info, get_backend(str(info.get("backend"))), len(launch.hosts)
                        )
                    resume(config, run.id, on_notice=callbacks.on_notice, detach=True)
                    resume_ended, tail = False, None
                    continue
                if problem is None:  # running (or starting): follow it
                    problem = _attach_and_watch(
                        config, run, info, launch, callbacks, policy, renew, stop_on_interrupt, tail
                    )
                    # Later attempts are followed from their first line; and the resume asked for was of the
                    # run as it stood: an attempt followed here that fails on a healthy node is the user's
                    # code, not retried.
                    tail, resume_ended = None, False
                    if problem is None:
                        continue  # the attempt ended: its outcome decides
                _recover(config, run, info, problem, callbacks, policy, sleep, renew)
                resume_ended, tail = False, None
            except CloudUnreachable as exc:  # the watcher's own network (a laptop waking up): wait it out
                outage.wait(exc, sleep)


class _Outage:
    """The watcher outlives an outage of its own network: a run lasts days, the laptop that watches it sleeps
    and wakes, and one command's ``gcp.timeout`` is no reason to give up recovering a week. Each failed round
    waits a poll and tries again (the lease keeps two watchers apart meanwhile: a watcher away too long finds
    its lease taken over and stops); said once, then every ten minutes, and once more when Google Cloud
    answers again."""

    def __init__(self, callbacks: Callbacks, poll: float) -> None:
        self.callbacks = callbacks
        self.poll = poll
        self.since: float | None = None
        self.said = 0.0

    def wait(self, exc: CloudUnreachable, sleep: Callable[[float], None]) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if now - self.said >= 600.0:
            self.said = now
            self.callbacks.notice(
                f"cannot reach Google Cloud ({exc.message}); the watcher tries again every "
                f"{self.poll:.0f} s (down for {now - self.since:.0f} s)"
            )
        sleep(self.poll)

    def over(self) -> None:
        if self.since is not None:
            self.callbacks.notice(f"Google Cloud answers again after {time.monotonic() - self.since:.0f} s")
            self.since, self.said = None, 0.0


def _attach_and_watch(
    config: ClusterConfig,
    run: Run,
    info: dict[str, Any],
    launch: Launch,
    callbacks: Callbacks,
    policy: RecoverConfig,
    renew: Callable[[], None],
    stop_on_interrupt: bool,
    tail: int | None,
) -> str | None:
    """Follow the attempt until it ends (None) or its workers are gone (the reason)."""

    taken: list[WatchTakenOver] = []
    maintenance = MaintenanceWatch(run, callbacks.notice)

    def question() -> str | None:
        try:
            renew()
        except WatchTakenOver as exc:  # stop following at once (attach treats a failed question as no answer)
            taken.append(exc)
            return "another watcher took over"
        return node_problem(config, info, maintenance.see)

    callbacks.notice(
        f"watching run {run.id} (attempt {info.get('attempt', 1)}) to recover it from preemption"
    )
    session = open_session(config)
    try:
        outcome = attach(
            session, run, launch, callbacks.on_line, tail=tail, watch=question, watch_every=policy.poll
        )
    finally:
        close = getattr(session.fleet, "close", None) if "fleet" in session.__dict__ else None
        if close is not None:
            close()
    if taken:
        raise taken[0]
    gone_without_word = "the workers' supervisors are gone (the VMs restarted?)"
    if outcome.interrupted:
        if stop_on_interrupt and not outcome.hung_up:
            stopped = stop(config, run, reason="interrupted on the controller (Ctrl-C)")
            raise Interrupted(
                f"stopped run {run.id} ({stopped.status})", hint=f"Continue it: tpuft resume {run.id}"
            )
        raise Interrupted(
            f"stopped watching run {run.id}; it goes on without recovery",
            hint=f"Watch and recover it again from any machine: tpuft resume {run.id} --recover",
        )
    if outcome.gone:
        return outcome.gone
    if outcome.ended:
        wait_for_outcome(run)
        if finalize(run) is not None or run_is_alive(run):
            return None
        # The VMs died under the followers (they saw the end before the watch saw the node): the provider's
        # word (node PREEMPTED, ...) says more than "gone", and decides whether the recovery recreates the
        # node.
        problem = question()
        if taken:
            raise taken[0]
        return problem or gone_without_word
    problem = question()
    if taken:
        raise taken[0]
    if problem is None and not run_is_alive(run):
        return gone_without_word
    if problem is None:
        lost = ", ".join(map(str, outcome.lost))
        raise TpuftError(
            f"lost contact with worker(s) {lost} of run {run.id}, but the TPU API says the node is READY",
            hint=f"Look: tpuft monitor {run.id}   Watch again: tpuft resume {run.id} --recover",
        )
    return problem


# ----------------------------------------------------------------------------------------------------------
# Recovering


def _recover(
    config: ClusterConfig,
    run: Run,
    info: dict[str, Any],
    problem: str,
    callbacks: Callbacks,
    policy: RecoverConfig,
    sleep: Callable[[float], None],
    renew: Callable[[], None],
) -> None:
    """Recreate (when the node is not READY), set up and resume; one recovery, recorded in run.json."""
    done = list(info.get("recoveries") or [])
    if len(done) >= policy.max_attempts:
        raise TpuftError(
            f"run {run.id}: {problem}; recover.max_attempts ({policy.max_attempts}) recoveries are used up",
            hint=f"When capacity is back: tpuft resume {run.id} --recover",
        )
    detected = time.time()
    delay = min(policy.backoff * 2 ** len(done), policy.backoff_max)
    attempt = int(info.get("attempt", 1))
    callbacks.notice(
        f"run {run.id}: {problem} (attempt {attempt}); recovery {len(done) + 1} of {policy.max_attempts} "
        f"in {delay:.0f} s"
    )
    try:
        survivors = _stop_survivors(config, run, info, problem, callbacks)
        _sleep_renewing(delay, sleep, renew, policy.poll)
        goodput.record_controller_event(
            run.storage, "recovery_wait", detected, time.time() - detected, attempt + 1
        )
        _wait_final(run, attempt, survivors, sleep)
        # Read after the survivors' last upload: a sync round runs every few seconds, so the bucket can lag
        # the trainers by a checkpoint; the resumed attempt starts from what is there now, and the record says
        # so.
        checkpoint = max(run.layout().checkpoint_steps(run.storage), default=0)
        # The bucket's heartbeats can be older than its newest checkpoint (a sync round uploads checkpoints/
        # before heartbeat/, and the node may die in between): the run reached at least its checkpoint's step.
        last_step = max(run.snapshot().step, checkpoint)
        callbacks.notice(
            f"run {run.id} reached step {last_step}; it resumes from the checkpoint at step {checkpoint}"
        )
        provider = get_provider(config)
        cluster = provider.get()
        recreated = cluster.state != State.READY
        started = time.time()
        if recreated:
            if cluster.state != State.NOT_FOUND:
                callbacks.notice(f"deleting {config.name} ({cluster.state})")
                provider.delete(callbacks.on_progress)
            callbacks.notice(f"recreating {config.name}")
            try:
                provider.create(callbacks.on_progress)
            except TpuftError as exc:
                if not _not_now(exc):
                    raise
                _record(
                    run,
                    {
                        "attempt": attempt,
                        "cause": problem,
                        "detected": detected,
                        "last_step": last_step,
                        "checkpoint_step": checkpoint,
                        "waited_s": round(delay, 1),
                        "recreated": False,
                        "error": exc.message[:500],
                    },
                )
                callbacks.notice(f"could not recreate {config.name} now: {exc.message}")
                return
        renew()
        made = time.time()
        if recreated:
            goodput.record_controller_event(run.storage, "provision", started, made - started, attempt + 1)
            # a recreated queued resource's wait for capacity, inside provisioning
            queued = capacity_wait(provider)
            if queued is not None:
                goodput.record_controller_event(run.storage, "queue_wait", *queued, attempt + 1)
        text = run.storage.read_text(rundir.RECIPE)
        if text is None:
            raise UsageError(f"run {run.id}: {run.url}/{rundir.RECIPE} is missing: it cannot be resumed")
        recipe = recipe_from_text(text, f"{run.url}/{rundir.RECIPE}", check_files=False)
        callbacks.notice(f"setting up {recipe.backend.kind} on the workers of {config.name}")
        setup(config, recipe, on_line=callbacks.on_line)
        renew()
        set_up = time.time()
        record = {
            "attempt": attempt,
            "cause": problem,
            "detected": detected,
            "last_step": last_step,
            "checkpoint_step": checkpoint,
            "steps_lost": max(0, last_step - checkpoint),
            "waited_s": round(delay, 1),
            "recreated": recreated,
            "recreate_s": round(made - started, 1),
            "setup_s": round(set_up - made, 1),
        }
        resume(config, run.id, on_notice=callbacks.on_notice, detach=True, recovery=record)
        _note_back(run, time.time() - detected)
    except KeyboardInterrupt:
        raise Interrupted(
            f"recovery of run {run.id} interrupted; nothing of the run is lost",
            hint=f"Go on with it: tpuft resume {run.id} --recover",
        ) from None
    callbacks.notice(
        f"run {run.id} resumed from step {checkpoint} {time.time() - detected:.0f} s after the failure"
    )


def _stop_survivors(
    config: ClusterConfig, run: Run, info: dict[str, Any], problem: str, callbacks: Callbacks
) -> tuple[int, ...]:
    """A lost slice loses the whole run: the trainers of the slices still READY are stopped at once (they
    would wait on their lost peers, or write to the run dir while the queued resource is recreated), before
    the queued resource is deleted with them. Best effort: the delete ends them anyway, and an unreachable
    survivor reads the stop request the run dir holds for its attempt. Returns the survivors' hosts (none when
    the attempt had already ended)."""
    if info.get("status") != "running":
        return ()
    cluster = get_provider(config).get()
    lost = lost_slices(cluster)
    down = {int(w) for w in str(cluster.details.get(DOWN_WORKERS, "")).split(",") if w.strip().isdigit()}
    if not lost and not down:
        return ()
    layout = SliceLayout(config.slices, config.hosts_per_slice)
    launch = Launch.of(run, info)
    if down:  # the provider names the hosts that went: every other one is a survivor
        survivors = tuple(h for h in launch.hosts if h not in down)
    else:  # a lost slice went whole
        gone = {slice_id for slice_id, _, _ in lost}
        survivors = tuple(h for h in launch.hosts if layout.slice_of(h) not in gone)
    request_stop(run, int(info.get("attempt", 1)), f"{problem}: the whole run restarts")
    if not survivors:
        return ()
    callbacks.notice(
        f"stopping the trainers of the slices still up ({', '.join(layout.name(h) for h in survivors)})"
    )
    if (
        len(cluster.workers) != layout.workers
    ):  # a slice's node is gone: flat indexes no longer match the fleet's
        callbacks.notice("a slice's node is gone; the survivors stop on the run dir's stop request")
        return survivors
    try:
        session = open_session(config, require_ready=False)
        signal_supervisors(session, run, Launch(survivors, launch.python, launch.package))
    except TpuftError as exc:
        callbacks.notice(f"could not stop them now ({exc.message}); the queued resource's deletion ends them")
    return survivors


SURVIVORS_FINAL_S = 45.0
"""How long a recovery waits for the stopped survivors' last upload: their trainers' grace (10 s), a sync
round (15 s) and the upload itself; past it the recovery goes on with what the bucket holds."""


def _wait_final(
    run: Run, attempt: int, survivors: tuple[int, ...], sleep: Callable[[float], None] = time.sleep
) -> None:
    """Until each survivor's supervisor has recorded its end (after uploading its files), at most
    SURVIVORS_FINAL_S."""
    for _ in range(int(SURVIVORS_FINAL_S) if survivors else 0):
        records = rundir.attempt_records(run.storage, attempt)
        if all((records.get(h) or {}).get("final") for h in survivors):
            return
        sleep(1.0)


def _not_now(exc: TpuftError) -> bool:
    """A capacity or availability refusal (try again later), not a mistake in the cluster file or the
    account."""
    return getattr(exc, "kind", "") in CAPACITY_ERRORS or (
        "queued resource" in exc.message and any(word in exc.message for word in ("FAILED", "SUSPENDED"))
    )


def _record(run: Run, recovery: dict[str, Any]) -> None:
    """A recovery that did not get the run back (the node could not be recreated now) still counts and
    shows."""
    info = run.info()
    info["recoveries"] = [*(info.get("recoveries") or []), recovery]
    run.storage.write_text(rundir.RUN_INFO, json.dumps(info, indent=2, sort_keys=True))


def _note_back(run: Run, seconds: float) -> None:
    """The recovery's cost as a user feels it: from noticing the failure to every trainer running again."""
    info = run.info()
    done = list(info.get("recoveries") or [])
    if done:
        done[-1] = {**done[-1], "back_s": round(seconds, 1)}
        run.storage.write_text(
            rundir.RUN_INFO, json.dumps({**info, "recoveries": done}, indent=2, sort_keys=True)
        )


def _sleep_renewing(
    seconds: float, sleep: Callable[[float], None], renew: Callable[[], None], every: float
) -> None:
    """A long back-off keeps the lease alive, so another machine does not take over a watcher that is only
    waiting."""
    left = seconds
    while left > 0:
        step = min(left, every)
        sleep(step)
        left -= step
        renew()


# ----------------------------------------------------------------------------------------------------------
# Entry points


def watch_new_run(
    config: ClusterConfig, started: TrainResult, callbacks: Callbacks, *, stop_on_interrupt: bool = False
) -> TrainResult:
    """``train --recover`` / ``up --recover``: the run was started detached; watch it from its first line."""
    return watch(config, started.run_id, callbacks, stop_on_interrupt=stop_on_interrupt, tail=None)


def resume_and_watch(
    config: ClusterConfig, run_id: str | None, callbacks: Callbacks, *, stop_on_interrupt: bool = False
) -> TrainResult:
    """``resume RUN --recover`` (and ``train --resume RUN --recover``): take over a running run's watch,
    recover a run whose node is gone, or resume a stopped or failed one; then watch it to the end."""
    run = resolve_run(config, run_id)
    info = finalize(run) or run.info()
    if not info:
        raise UsageError(f"run {run.id} has no run.json: it cannot be resumed")
    if info.get("status") == "finished":
        raise UsageError(f"run {run.id} has finished: there is nothing to resume or watch")
    return watch(config, run.id, callbacks, stop_on_interrupt=stop_on_interrupt, resume_ended=True, tail=20)
