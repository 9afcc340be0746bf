"""What a backend tells the rest of tpuft: its recipe section, what to install on a worker, which workers run
what, where its trainer puts things in the run dir, what it supports of the shared recipe, and what its
summary says.

The controller never imports a backend's framework; it only builds requirement lists, argv and layouts. The
heavy lifting happens in ``tpuft/worker/<kind>/train.py`` inside the venv that these requirements describe.
Shared code asks these questions and never names a backend: one backend = its own files
(``backends/<kind>_schema.py`` for its recipe section, capabilities and run layout, ``backends/<kind>.py`` for
its venv and launch plan, ``worker/<kind>/train.py``)
+ one line in the registry.

The plain records live in :mod:`tpuft.backends.spec` (a module low enough for the cluster schema and the
registry to import); they are re-exported here, where the :class:`Backend` protocol names them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tpuft.backends.registry import module_of
from tpuft.backends.spec import (
    MANIFEST_FORMAT,
    VENV_LAYOUT_VERSION,
    Capabilities,
    ClusterShape,
    EnvSpec,
    KeyPath,
    LaunchPlan,
    RunLayout,
    RunOutcome,
    Target,
    manifest_gaps,
    manifest_text,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tpuft.config.recipe import RecipeConfig

__all__ = [
    "MANIFEST_FORMAT",
    "VENV_LAYOUT_VERSION",
    "Backend",
    "Capabilities",
    "ClusterShape",
    "CompilePlan",
    "EnvSpec",
    "KeyPath",
    "LaunchPlan",
    "RunLayout",
    "RunOutcome",
    "Target",
    "get_backend",
    "manifest_gaps",
    "manifest_text",
    "weight_digest_summary",
]


@dataclass(frozen=True)
class CompilePlan:
    """How to compile a recipe's real train step for a TPU slice on this machine's CPU (``recipes show
    --compile``, ``--check-fit``): a backend that can says so through the registry
    (:func:`tpuft.backends.registry.compile_planner`) with this record, and ``tpuft.ops.compile_fit`` builds
    the venv, runs the program and reads its answer. Like the rest of a backend's planning it is lists and
    argv: the controller never imports the framework.

    The program prints one JSON object on stdout: per-device ``argument_bytes``, ``output_bytes``,
    ``alias_bytes``, ``temp_bytes``, ``generated_code_bytes``, ``flops_per_device``, ``devices``, ``mesh``
    (axis -> size), ``compile_s``; or ``{"error": ...}`` with exit code 2 for a setting the user must
    change."""

    env: EnvSpec
    """The framework's venv (the backend's CPU venv: the same one the local pod trains with)."""
    overlay: tuple[str, ...]
    """Requirements installed with ``pip install --target`` into a folder of their own beside the venvs
    (libtpu): on ``PYTHONPATH`` for the compile only, so the venv's key, and the local pod's venv, stay the
    same."""
    overlay_key: str
    """The overlay folder's name in the venv cache (e.g. ``libtpu-0.0.42.1``)."""
    module: str
    """Run as ``python -m MODULE REQUEST.json`` with tpuft's package and the overlay on ``PYTHONPATH``."""
    request: dict[str, Any]
    env_vars: dict[str, str] = field(default_factory=dict)
    what: str = ""
    """What is compiled, for the progress line (``the T5X train step of byt5 small``)."""
    sources_key: tuple[str, ...] = ()
    """The recipe key that chooses where the venv's ``no_deps`` sources come from (``("backend",
    "t5x_source")``): where a source that cannot be reached, or an install that failed, is reported."""
    sources_help: str = ""
    """How to set that key, for the error (a checkout, wheels, or the git repositories and what they need)."""


def local_replicas(shape: ClusterShape, replicas: int) -> str:
    """How a CPU pod's replicas are counted, for a batch-split error: per worker, or workers x devices when
    each worker exposes several (``local.devices_per_worker``)."""
    if shape.local_devices > 1:
        return f"{replicas} replicas ({shape.hosts} workers x {shape.local_devices} devices)"
    return f"{replicas} workers"


def weight_digest_summary(outcome: RunOutcome, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """For data-parallel backends whose every replica records a sha256 of its weights at the end: equal
    digests on every launched worker mean data parallelism kept them in sync."""
    digests = dict(outcome.digests)
    if not digests:
        return {"weight_digests": {}}, []
    same = len(set(digests.values())) == 1 and len(digests) == launched
    return {"weight_digests": digests}, [
        ("weights", "identical on all workers" if same else "DIFFER between workers")
    ]


class Backend(Protocol):
    kind: str
    config_model: type[BaseModel]
    """The recipe's ``backend:`` section for this kind (a StrictModel with ``kind: Literal[...]``)."""
    layout: RunLayout
    capabilities: Capabilities
    """The optional shared recipe keys and the eval metrics this backend implements."""

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        """The venv this backend needs on a worker of the given target."""
        ...

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        """Settings that are only wrong for this cluster (e.g. a batch that does not split over the replicas),
        located at the recipe key to change."""
        ...

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan: ...

    def summarize(self, outcome: RunOutcome, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """What ``train`` adds to its summary at the end: values for ``--json`` and rows for the table."""
        ...


def get_backend(kind: str) -> Backend:
    """The backend's planner (``backends/<kind>.py``: venvs, launch plans, summaries), found by name through
    the registry; the recipe and the run-dir readers need only its schema module
    (:func:`tpuft.backends.registry.schema`). It lives here, beside the protocol it returns, and not in the
    package's ``__init__``: an ``__init__`` that named the protocol would close a circle through the recipe
    (``config.recipe`` imports ``backends.registry``, which loads the package first)."""
    backend: Backend = importlib.import_module(module_of(kind)).BACKEND
    return backend
