"""Run storage: where run directories live. A local folder for the local provider, ``gs://bucket[/prefix]``
for the GCP provider, behind one interface (:class:`~tpuft.storage.base.Storage`) so callers do not care
which.

``base`` (the interface, path rules), ``transfer`` (checksums, partial files, progress), ``errors`` (GCS
failures explained), ``local``, ``gcs``, and ``sync`` (mirroring a growing local run dir to a storage).
"""

from __future__ import annotations

from pathlib import Path

from tpuft.storage.base import PARTIAL_SUFFIX, RUNS, Storage, TreeTransfer
from tpuft.storage.gcs import REGION_WARNING, GcsStorage
from tpuft.storage.local import LocalStorage

__all__ = [
    "PARTIAL_SUFFIX",
    "REGION_WARNING",
    "RUNS",
    "GcsStorage",
    "LocalStorage",
    "Storage",
    "TreeTransfer",
    "open_storage",
]


def open_storage(url: str, *, project: str | None = None) -> LocalStorage | GcsStorage:
    """``gs://bucket[/prefix]`` -> :class:`GcsStorage` (``project`` owns the bucket); anything else is a
    folder."""
    if url.startswith("gs://"):
        return GcsStorage.from_url(url, project=project)
    return LocalStorage(Path(url).expanduser())
