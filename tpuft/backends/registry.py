"""The backends tpuft knows, by the recipe's ``backend.kind``. Adding a backend is one line here plus its own files
(``backends/<kind>_schema.py``, ``backends/<kind>.py`` and ``worker/<kind>_train.py``); no other module names a backend.

Each backend is two modules on the controller, found here by name: ``<module>_schema`` holds what the recipe and the
run-dir readers need (its recipe section, its :class:`~tpuft.backends.spec.Capabilities`, its
:class:`~tpuft.backends.spec.RunLayout`) and is light (pydantic and the stdlib); ``<module>`` itself plans venvs and
launches (:func:`tpuft.backends.get_backend`). Loading a recipe imports only the schema modules.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from tpuft.errors import UsageError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tpuft.backends.spec import Capabilities, RunLayout

MODULES = {"keras": "tpuft.backends.keras", "t5x": "tpuft.backends.t5x", "torch_xla": "tpuft.backends.torch_xla"}
"""kind -> the backend's planning module; its schema module is the same name + ``_schema``."""

SCHEMA_SUFFIX = "_schema"


def kinds() -> list[str]:
    return sorted(MODULES)


def module_of(kind: str) -> str:
    module = MODULES.get(kind)
    if module is None:
        raise UsageError(f"unknown backend {kind!r}; available: {', '.join(kinds())}")
    return module


def schema(kind: str) -> ModuleType:
    """The backend's light module: ``SECTION`` (its recipe section), ``CAPABILITIES`` and ``LAYOUT``."""
    return importlib.import_module(module_of(kind) + SCHEMA_SUFFIX)


def config_models() -> list[type[BaseModel]]:
    """Each backend's recipe section (its ``backend:`` keys), for the recipe model's union."""
    return [schema(kind).SECTION for kind in kinds()]


def capabilities() -> dict[str, Capabilities]:
    """kind -> what that backend implements of the shared recipe."""
    return {kind: schema(kind).CAPABILITIES for kind in kinds()}


def layout(kind: str) -> RunLayout:
    """Where the backend's trainer puts things in the run dir."""
    return schema(kind).LAYOUT
