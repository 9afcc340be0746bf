"""The provider contract: cloud-neutral records that cross the boundary, and the verbs every provider has.

Only these records leave a provider, so ``ops`` never sees a google-cloud-tpu object or a local folder layout.
Workers are ordered: index i is ``--worker i`` on a TPU pod slice, and worker 0 is the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tpuft.fleet.base import Fleet

Progress = Callable[[str], None]
"""Providers report what they are waiting for through this (the CLI shows it in a spinner)."""


class State:
    """The provider's own words for a node's state; local clusters use the same ones."""

    READY = "READY"
    CREATING = "CREATING"
    NOT_FOUND = "NOT_FOUND"
    BROKEN = "BROKEN"


@dataclass(frozen=True)
class Worker:
    index: int
    address: str
    """How the controller reaches it: an IP on GCP, ``localhost`` for a local worker."""
    home: Path | None = None
    """The worker's private HOME (local provider only)."""
    cpus: tuple[int, ...] = ()
    """CPU cores a local worker is pinned to, so local workers do not fight over cores like real hosts would not."""
    internal_address: str = ""
    """The VPC address (GCP); what other workers use to reach this one."""


@dataclass
class Cluster:
    name: str
    provider: str
    state: str
    accelerator: str
    workers: list[Worker] = field(default_factory=list)
    bucket: str = ""
    """Root of run storage: ``gs://bucket`` or a local folder."""
    details: dict[str, str] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == State.READY


class Provider(Protocol):
    name: str
    target: str
    """'cpu' (the local pod) or 'tpu': which wheels a backend installs on the workers."""

    def create(self, progress: Progress | None = None) -> tuple[Cluster, bool]:
        """Create the node(s) and the bucket, or reuse matching ones. Returns the cluster and whether it was new."""
        ...

    def get(self) -> Cluster:
        """The cluster as it is now; ``state == NOT_FOUND`` when there is none."""
        ...

    def delete(self, progress: Progress | None = None) -> bool:
        """Remove the node(s); the bucket and its runs are kept. Returns False when there was nothing to delete."""
        ...

    def fleet(self, cluster: Cluster) -> Fleet:
        """A way to run commands on every worker of ``cluster``."""
        ...

    def storage_url(self) -> str:
        """Where runs are kept (``gs://bucket`` or a local folder), known without asking the cloud API."""
        ...

    def venv_cache(self) -> str:
        """Where workers keep backend venvs (a path on the workers)."""
        ...

    def python(self) -> str:
        """The interpreter on the workers that backend venvs are built from."""
        ...

    def state_dir(self) -> Path:
        """Controller-side folder for this cluster's bookkeeping (setup records, setup logs)."""
        ...
