"""A backend venv that tpuft's bootstrap accepts as built (its completion marker is there), whose
``bin/python`` runs tpuft's own worker tools for real (the supervisor: ``-m tpuft.worker.supervisor.process
...``) and a scripted stand-in in place of the trainer, or is absent. The controller's side of setup and train
(shipping, launch plans, supervisors, attach, stop, resume, run.json) is tested with it without building
torch.

What each worker's stand-in trainer does is read from ``$HOME/standin.json`` (see
:mod:`tests.ops.standin_trainer`): how long it runs, how it exits, whether it waits for its peer like a
collective would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend
from tpuft.core.records import Cluster
from tpuft.fleet.ssh import SshFleet
from tpuft.host.bootstrap import MARKER

RECIPE = """\
name: t
backend: {kind: torch_xla}
model: {config: {d_model: 16}}
data: {train: train.jsonl}
train: {steps: 2, batch_size: 2}
"""
TRAINER = Path(__file__).with_name("standin_trainer.py")


def wrapper() -> str:
    """``bin/python``: the real interpreter for the supervisor, the stand-in for the trainer."""
    return (
        "#!/bin/bash\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "tpuft.worker.supervisor.process" ]; then exec {sys.executable} '
        '"$@"; fi\n'
        f'exec {sys.executable} {TRAINER} "$@"\n'
    )


def built_venv(
    tmp_path: Path, cli, trainer: str | None = "stand-in", recipe: str = RECIPE, slices: int = 1
) -> tuple[Path, Path, Path]:  # type: ignore[no-untyped-def]
    """A 2-worker local cluster (``slices`` 2: two slices of one worker) whose backend venv is marked built;
    its python is the stand-in wrapper (or absent for ``trainer=None``). Returns the cluster file, the recipe
    and the venv."""
    cluster = tmp_path / "tpuft.yaml"
    cache = tmp_path / "venvs"
    cluster.write_text(
        f"name: stand-in\nlocal:\n  workers: {2 // slices}\n  slices: {slices}\n  devices_per_worker: 1\n"
        f"  venv_cache: {cache}\n  python: {sys.executable}\n"
    )
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(recipe)
    assert cli("create", "-c", str(cluster)).code == 0
    key = BACKEND.env_spec(TorchXlaBackend(), "cpu", sys.executable).key
    (cache / key / "bin").mkdir(parents=True)
    (cache / key / MARKER).write_text(
        json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"})
    )
    if trainer is not None:
        python = cache / key / "bin" / "python"
        python.write_text(wrapper())
        python.chmod(0o755)
    return cluster, recipe_file, cache / key


def worker_home(index: int, cluster: str = "stand-in") -> Path:
    import os

    return Path(os.environ["TPUFT_HOME"]) / "local" / cluster / "workers" / f"worker-{index}"


def script(index: int, **behaviour: Any) -> None:
    """Tell worker ``index``'s stand-in what to do (keys: see tests/ops/standin_trainer.py)."""
    home = worker_home(index)
    home.mkdir(parents=True, exist_ok=True)
    (home / "standin.json").write_text(json.dumps(behaviour))


class RigProvider:
    """Just what setup's and doctor's steps ask of a provider, for a session over an SSH fleet made by the
    test (the sshd pod playing GCP's TPU hosts)."""

    def __init__(self, fleet: SshFleet | None) -> None:
        self._fleet = fleet

    def prepare(self, cluster: Cluster) -> None:
        pass

    def fleet(self, cluster: Cluster) -> SshFleet | None:
        return self._fleet

    def venv_cache(self) -> str:
        return "venvs"  # HOME-relative, as on GCP: each worker builds its own

    def python(self) -> str:
        return sys.executable
