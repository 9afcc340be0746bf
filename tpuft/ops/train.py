"""train: launch the backend's trainer on every worker, stream their logs, stop all on the first failure."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft import rundir
from tpuft.backends import get_backend
from tpuft.backends.base import Backend, LaunchPlan
from tpuft.config import ClusterConfig, Loaded, RecipeConfig, dump_recipe
from tpuft.errors import UsageError, WorkerFailure
from tpuft.fleet.base import FleetResult, LineSink
from tpuft.ops.common import Session, on_worker, open_session, raise_on_failure, ship_package
from tpuft.ops.logs import LIVE_MARKER
from tpuft.ops.preflight import check_against_cluster, preflight
from tpuft.ops.setup import bootstrap_argv, env_spec, launch_plan, venv_python
from tpuft.ports import free_port
from tpuft.records import Worker
from tpuft.runs import Run
from tpuft.storage import open_storage
from tpuft.storage.sync import RunDirSync

COORDINATOR_PORT = 8476


@dataclass
class TrainResult:
    run_id: str
    run_dir: str
    """A folder or a gs:// URL."""
    seconds: float
    workers: int
    last_train: dict[str, Any] = field(default_factory=dict)
    last_eval: dict[str, Any] = field(default_factory=dict)
    export_dir: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    """The backend's own summary values (``--json``)."""
    rows: list[tuple[str, str]] = field(default_factory=list)
    """... and rows for the summary table."""


def _coordinator_port(host: str) -> int:
    """Worker 0's rendezvous port: a free one when the workers share this machine (a local pod, a loopback rig),
    the fixed one on real hosts (nothing else listens there)."""
    return free_port() if host in {"localhost", "127.0.0.1"} else COORDINATOR_PORT


def _require_venv(session: Session, package: str, recipe: RecipeConfig, plan: LaunchPlan) -> str:
    spec = env_spec(session, recipe)
    check = session.fleet.run(bootstrap_argv(session, package, spec, check=True), workers=plan.workers, fail_fast=False)
    missing = [r.index for r in check.results if r.exit_code == 3]
    if missing:
        raise UsageError(
            f"the {recipe.backend.kind} environment is not set up on worker(s) {', '.join(map(str, missing))}",
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
    checked: bool = False,
) -> TrainResult:
    """``checked``: the caller has run :func:`tpuft.ops.preflight.preflight` already (``up`` does, before create)."""
    if not checked:
        preflight(config, recipe)
    session = open_session(config)
    check_against_cluster(recipe, session.shape)
    plan = launch_plan(session, recipe.value)
    package = ship_package(session, plan.workers)
    python = _require_venv(session, package, recipe.value, plan)

    run_id = rundir.new_run_id(recipe.value.name)
    run = Run(run_id, str(open_storage(session.cluster.bucket).run_dir(run_id)), config.gcp.project)
    live_logs = run.mirror / rundir.LOGS_DIR  # a bucket run's worker logs land here first, as they arrive
    live_logs.mkdir(parents=True, exist_ok=True)
    if run.remote:
        (live_logs / LIVE_MARKER).touch()
    resolved = _ship_data(session, recipe.value, run_id, plan) if _remote_fleet(session) else recipe.value
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
    }
    _write_info(run, info)
    if on_start is not None:
        on_start(run_id, run.url)

    try:
        result = _launch(session, config, plan, package, python, run, on_line)
    except BaseException as exc:  # nothing ran to the end: the run must not say `running` forever
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        cause = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        _write_info(run, info, status=status, ended=time.time(), cause=cause[:2000])
        raise
    seconds = time.time() - started
    status = "interrupted" if result.interrupted else "finished" if result.ok else "failed"
    _write_info(run, info, status=status, ended=time.time(), seconds=round(seconds, 1))
    try:
        raise_on_failure(result, f"training run {run_id}")
    except WorkerFailure as failure:
        raise WorkerFailure(f"{failure.message}\nrun dir: {run.url}") from None
    return summarize(run, get_backend(recipe.value.backend.kind), seconds, len(result.results))


def _write_info(run: Run, info: dict[str, Any], **changes: Any) -> None:
    """run.json: what the run is, and (once it ends) how it ended."""
    run.storage.write_text(rundir.RUN_INFO, json.dumps({**info, **changes}, indent=2, sort_keys=True))


def _launch(
    session: Session,
    config: ClusterConfig,
    plan: LaunchPlan,
    package: str,
    python: str,
    run: Run,
    on_line: LineSink | None,
) -> FleetResult:
    """Start the trainer on the plan's workers and supervise it until every one has ended. Worker ids and the
    worker count are positions in the plan, so a backend that launches on some hosts only shards data among those."""
    workers = session.cluster.workers
    first = workers[plan.workers[0]]
    coordinator_host = first.internal_address or first.address
    coordinator = f"{coordinator_host}:{_coordinator_port(coordinator_host)}"
    rank = {index: position for position, index in enumerate(plan.workers)}
    common_env = {
        **config.worker_env,
        "TPUFT_RUN_ID": run.id,
        "TPUFT_RUN_DIR": run.url,
        "TPUFT_NUM_WORKERS": str(len(plan.workers)),
        "TPUFT_COORDINATOR": coordinator.replace("localhost", "127.0.0.1"),
        **plan.env,
    }

    def env_for(worker: Worker) -> dict[str, str]:
        return {
            **common_env,
            "TPUFT_WORKER_ID": str(rank[worker.index]),
            "PYTHONPATH": on_worker(session, worker.index, package),
            "PYTHONUNBUFFERED": "1",
        }

    # Worker output streams to this process over SSH; a bucket run gets the logs every 15 s too, so that
    # `tpuft logs -f` and `tpuft monitor` on another machine see them while the run trains.
    logs = run.mirror / rundir.LOGS_DIR
    log_sync = RunDirSync(logs, open_storage(f"{run.url}/{rundir.LOGS_DIR}", project=run.project)).start() if run.remote else None
    try:
        return session.fleet.run(
            [python, *plan.argv],
            env=env_for,
            workers=plan.workers,
            log_dir=logs,
            on_line=on_line,
            log_timestamps=True,
        )
    finally:
        if log_sync is not None:
            log_sync.close()


def _remote_fleet(session: Session) -> bool:
    """Workers on other machines (SSH) cannot read the controller's files: the data has to be shipped."""
    return any(w.home is None for w in session.cluster.workers)


def _ship_data(session: Session, recipe: RecipeConfig, run_id: str, plan: LaunchPlan) -> RecipeConfig:
    """Copy the recipe's data files that the plan names to its workers; point the recipe at the copies (HOME-relative)."""
    folder = f".tpuft/data/{run_id}"
    updates: dict[str, Path] = {}
    for key in plan.ship:
        path = getattr(recipe.data, key)
        if path is None:
            continue
        remote = f"{folder}/{key}-{path.name}"
        session.fleet.put(path, remote, workers=plan.workers)
        updates[key] = Path(remote)
    return recipe.model_copy(update={"data": recipe.data.model_copy(update=updates)})


def summarize(run: Run, backend: Backend, seconds: float, launched: int) -> TrainResult:
    """What ``train`` reports, from the run's own snapshot (the same reading ``monitor`` shows) and what the backend
    adds (the PyTorch/XLA one: whether every replica ended with the same weights)."""
    snap = run.snapshot()
    extras, rows = backend.summarize(snap, launched)
    exported = run.storage.exists(f"{rundir.EXPORT_HF}/config.json")
    return TrainResult(
        run_id=run.id,
        run_dir=run.url,
        seconds=seconds,
        workers=launched,
        last_train=snap.last_train,
        last_eval=snap.last_eval,
        export_dir=f"{run.url}/{rundir.EXPORT_HF}" if exported else None,
        extras=extras,
        rows=rows,
    )
