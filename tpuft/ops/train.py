"""train and resume: start a run's attempt under the workers' supervisors, then attach to it.

The supervisors (tpuft/worker/supervisor/process.py) keep the run going without this process; they stop every
worker when one fails or hangs, and write the outcome into run.json. This module prepares the workers
(package, venv, a free cluster), writes the run dir, starts the supervisors and, attached, turns the outcome
into a summary or a located error."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.backends.base import Backend, LaunchPlan, get_backend
from tpuft.config import ClusterConfig, Loaded, RecipeConfig, dump_recipe, recipe_from_text
from tpuft.core.errors import Interrupted, TpuftError, UsageError, WorkerFailure
from tpuft.fleet.base import LineSink
from tpuft.ops.common import Session, open_session, raise_on_failure, ship_package, worker_env
from tpuft.ops.doctor import doctor_problems
from tpuft.ops.lifecycle import (
    AttachOutcome,
    Launch,
    attach,
    claim_workers,
    deferred_interrupts,
    finalize,
    run_layout,
    start_supervisors,
    stop,
    wait_for_outcome,
)
from tpuft.ops.preflight import check_against_cluster, preflight
from tpuft.ops.setup import bootstrap_argv, env_spec, launch_plan, tracking_env, venv_python
from tpuft.ops.ship_data import local_only_dataset, recipe_value, remote_fleet, ship_data, shipped_data
from tpuft.ops.trainer_env import launched_slices, trainer_env
from tpuft.readers.runs import Run, resolve_run
from tpuft.run import cost, goodput, rundir
from tpuft.run.cost import RunCost
from tpuft.run.goodput import Goodput
from tpuft.storage import open_storage

Notice = Callable[[str], None]
"""Told what tpuft did besides training (leftovers of dead runs cleaned from the workers)."""


@dataclass
class TrainResult:
    run_id: str
    run_dir: str
    """A folder or a gs:// URL."""
    seconds: float
    workers: int
    last_train: dict[str, Any] = field(default_factory=dict)
    last_eval: dict[str, Any] = field(default_factory=dict)
    test: dict[str, Any] = field(default_factory=dict)
    """The test evaluation's ``test_*`` items (:attr:`tpuft.readers.runs.RunSnapshot.test`); {} without a test
    set."""
    export_dir: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    """The backend's own summary values (``--json``)."""
    rows: list[tuple[str, str]] = field(default_factory=list)
    """... and rows for the summary table."""
    detached: bool = False
    """The run goes on without this process (``--detach``, or Ctrl-C while attached)."""
    attempt: int = 1
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    """The recovery watcher's records (run.json ``recoveries``): cause, steps redone, time to train again."""
    goodput: Goodput | None = None
    """Where the run's wall time went (:func:`tpuft.run.goodput.breakdown`)."""
    cost: RunCost | None = None
    """What the run has cost (:func:`tpuft.run.cost.run_cost`)."""


def _require_venv(session: Session, package: str, recipe: RecipeConfig, plan: LaunchPlan) -> str:
    spec = env_spec(session, recipe)
    argv = bootstrap_argv(session, package, spec, check=True)
    check = session.fleet.run(
        argv, workers=plan.workers, fail_fast=False, env=lambda w: worker_env(session.config)
    )
    missing = [r.index for r in check.results if r.exit_code == 3]
    if missing:
        raise UsageError(
            f"the {recipe.backend.kind} environment is not set up on worker(s) "
            f"{', '.join(map(str, missing))}",
            hint=f"Run: tpuft setup {recipe.name}   (or tpuft up, which sets up before training)",
        )
    raise_on_failure(check, "checking the worker environment")
    return venv_python(session, spec)


def train(
    config: ClusterConfig,
    recipe: Loaded[RecipeConfig],
    *,
    on_line: LineSink | None = None,
    on_start: Any = None,
    on_notice: Notice | None = None,
    checked: bool = False,
    detach: bool = False,
    stop_on_interrupt: bool = False,
    check_fit: bool = False,
) -> TrainResult:
    """Start a new run under the workers' supervisors, then attach to it (unless ``detach``).

    ``checked``: the caller has run :func:`tpuft.ops.preflight.preflight` already (``up`` does, before
    create). Ctrl-C while attached detaches (the run goes on; the result says ``detached``) unless
    ``stop_on_interrupt``. ``check_fit``: compile the step for the cluster's accelerator first, before any
    cloud call, and stop when it does not fit (:func:`tpuft.ops.compile_fit.require_fit`)."""
    if not checked:
        preflight(config, recipe)
    if check_fit:
        from tpuft.ops.compile_fit import require_fit

        fit = require_fit(config, recipe, notice=on_notice)
        if on_notice is not None:
            on_notice(f"check-fit on {fit.accelerator}: {fit.verdict()}")
    session = open_session(config)
    check_against_cluster(recipe, session.shape)
    plan = launch_plan(session, recipe.value)
    launched_slices(session, plan, recipe.value.backend.kind)  # refused before anything is shipped or claimed
    launch = _prepare_workers(session, recipe.value, plan, on_notice)

    run_id = rundir.new_run_id(recipe.value.name)
    run = Run(run_id, str(open_storage(session.cluster.bucket).run_dir(run_id)), config.gcp.project)
    if remote_fleet(session) and local_only_dataset(recipe.value):
        raise UsageError(
            f"{local_only_dataset(recipe.value)}, which the workers cannot read",
            hint="put the files in the bucket (gs://...) or name a hub dataset the workers can download",
        )
    shipped = shipped_data(recipe.value, plan) if remote_fleet(session) else {}
    resolved = ship_data(session, recipe.value, run_id, plan) if shipped else recipe.value
    run.storage.write_text(rundir.RECIPE, dump_recipe(resolved))
    started = time.time()
    info = {
        "run_id": run_id,
        "recipe": recipe.value.name,
        "recipe_file": recipe.source,
        "backend": recipe.value.backend.kind,
        "cluster": config.name,
        "provider": config.provider,
        "accelerator": config.accelerator,
        "workers": len(plan.workers),
        "hosts": len(session.cluster.workers),
        "total_steps": recipe.value.train.steps,
        "started": started,
        "status": "running",
        "attempt": 1,
        "attempts": [{"attempt": 1, "started": started}],
        "launch": launch.as_json(),
        "addresses": _addresses(session, plan),
        **_placement(session, plan),
        **cost.launch_fields(config.accelerator, config.gcp, session.cluster.layout.slices),
        "max_cost": recipe.value.train.max_cost,
        "startup_timeout": recipe.value.train.startup_timeout,
        "shipped_data": shipped,
    }
    _write_info(run, info)
    if on_start is not None:
        on_start(run_id, run.url)
    return _run_attempt(
        session,
        config,
        run,
        recipe.value,
        plan,
        launch,
        info,
        on_line=on_line,
        detach=detach,
        stop_on_interrupt=stop_on_interrupt,
        on_notice=on_notice,
    )


def resume(
    config: ClusterConfig,
    run_id: str | None,
    *,
    on_line: LineSink | None = None,
    on_start: Any = None,
    on_notice: Notice | None = None,
    detach: bool = False,
    stop_on_interrupt: bool = False,
    recovery: dict[str, Any] | None = None,
) -> TrainResult:
    """Continue a stopped or failed run, same id, from its last complete checkpoint (a new attempt).

    ``recovery``: the recovery watcher's record of why (kept in run.json's ``recoveries`` with the new
    attempt). A run that has spent its ``train.max_cost`` is refused (:func:`set_max_cost` raises the
    limit)."""
    run = resolve_run(config, run_id)
    info = run.info()
    if not info:
        raise UsageError(f"run {run.id} has no run.json: it cannot be resumed")
    if info.get("job") == "predict":
        raise UsageError(
            f"run {run.id} is a predict job: it continues with the command that started it and --resume",
            hint=f"{(info.get('predict') or {}).get('command', 'tpuft predict ...')} --resume",
        )
    if info.get("status") == "finished" and not ended_by_time_limit(run):
        raise UsageError(
            f"run {run.id} has finished: there is nothing to resume",
            hint=f"Train longer in a new run: tpuft train {info.get('recipe')} --set train.steps=...",
        )
    cost.check_budget(run.id, info, None)
    previous = Launch.of(run, info)
    text = run.storage.read_text(rundir.RECIPE)
    if text is None:
        raise UsageError(f"run {run.id}: {run.url}/{rundir.RECIPE} is missing: it cannot be resumed")
    recipe = recipe_from_text(text, f"{run.url}/{rundir.RECIPE}", check_files=False)
    session = open_session(config)
    check_against_cluster(Loaded(recipe, f"{run.url}/{rundir.RECIPE}", {}), session.shape)
    plan = launch_plan(session, recipe)
    if tuple(plan.workers) != previous.hosts:
        raise UsageError(
            f"run {run.id} trained on worker(s) {list(previous.hosts)}; this cluster would launch it on "
            f"{list(plan.workers)}: resume it on a cluster of the same shape"
        )
    launched_slices(session, plan, recipe.backend.kind)
    launch = _prepare_workers(session, recipe, plan, on_notice, resuming=run.id)
    for key, local in (info.get("shipped_data") or {}).items():  # a recreated worker has lost its copy
        worker_paths = recipe_value(recipe, key)
        pairs = zip(local, worker_paths) if isinstance(local, list) else [(local, worker_paths)]
        for here, there in pairs:
            if there is not None and Path(here).is_file():
                session.fleet.put(Path(here), str(there), workers=plan.workers)
    attempt = int(info.get("attempt", 1)) + 1
    now = time.time()
    attempts = list(info.get("attempts") or [])
    if (
        attempts and "ended" not in attempts[-1]
    ):  # its supervisors died without a last word (the VM went away)
        attempts[-1] = {**attempts[-1], "ended": now, "status": "lost"}
    info = {k: v for k, v in info.items() if k not in {"cause", "culprit", "culprit_tail", "ended"}}
    entry: dict[str, Any] = {"attempt": attempt, "started": now, "resumed": True}
    if recovery is not None:
        recovery = {**recovery, "resumed_attempt": attempt, "resumed": now}
        info["recoveries"] = [*(info.get("recoveries") or []), recovery]
        entry["recovery"] = recovery.get("cause")
    info.update(
        status="running",
        attempt=attempt,
        launch=launch.as_json(),
        addresses=_addresses(session, plan),
        attempts=[*attempts, entry],
        startup_timeout=recipe.train.startup_timeout,
        **_placement(session, plan),
    )
    _write_info(run, info)
    if on_start is not None:
        on_start(run.id, run.url)
    return _run_attempt(
        session,
        config,
        run,
        recipe,
        plan,
        launch,
        info,
        on_line=on_line,
        detach=detach,
        stop_on_interrupt=stop_on_interrupt,
        resume=True,
        on_notice=on_notice,
    )


def attach_run(
    config: ClusterConfig,
    run_id: str | None,
    *,
    on_line: LineSink | None = None,
    tail: int | None = None,
    since: str | None = None,
    stop_on_interrupt: bool = False,
    on_notice: Notice | None = None,
) -> TrainResult:
    """Re-attach to a run (the latest by default): its workers' last lines, then live until it ends; then its
    summary, or the error that says how it ended. A run that has ended already gives that at once.
    ``on_notice`` hears the start-up's waiting lines while some trainers are not up yet."""
    run = resolve_run(config, run_id)
    info = finalize(run) or run.info()
    launch = Launch.of(run, info)
    backend = get_backend(str(info.get("backend")))
    if info.get("status") != "running":
        return finished_result(run, info, backend, len(launch.hosts))
    session = open_session(config)
    outcome = attach(session, run, launch, on_line, tail=tail, since=since, on_notice=on_notice)
    return _after_attach(
        config, run, launch, backend, outcome, stop_on_interrupt, int(info.get("attempt", 1))
    )


def _prepare_workers(
    session: Session,
    recipe: RecipeConfig,
    plan: LaunchPlan,
    on_notice: Notice | None,
    resuming: str | None = None,
) -> Launch:
    """Ship tpuft, check the venv, and claim the workers (refused when another run lives there)."""
    package = ship_package(session, plan.workers)
    python = _require_venv(session, package, recipe, plan)
    launch = Launch(tuple(plan.workers), python, package)
    try:
        cleaned = claim_workers(session, launch, free_tpu=session.shape.target == "tpu")
    except UsageError as exc:
        if resuming and resuming in exc.message:
            raise UsageError(
                f"run {resuming} is still running", hint=f"Watch it: tpuft attach {resuming}"
            ) from None
        raise
    for line in cleaned:
        if on_notice is not None:
            on_notice(f"cleaned {line}")
    # After the claim: leftovers of a dead run on these workers (a held port, the chips) are gone by now.
    problems = doctor_problems(session, recipe)
    if problems:
        raise TpuftError(
            "the workers are not ready for this run:\n" + "\n".join(f"  {p}" for p in problems),
            hint=f"Every check, worker by worker: tpuft doctor {recipe.name}",
        )
    return launch


def _addresses(session: Session, plan: LaunchPlan) -> list[str]:
    """The launched workers' addresses: a node that comes back READY with other ones has been replaced."""
    return [session.cluster.workers[i].address for i in plan.workers]


def _placement(session: Session, plan: LaunchPlan) -> dict[str, Any]:
    """run.json's ``slices`` and, per launched worker (rank order, as ``addresses``), its slice and host in
    the slice (a run.json without them is a single-slice run's). A plan that leaves hosts out of several
    slices never gets here: :func:`launched_slices` refused it."""
    layout = session.cluster.layout
    return {
        "slices": layout.slices,
        "placement": [{"slice": layout.slice_of(i), "host": layout.host_of(i)} for i in plan.workers],
    }


def set_max_cost(config: ClusterConfig, run_id: str | None, max_cost: float) -> None:
    """``tpuft resume --max-cost``: the run's new ``train.max_cost`` in run.json, where its chief's supervisor
    reads it at the next attempt's start (refused when the run has spent that much already)."""
    run = resolve_run(config, run_id)
    _write_info(run, cost.check_budget(run.id, run.info(), max_cost))


def ended_by_time_limit(run: Run) -> bool:
    """The run finished because its ``train.time_limit`` was spent (its chief's last heartbeat says so): a
    resume with a new limit continues it."""
    return (rundir.read_heartbeat(run.storage, 0) or {}).get("ended") == "time_limit"


def set_time_limit(config: ClusterConfig, run_id: str | None, seconds: float | None) -> None:
    """``tpuft resume --time-limit``: the run's recipe (its run dir's resolved ``recipe.yaml``, which the
    resume launches) gets the new ``train.time_limit``; None: no limit. Each attempt gets the whole limit."""
    run = resolve_run(config, run_id)
    text = run.storage.read_text(rundir.RECIPE)
    if text is None:
        raise UsageError(f"run {run.id}: {run.url}/{rundir.RECIPE} is missing: it cannot be resumed")
    recipe = recipe_from_text(text, f"{run.url}/{rundir.RECIPE}", check_files=False)
    train = recipe.train.model_copy(update={"time_limit": seconds})
    run.storage.write_text(rundir.RECIPE, dump_recipe(recipe.model_copy(update={"train": train})))


def _write_info(run: Run, info: dict[str, Any], **changes: Any) -> None:
    """run.json: what the run is, and (once it ends) how it ended."""
    run.storage.write_text(rundir.RUN_INFO, json.dumps({**info, **changes}, indent=2, sort_keys=True))


def _run_attempt(
    session: Session,
    config: ClusterConfig,
    run: Run,
    recipe: RecipeConfig,
    plan: LaunchPlan,
    launch: Launch,
    info: dict[str, Any],
    *,
    on_line: LineSink | None,
    detach: bool,
    stop_on_interrupt: bool,
    resume: bool = False,
    on_notice: Notice | None = None,
) -> TrainResult:
    attempt = int(info["attempt"])
    launching = time.time()
    try:
        # The tracker venv (report.to) may take minutes to build the first time: before the block a Ctrl-C
        # cannot cut short, which is for starting the supervisors only.
        tracking = tracking_env(session, recipe, launch.package)
        with (
            deferred_interrupts() as deferred
        ):  # half-started supervisors must not be left behind by a Ctrl-C
            env = {**trainer_env(session, config, plan, resume, recipe.backend.kind), **tracking}
            start_supervisors(
                session,
                run,
                launch,
                env,
                attempt=attempt,
                hang_timeout=recipe.train.hang_timeout,
                startup_timeout=recipe.train.startup_timeout,
                argv=(launch.python, *plan.argv),
                free_tpu=session.shape.target == "tpu",
            )
        # its create and setup
        goodput.adopt_cluster_events(session.provider.state_dir(), run.storage, attempt)
        goodput.record_controller_event(run.storage, "launch", launching, time.time() - launching, attempt)
    except BaseException as exc:  # nothing trains: the run must not say `running` forever
        cause = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        if finalize(run) is None:  # no outcome from the supervisors (none started, or not all of them ended)
            _write_info(run, run.info() or info, status="failed", ended=time.time(), cause=cause[:2000])
        raise
    backend = get_backend(recipe.backend.kind)
    if detach:
        return TrainResult(run.id, run.url, 0.0, len(plan.workers), detached=True, attempt=attempt)
    if deferred.fired:  # Ctrl-C or SIGHUP while the supervisors started: acted on now that they all run
        outcome = AttachOutcome(ended=False, interrupted=True, hung_up=deferred.hung_up)
    else:
        outcome = attach(session, run, launch, on_line, on_notice=on_notice)
    return _after_attach(config, run, launch, backend, outcome, stop_on_interrupt, attempt)


def _after_attach(
    config: ClusterConfig,
    run: Run,
    launch: Launch,
    backend: Backend,
    outcome: AttachOutcome,
    stop_on_interrupt: bool,
    attempt: int,
) -> TrainResult:
    launched = len(launch.hosts)
    if outcome.interrupted:
        if stop_on_interrupt and not outcome.hung_up:
            stopped = stop(config, run, reason="interrupted on the controller (Ctrl-C)")
            raise Interrupted(
                f"stopped run {run.id} on {launched} worker(s) ({stopped.status})",
                hint=f"Continue it: tpuft resume {run.id}",
            )
        return TrainResult(run.id, run.url, 0.0, launched, detached=True, attempt=attempt)
    if outcome.lost:
        layout = run_layout(run.info())
        lost = ", ".join(
            layout.name(launch.hosts.index(i)) if i in launch.hosts else f"worker {i}" for i in outcome.lost
        )
        raise TpuftError(
            f"lost contact with {lost} of run {run.id}; their supervisors may still be training",
            hint=f"Look: tpuft monitor {run.id}   Re-attach: tpuft attach {run.id}",
        )
    return finished_result(run, wait_for_outcome(run), backend, launched)


def finished_result(run: Run, info: dict[str, Any], backend: Backend, launched: int) -> TrainResult:
    """The summary of an attempt that has ended, or the error that says how it did not finish."""
    status = info.get("status")
    if status == "failed":
        lines = [f"training run {run.id} failed: {info.get('cause', 'see the logs')}"]
        records = rundir.attempt_records(run.storage, int(info.get("attempt", 1)))
        stopped = sorted(w for w, r in records.items() if r.get("status") == "stopped")
        if stopped:
            lines.append(f"stopped the other worker(s): {', '.join(map(str, stopped))}")
        culprit = info.get("culprit")
        tail = info.get("culprit_tail") or []
        if tail:
            lines.append(f"last lines of {run_layout(info).name(int(culprit or 0))}:")
            lines += ["  " + line for line in tail]
        if culprit is not None:
            lines.append(f"full log: {run.url}/{rundir.LOGS_DIR}/worker-{culprit}.log")
        lines.append(f"run dir: {run.url}")
        raise WorkerFailure(
            "\n".join(lines), hint=f"Fix it, then continue from the last checkpoint: tpuft resume {run.id}"
        )
    if status == "stopped":
        raise TpuftError(
            f"run {run.id} was stopped: {info.get('cause', '')}", hint=f"Continue it: tpuft resume {run.id}"
        )
    if status != "finished":
        raise TpuftError(
            f"run {run.id}: every worker's supervisor has ended but the run has no outcome yet ({status})",
            hint=f"Look: tpuft monitor {run.id}",
        )
    return summarize(
        run, backend, float(info.get("seconds") or 0.0), launched, attempt=int(info.get("attempt", 1))
    )


def summarize(run: Run, backend: Backend, seconds: float, launched: int, attempt: int = 1) -> TrainResult:
    """What ``train`` reports, from the run's own snapshot (the same reading ``monitor`` shows) and what the
    backend adds (the PyTorch/XLA one: whether every replica ended with the same weights)."""
    snap = run.snapshot()
    extras, rows = backend.summarize(snap.outcome, launched)
    exported = run.storage.exists(f"{rundir.EXPORT_HF}/config.json")
    return TrainResult(
        run_id=run.id,
        run_dir=run.url,
        seconds=seconds,
        workers=launched,
        last_train=snap.last_train,
        last_eval=snap.last_eval,
        test=snap.test,
        export_dir=f"{run.url}/{rundir.EXPORT_HF}" if exported else None,
        extras=extras,
        rows=rows,
        attempt=attempt,
        recoveries=list(snap.info.get("recoveries") or []),
        goodput=goodput.breakdown(run.storage, snap.info),
        cost=cost.run_cost(snap.info),
    )
