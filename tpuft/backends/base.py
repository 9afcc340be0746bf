"""What a backend tells the rest of tpuft: its recipe section, what to install on a worker, which workers run what,
where its trainer puts things in the run dir, and what its summary says.

The controller never imports a backend's framework; it only builds requirement lists, argv and layouts. The heavy
lifting happens in ``tpuft/worker/<kind>_train.py`` inside the venv that these requirements describe. Shared code asks
these questions and never names a backend: one backend = ``backends/<kind>.py`` + ``worker/<kind>_train.py`` + one
line in the registry.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tpuft.config import RecipeConfig
    from tpuft.runs import RunSnapshot
    from tpuft.storage import Storage

Target = Literal["cpu", "tpu"]
"""CPU for the local pod, TPU for real TPU hosts: the same backend needs different wheels for each."""

VENV_LAYOUT_VERSION = "1"
"""Bump when the way venvs are built changes, so that cached ones are rebuilt."""

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class EnvSpec:
    """A backend venv: its requirements, and the cache key that names it on every worker."""

    kind: str
    requirements: tuple[str, ...]
    python: str
    """Interpreter the venv is built from, on the worker."""
    pip_args: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        payload = json.dumps([VENV_LAYOUT_VERSION, self.kind, self.python, self.requirements, self.pip_args])
        return f"{self.kind}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class ClusterShape:
    """What a backend needs to know of the cluster to plan a run: hosts (workers), chips per host, and the target."""

    hosts: int
    chips_per_host: int
    target: Target

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host


@dataclass(frozen=True)
class LaunchPlan:
    """Which workers run the trainer and how. The same list drives ``setup`` (it installs there only), the launch,
    ``TPUFT_NUM_WORKERS`` / ``TPUFT_WORKER_ID`` (position in this list) and the workers ``run.json`` counts."""

    workers: tuple[int, ...]
    argv: tuple[str, ...] = ("-m", "tpuft.worker")
    """After the venv's python."""
    env: dict[str, str] = field(default_factory=dict)
    """What the backend's runtime needs on each launched worker (e.g. PJRT_DEVICE)."""
    ship: tuple[str, ...] = ("train", "eval")
    """``data`` keys whose files are copied to workers that cannot read this machine's disk."""


@dataclass(frozen=True)
class RunLayout:
    """Where a backend's trainer puts things in the run dir, and so how pull, monitor, convert and resume read them."""

    metrics: Literal["jsonl", "tensorboard"] = "jsonl"
    """``metrics.jsonl`` (one JSON object per logged step), or TensorBoard events only."""
    checkpoints: str = "checkpoints"
    """The folder (under the run dir) holding one folder per checkpoint."""
    checkpoint_format: str = "step_{step:08d}"
    checkpoint_pattern: str = r"^step_(\d+)$"
    """A complete checkpoint folder's name; group 1 is its step. A half-written one is named otherwise (``*.tmp``)."""
    writes_to_bucket: bool = False
    """True: the trainer writes a ``gs://`` run dir itself; False: it writes locally and tpuft mirrors it up."""
    exports_hf: bool = True
    """True: the trainer writes ``export/hf`` itself; False: ``tpuft convert --run`` makes it after the run."""

    def step_of(self, name: str) -> int | None:
        match = re.match(self.checkpoint_pattern, name)
        return int(match.group(1)) if match else None

    def checkpoint_dir(self, run_dir: Path, step: int) -> Path:
        return run_dir / self.checkpoints / self.checkpoint_format.format(step=step)

    def local_checkpoints(self, folder: Path) -> list[tuple[int, Path]]:
        """Complete checkpoints in ``folder`` (a checkpoints folder), oldest first."""
        if not folder.is_dir():
            return []
        found = [(self.step_of(child.name), child) for child in folder.iterdir() if child.is_dir()]
        return sorted((step, path) for step, path in found if step is not None)

    def checkpoint_steps(self, storage: Storage) -> dict[int, str]:
        """step -> folder name of each complete checkpoint of a run dir (local or in a bucket)."""
        steps = {}
        for name in storage.folders(self.checkpoints):
            step = self.step_of(name)
            if step is not None:
                steps[step] = name
        return steps


class Backend(Protocol):
    kind: str
    config_model: type[BaseModel]
    """The recipe's ``backend:`` section for this kind (a StrictModel with ``kind: Literal[...]``)."""
    layout: RunLayout

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        """The venv this backend needs on a worker of the given target."""
        ...

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        """Settings that are only wrong for this cluster (e.g. a batch that does not split over the replicas),
        located at the recipe key to change."""
        ...

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        ...

    def summarize(self, snapshot: RunSnapshot, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """What ``train`` adds to its summary at the end: values for ``--json`` and rows for the table."""
        ...
