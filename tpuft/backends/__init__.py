"""Training backends, keyed by the recipe's ``backend.kind``. Adding one touches only its own file here, its
``worker/<kind>_train.py``, and the config union."""

from __future__ import annotations

from tpuft.backends.base import Backend
from tpuft.errors import UsageError

_MODULES = {"torch_xla": "tpuft.backends.torch_xla"}


def get_backend(kind: str) -> Backend:
    import importlib

    module = _MODULES.get(kind)
    if module is None:
        raise UsageError(f"unknown backend {kind!r}; available: {', '.join(sorted(_MODULES))}")
    return importlib.import_module(module).BACKEND


def kinds() -> list[str]:
    return sorted(_MODULES)
