"""setup: build the backend's venv on every worker, in parallel, cached by a hash of its requirements.

The bootstrap runs with the cluster file's ``worker_env`` (a private index's ``PIP_INDEX_URL``, a token), sent
as every worker process gets it (:func:`tpuft.ops.common.worker_env`): never on a command line."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuft.backends.base import EnvSpec, LaunchPlan, get_backend
from tpuft.config import ClusterConfig, RecipeConfig
from tpuft.config.tracking_env import PYTHON_ENV, tracking_spec
from tpuft.fleet.base import LineSink
from tpuft.ops.common import Session, open_session, raise_on_failure, ship_package, worker_env
from tpuft.run import goodput

BOOTSTRAP = "tpuft/host/bootstrap.py"
SOURCES_HOME = ".tpuft/sources"
"""Under each remote worker's HOME: one folder per ``sources_digest`` holding the shipped
``local_sources``."""


@dataclass
class SetupResult:
    backend: str
    venv: str
    seconds: float
    workers: int


def env_spec(session: Session, recipe: RecipeConfig) -> EnvSpec:
    backend = get_backend(recipe.backend.kind)
    return backend.env_spec(recipe.backend, session.shape.target, session.provider.python())


def launch_plan(session: Session, recipe: RecipeConfig) -> LaunchPlan:
    """Which workers run the recipe's trainer: where ``setup`` installs and where ``train`` launches."""
    return get_backend(recipe.backend.kind).plan(recipe, session.shape)


def bootstrap_argv(
    session: Session,
    package: str,
    spec: EnvSpec,
    *,
    check: bool = False,
    no_deps: tuple[str, ...] | None = None,
) -> list[str]:
    """``no_deps``: what :func:`ship_sources` returned (the shipped copies), None for the spec's own
    entries."""
    payload = json.dumps(spec.payload(no_deps))
    argv = [
        spec.python,
        f"{package}/{BOOTSTRAP}",
        "--cache",
        session.provider.venv_cache(),
        "--spec",
        payload,
    ]
    return argv + (["--check"] if check else [])


def ship_sources(session: Session, spec: EnvSpec, workers: Sequence[int]) -> tuple[str, ...] | None:
    """Copy each of ``spec.local_sources`` (wheels, a checkout) to workers that cannot read this machine's
    disk, into a folder named by their content digest, and return ``spec.no_deps`` naming the copies as
    ``~/.tpuft/sources/<digest>/<name>`` (the bootstrap expands ``~/`` with the worker's HOME, whatever its
    working directory). None when every worker reads the local paths itself (the local pod). A fleet is all
    local or all remote; were it mixed, every worker would get the copies, so that one argv serves all."""
    homes = {worker.index: worker.home for worker in session.cluster.workers}
    if not spec.local_sources or all(homes[index] is not None for index in workers):
        return None
    folder = f"{SOURCES_HOME}/{spec.sources_digest or spec.key}"
    shipped = {}
    with tempfile.TemporaryDirectory() as tmp:
        for source in spec.local_sources:
            path = Path(source)
            if path.is_dir():  # a checkout: its git history is not needed to install it
                staged = Path(tmp) / path.name
                shutil.copytree(path, staged, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
                path = staged
            session.fleet.put(path, f"{folder}/{path.name}", workers=workers)
            shipped[source] = f"~/{folder}/{path.name}"
    return tuple(shipped.get(entry, entry) for entry in spec.no_deps)


def venv_python(session: Session, spec: EnvSpec) -> str:
    return f"{session.provider.venv_cache()}/{spec.key}/bin/python"


def tracking_env(
    session: Session, recipe: RecipeConfig, package: str, *, on_line: LineSink | None = None
) -> dict[str, str]:
    """The tracker sidecar's venv (wandb, mlflow), built or found on the chief only, when ``report.to`` names
    a tracker the sidecar feeds: ``{TPUFT_TRACKING_PYTHON: its python}`` for the chief's supervisor; {}
    otherwise. A venv of its own, so the trackers' packages never meet the backend's pins
    (tpuft/config/tracking_env.py)."""
    if not recipe.report.trackers:
        return {}
    spec = tracking_spec(session.provider.python())
    chief = launch_plan(session, recipe).workers[:1]
    argv = bootstrap_argv(session, package, spec)
    log_dir = session.provider.state_dir() / "logs" / "setup"
    result = session.fleet.run(
        argv, workers=chief, log_dir=log_dir, on_line=on_line, env=lambda w: worker_env(session.config)
    )
    raise_on_failure(
        result, f"setup of the tracking environment (report.to: {', '.join(recipe.report.trackers)})"
    )
    return {PYTHON_ENV: venv_python(session, spec)}


def setup(config: ClusterConfig, recipe: RecipeConfig, *, on_line: LineSink | None = None) -> SetupResult:
    started = time.monotonic()
    session = open_session(config)
    spec = env_spec(session, recipe)
    workers = launch_plan(session, recipe).workers
    package = ship_package(session, workers)
    no_deps = ship_sources(session, spec, workers)
    log_dir = session.provider.state_dir() / "logs" / "setup"
    argv = bootstrap_argv(session, package, spec, no_deps=no_deps)
    result = session.fleet.run(
        argv, workers=workers, log_dir=log_dir, on_line=on_line, env=lambda w: worker_env(config)
    )
    raise_on_failure(result, f"setup of the {recipe.backend.kind} environment")
    tracking_env(session, recipe, package, on_line=on_line)
    seconds = time.monotonic() - started
    goodput.remember_cluster_event(session.provider.state_dir(), "setup", time.time() - seconds, seconds)
    return SetupResult(
        backend=recipe.backend.kind,
        venv=f"{session.provider.venv_cache()}/{spec.key}",
        seconds=time.monotonic() - started,
        workers=len(workers),
    )
