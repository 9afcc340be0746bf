"""setup: build the backend's venv on every worker, in parallel, cached by a hash of its requirements."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from tpuft.backends import get_backend
from tpuft.backends.base import EnvSpec, LaunchPlan
from tpuft.config import ClusterConfig, RecipeConfig
from tpuft.fleet.base import LineSink
from tpuft.ops.common import Session, open_session, raise_on_failure, ship_package

BOOTSTRAP = "tpuft/worker/bootstrap.py"


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


def bootstrap_argv(session: Session, package: str, spec: EnvSpec, *, check: bool = False) -> list[str]:
    payload = {"key": spec.key, "requirements": list(spec.requirements), "python": spec.python, "pip_args": list(spec.pip_args)}
    argv = [spec.python, f"{package}/{BOOTSTRAP}", "--cache", session.provider.venv_cache(), "--spec", json.dumps(payload)]
    return argv + (["--check"] if check else [])


def venv_python(session: Session, spec: EnvSpec) -> str:
    return f"{session.provider.venv_cache()}/{spec.key}/bin/python"


def setup(config: ClusterConfig, recipe: RecipeConfig, *, on_line: LineSink | None = None) -> SetupResult:
    started = time.monotonic()
    session = open_session(config)
    spec = env_spec(session, recipe)
    workers = launch_plan(session, recipe).workers
    package = ship_package(session, workers)
    log_dir = session.provider.state_dir() / "logs" / "setup"
    result = session.fleet.run(bootstrap_argv(session, package, spec), workers=workers, log_dir=log_dir, on_line=on_line)
    raise_on_failure(result, f"setup of the {recipe.backend.kind} environment")
    return SetupResult(
        backend=recipe.backend.kind,
        venv=f"{session.provider.venv_cache()}/{spec.key}",
        seconds=time.monotonic() - started,
        workers=len(workers),
    )
