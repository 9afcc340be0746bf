"""The records that cross the provider boundary: a cluster, its ordered workers, and the state words.

Providers produce them and fleets consume them, so both import this module and neither imports the other. Only
these records leave a provider: ``ops`` never sees a google-cloud-tpu object or a local folder layout. Workers
are ordered: index i is ``--worker i`` on a TPU pod slice, and worker 0 is the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Progress = Callable[[str], None]
"""Providers report what they are waiting for through this (the CLI shows it in a spinner)."""


DOWN_WORKERS = "workers down"
"""A cluster's detail: the flat indexes (``"1,3"``) of workers whose host is gone while the others of its
slice run on, which a provider whose slices lose hosts one at a time (Compute Engine's MIGs) reports; a
recovery stops the others' trainers before it deletes the slice. A node of the Cloud TPU API goes whole."""


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
    """CPU cores a local worker is pinned to, so local workers do not fight over cores like real hosts would
    not."""
    internal_address: str = ""
    """The VPC address (GCP); what other workers use to reach this one."""
    slice: int = 0
    """Multislice: the slice this host belongs to (0 on a single slice). Workers are ordered slice by slice,
    so ``index`` is the flat number and ``(slice, host)`` the same worker as ``--worker S:I`` names it."""


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

    @property
    def layout(self) -> SliceLayout:
        """How the workers split into slices (every slice has the same hosts)."""
        slices = max((w.slice for w in self.workers), default=0) + 1
        return SliceLayout(slices, max(1, len(self.workers) // slices))


@dataclass(frozen=True)
class SliceLayout:
    """Multislice addressing: flat worker index <-> (slice, host in the slice). Slices are equal (one
    accelerator type), workers numbered slice by slice: worker ``s * hosts + i`` is host ``i`` of slice ``s``,
    which is also how JAX numbers the processes of a Multislice job. With one slice a worker is named as
    before ("worker 3")."""

    slices: int
    hosts: int
    """Hosts per slice."""

    @property
    def workers(self) -> int:
        return self.slices * self.hosts

    def slice_of(self, index: int) -> int:
        return index // self.hosts

    def host_of(self, index: int) -> int:
        return index % self.hosts

    def index_of(self, slice_id: int, host: int) -> int:
        return slice_id * self.hosts + host

    def ref(self, index: int) -> str:
        """``S:I`` (what ``--worker`` accepts), or the flat index on one slice."""
        return f"{self.slice_of(index)}:{self.host_of(index)}" if self.slices > 1 else str(index)

    def name(self, index: int) -> str:
        """For messages: ``slice 1 host 3 (worker 7)``, or ``worker 7`` on one slice."""
        if self.slices == 1:
            return f"worker {index}"
        return f"slice {self.slice_of(index)} host {self.host_of(index)} (worker {index})"
