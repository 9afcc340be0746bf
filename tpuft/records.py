"""The records that cross the provider boundary: a cluster, its ordered workers, and the state words.

Providers produce them and fleets consume them, so both import this module and neither imports the other. Only
these records leave a provider: ``ops`` never sees a google-cloud-tpu object or a local folder layout. Workers are
ordered: index i is ``--worker i`` on a TPU pod slice, and worker 0 is the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
