"""Training backends, keyed by the recipe's ``backend.kind`` (see :mod:`tpuft.backends.registry`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tpuft.backends.registry import kinds, module_of

if TYPE_CHECKING:
    from tpuft.backends.base import Backend

__all__ = ["get_backend", "kinds"]


def get_backend(kind: str) -> Backend:
    """The backend's planner (``backends/<kind>.py``: venvs, launch plans, summaries); the recipe and the
    run-dir readers need only its schema module (:func:`tpuft.backends.registry.schema`)."""
    backend: Backend = importlib.import_module(module_of(kind)).BACKEND
    return backend
