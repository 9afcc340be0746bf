"""What a backend tells the rest of tpuft: what to install on a worker and how to launch it there.

The controller never imports a backend's framework; it only builds requirement lists and argv. The heavy lifting
happens in ``tpuft/worker/<kind>_train.py`` inside the venv that these requirements describe.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal, Protocol

Target = Literal["cpu", "tpu"]
"""CPU for the local pod, TPU for real TPU hosts: the same backend needs different wheels for each."""

VENV_LAYOUT_VERSION = "1"
"""Bump when the way venvs are built changes, so that cached ones are rebuilt."""


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


class Backend(Protocol):
    kind: str

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        """The venv this backend needs on a worker of the given target."""
        ...

    def worker_env(self, target: Target) -> dict[str, str]:
        """Environment the backend's runtime needs on each worker (e.g. PJRT_DEVICE)."""
        ...

    def launch_workers(self, num_workers: int) -> list[int]:
        """Which workers run the trainer (all of them for SPMD-style backends)."""
        ...
