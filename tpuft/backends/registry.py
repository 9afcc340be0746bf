"""The backends tpuft knows, by the recipe's ``backend.kind``. Adding a backend is one line here plus its own two
files (``backends/<kind>.py`` and ``worker/<kind>_train.py``); no other module names a backend."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from tpuft.errors import UsageError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tpuft.backends.base import Backend

MODULES = {"keras": "tpuft.backends.keras", "t5x": "tpuft.backends.t5x", "torch_xla": "tpuft.backends.torch_xla"}


def get_backend(kind: str) -> Backend:
    module = MODULES.get(kind)
    if module is None:
        raise UsageError(f"unknown backend {kind!r}; available: {', '.join(sorted(MODULES))}")
    return importlib.import_module(module).BACKEND


def kinds() -> list[str]:
    return sorted(MODULES)


def config_models() -> list[type[BaseModel]]:
    """Each backend's recipe section (its ``backend:`` keys), for the recipe model's union."""
    return [importlib.import_module(module).BACKEND.config_model for module in MODULES.values()]
