"""The provider contract: the verbs every provider has (its records live in :mod:`tpuft.core.records`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tpuft.core.records import Cluster, Progress, State, Worker

if TYPE_CHECKING:
    from tpuft.fleet.base import Fleet

__all__ = ["Cluster", "Progress", "Provider", "State", "Worker"]


class Provider(Protocol):
    name: str
    target: str
    """'cpu' (the local pod) or 'tpu': which wheels a backend installs on the workers."""

    def create(self, progress: Progress | None = None) -> tuple[Cluster, bool]:
        """Create the node(s) and the bucket, or reuse matching ones. Returns the cluster and whether it was
        new."""
        ...

    def plan(self) -> dict[str, Any]:
        """What ``create`` would make, worked out on this machine alone (no API call, no connection): the
        ``--dry-run`` of create, setup, train and up."""
        ...

    def get(self) -> Cluster:
        """The cluster as it is now; ``state == NOT_FOUND`` when there is none."""
        ...

    def delete(self, progress: Progress | None = None) -> bool:
        """Remove the node(s); the bucket and its runs are kept. Returns False when there was nothing to
        delete."""
        ...

    def prepare(self, cluster: Cluster) -> None:
        """Make the workers reachable from this machine (GCP: the SSH key in the node's metadata)."""
        ...

    def fleet(self, cluster: Cluster) -> Fleet:
        """A way to run commands on every worker of ``cluster`` (building it changes nothing anywhere)."""
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
