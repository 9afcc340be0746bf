"""The backends tpuft knows, by the recipe's ``backend.kind``. Adding a backend is one line here plus its own
files (``backends/<kind>_schema.py``, ``backends/<kind>.py`` and ``worker/<kind>/train.py``); no other module
names a backend.

Each backend is two modules on the controller, found here by name: ``<module>_schema`` holds what the recipe
and the run-dir readers need (its recipe section, its :class:`~tpuft.backends.spec.Capabilities`, its
:class:`~tpuft.backends.spec.RunLayout`) and is light (pydantic and the stdlib); ``<module>`` itself plans
venvs and launches (:func:`tpuft.backends.base.get_backend`). Loading a recipe imports only the schema
modules.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from tpuft.core.errors import UsageError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tpuft.backends.spec import Capabilities, RunLayout

MODULES = {
    "keras": "tpuft.backends.keras",
    "t5x": "tpuft.backends.t5x",
    "torch_xla": "tpuft.backends.torch_xla",
}
"""kind -> the backend's planning module; its schema module is the same name + ``_schema``."""

SCHEMA_SUFFIX = "_schema"

COMPILE_PLANNERS = {"t5x": "tpuft.backends.t5x_compile"}
"""kind -> the module whose ``compile_plan(recipe, accelerator, python, slices=1)`` gives a
:class:`~tpuft.backends.base.CompilePlan`: the backends whose train step can be compiled for a TPU slice
offline."""

NO_COMPILE = {
    "torch_xla": "tpuft does not export a PyTorch/XLA step to StableHLO for libtpu yet",
    "keras": "TensorFlow compiles for a TPU only on a TPU host (TPUStrategy needs a live TPU system)",
}
"""kind -> why its step cannot be compiled offline: the summary stays a paper estimate, labelled with this."""


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


def compile_planner(kind: str) -> ModuleType | None:
    """The backend's compile planner (see :data:`COMPILE_PLANNERS`), or None when it has none
    (:func:`no_compile_reason` says why)."""
    module_of(kind)
    name = COMPILE_PLANNERS.get(kind)
    return importlib.import_module(name) if name else None


def no_compile_reason(kind: str) -> str:
    return NO_COMPILE.get(kind, "this backend has no offline compile")


def layout(kind: str) -> RunLayout:
    """Where the backend's trainer puts things in the run dir."""
    return schema(kind).LAYOUT
