"""Fixtures of the tracking tests (the rig is tests/tracking/rig.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tracking_python() -> str:
    """Python of the tracking venv (wandb, mlflow), built once per machine through tpuft's venv cache."""
    from tests.venvs import tracking_python as build

    return build()
