"""The tracking venv: W&B and MLflow for the tracker sidecar (:mod:`tpuft.worker.tracking.sidecar`), in a venv
of its own.

Why not in the backend venvs: the trackers' dependencies (protobuf, pydantic, SQLAlchemy, ...) would fight the
backends' pins (TensorFlow's protobuf above all), and adding two packages to a 7 GB venv rebuilds all of it.
The sidecar only reads the run dir, so it needs none of the backend's packages. Built through the same
bootstrap and cache as the backend venvs, on the chief only, and only for a recipe whose ``report.to`` names
wandb or mlflow.

Full ``mlflow`` rather than ``mlflow-skinny``: a ``sqlite:`` store needs SQLAlchemy and Alembic, and a local
``mlflow server`` (what users run beside a pod, and what the tests start) needs the server's packages; skinny
has neither. Measured: the venv is about 600 MB and builds in a few minutes from PyPI (docs/tracking.md).
"""

from __future__ import annotations

from tpuft.backends.spec import EnvSpec

KIND = "tracking"
PYTHON_ENV = "TPUFT_TRACKING_PYTHON"
"""Set by ``train`` for the chief's supervisor: the tracking venv's python, which runs the sidecar. Unset: no
sidecar."""
REQUIREMENTS = ("wandb==0.31.0", "mlflow==3.17.2")
MIN_PYTHON = "3.10"
"""mlflow 3 and wandb 0.31 install on 3.10 and newer."""


def tracking_spec(python: str) -> EnvSpec:
    """The tracking venv, built from the worker's interpreter ``python`` (the cluster file's python)."""
    return EnvSpec(kind=KIND, requirements=REQUIREMENTS, python=python, min_python=MIN_PYTHON)
