"""A short-lived local memory of the cluster, so ``exec`` and ``ssh`` need no API round trip.

One JSON file per cluster (``state_dir()/cluster.json``) holds what ``get`` last saw (state, workers'
addresses, each slice's API ``id``) and two things learnt once per node: whether the user's key is already in
the node's metadata (``key``) and which host keys are pinned for which nodes and addresses (``pins``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tpuft.core.records import Cluster, State, Worker


def worker_rows(workers: list[Worker]) -> list[list[Any]]:
    """The workers as the cache stores them: what is compared to tell whether they are still the same
    machines, and (last) each one's slice, so a remembered multislice cluster is addressed ``S:I`` like a
    described one."""
    return [[w.index, w.address, w.internal_address, w.slice] for w in workers]


class WorkerCache:
    CACHE_SECONDS = 600.0

    def __init__(self, path: Path) -> None:
        self.path = path

    def remember(self, cluster: Cluster, nodes: list[list[Any]] | None = None) -> None:
        """``nodes``: [node id, the API's unique ``id``, worker count] per slice; the ``id`` changes when a
        node is recreated under the same name, which is what tells ``prepare`` that the pinned host keys are
        stale."""
        previous = self.read() or {}
        workers = worker_rows(cluster.workers)
        record = {
            "time": time.time(),
            "state": cluster.state,
            "accelerator": cluster.accelerator,
            "bucket": cluster.bucket,
            "details": cluster.details,
            "workers": workers,
            "nodes": nodes or [],
            "key": previous.get("key", "")
            if previous.get("workers") == workers
            else "",  # same node, same metadata
            "pins": previous.get(
                "pins"
            ),  # checked against nodes and addresses before use (see HostKeyPins.pin)
        }
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(record))

    def read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)

    def cached(self, name: str, provider: str) -> Cluster | None:
        """The cluster as last seen, if READY and seen in the last few minutes; None means: ask the API."""
        record = self.read()
        if not record or time.time() - record.get("time", 0) > self.CACHE_SECONDS:
            return None
        return cluster_of(record, name, provider)


def cluster_of(record: dict[str, Any], name: str, provider: str) -> Cluster | None:
    """A remembered record as the READY cluster it describes; None when it was not READY (or is not a
    record)."""
    if record.get("state") != State.READY or not isinstance(record.get("workers"), list):
        return None
    workers = [
        Worker(index=row[0], address=row[1], internal_address=row[2], slice=row[3] if len(row) > 3 else 0)
        for row in record["workers"]
    ]
    return Cluster(
        name, provider, State.READY, record["accelerator"], workers, record["bucket"], record["details"]
    )
