"""A backend venv that tpuft's bootstrap accepts as built (its completion marker is there), whose ``bin/python`` is a
stand-in trainer script or absent: the controller's side of setup and train (shipping, launch plans, supervision,
Ctrl-C, run.json) is tested with it without building torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend
from tpuft.worker.bootstrap import MARKER

RECIPE = """\
name: t
backend: {kind: torch_xla}
model: {config: {d_model: 16}}
data: {train: train.jsonl}
train: {steps: 2, batch_size: 2}
"""


def built_venv(tmp_path: Path, cli, trainer: str | None) -> tuple[Path, Path, Path]:  # type: ignore[no-untyped-def]
    """A 2-worker local cluster whose backend venv is marked built; its python is ``trainer`` (a script) or absent.
    Returns the cluster file, the recipe and the venv."""
    cluster = tmp_path / "tpuft.yaml"
    cache = tmp_path / "venvs"
    cluster.write_text(f"name: stand-in\nlocal:\n  workers: 2\n  venv_cache: {cache}\n  python: {sys.executable}\n")
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    assert cli("create", "-c", str(cluster)).code == 0
    key = BACKEND.env_spec(TorchXlaBackend(), "cpu", sys.executable).key
    (cache / key / "bin").mkdir(parents=True)
    (cache / key / MARKER).write_text(json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"}))
    if trainer is not None:
        python = cache / key / "bin" / "python"
        python.write_text(trainer)
        python.chmod(0o755)
    return cluster, recipe, cache / key
