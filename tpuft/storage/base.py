"""What every run storage is: the interface (``Storage``), the shapes a transfer reports in, and path rules.

Two storages implement it: a local folder (:mod:`tpuft.storage.local`) and ``gs://bucket[/prefix]``
(:mod:`tpuft.storage.gcs`). Paths given to them are relative to the storage root and always use ``/``; they
never leave the root.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tpuft.core.errors import UsageError

RUNS = "runs"
PARTIAL_SUFFIX = ".tpuft-part"
"""Suffix of a file being downloaded or copied; never listed, uploaded or left under the final name."""
MiB = 1024 * 1024
Failures = list[tuple[str, BaseException]]
"""``(gs:// url, exception)`` of each file a transfer could not move. (An alias: inside the storage classes
the name ``list`` is their method.)"""
_RUN_STAMP = re.compile(r"-(\d{8}-\d{6})-\d+$")
"""The creation time inside a run id (``rundir.new_run_id``: ``<recipe>-YYYYmmdd-HHMMSS-<pid>``)."""
Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)`` of a tree download: called once the files are listed (0 done), then
as bytes land, from worker threads but never two at a time; files already in place count as done when they are
checked."""
RERUN_HINT = "Run it again: files already complete are kept and only the rest is fetched"


@dataclass(frozen=True)
class TreeTransfer:
    """What a tree download did: the files it was asked for, and those it fetched (the others were already
    there with the same size and checksum)."""

    files: int
    total_bytes: int
    fetched: int
    fetched_bytes: int

    @property
    def skipped(self) -> int:
        return self.files - self.fetched


def clean_relpath(relpath: str) -> str:
    """``a//b/`` -> ``a/b``. A storage path never leaves the storage root, whatever a caller or object name
    says."""
    parts = [p for p in relpath.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UsageError(f"{relpath!r}: storage paths must stay inside the storage root (no '..')")
    return "/".join(parts)


def join_relpath(*relpaths: str) -> str:
    return clean_relpath("/".join(relpaths))


def run_order(run_id: str) -> tuple[str, str]:
    stamp = _RUN_STAMP.search(run_id)
    return (stamp.group(1) if stamp else "", run_id)


class TreeDownloads:
    """``download_tree`` for every storage, in terms of its ``fetch_tree``."""

    def download_tree(
        self: Storage,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Copy ``relprefix`` into ``local_dir``; returns how many files were fetched. Files already there
        with the same size and checksum are skipped, so an interrupted download resumes; ``include`` picks
        files by their path inside ``relprefix``."""
        return self.fetch_tree(
            relprefix, local_dir, workers=workers, include=include, progress=progress
        ).fetched


class Storage(Protocol):
    """A place for run directories: a local folder or ``gs://bucket[/prefix]``. ``relpath`` arguments are
    relative to :attr:`url` and use ``/``."""

    @property
    def url(self) -> str:
        """The root, as the user writes it (a folder path or ``gs://...``)."""
        ...

    @property
    def local_root(self) -> Path | None:
        """The root as a folder on this machine; None for a bucket."""
        ...

    def run_dir(self, run_id: str) -> Path | str:
        """Where run ``run_id`` lives under this root (``runs/<id>``)."""
        ...

    def run_ids(self) -> list[str]:
        """The runs under this root, oldest first (by the start time in the id: :func:`run_order`)."""
        ...

    def ensure_bucket(self, location: str | None = None) -> tuple[bool, str | None]:
        """Create the root if needed. Returns (created, a warning such as a bucket in another region)."""
        ...

    def write_text(self, relpath: str, text: str) -> None: ...

    def read_text(self, relpath: str) -> str | None:
        """The file's text, None when it does not exist."""
        ...

    def read_versioned(self, relpath: str) -> tuple[str | None, str]:
        """The file's text (None when it does not exist) and its version: what :meth:`write_text_if`
        compares."""
        ...

    def write_text_if(self, relpath: str, text: str, version: str) -> str | None:
        """Write only if the file is still at ``version`` (as :meth:`read_versioned` gave it; the absent file
        has one too), atomically against other writers using this method on any machine; returns the new
        version, or None when someone else wrote first (nothing written). A bucket's object generation, a
        local file's lock."""
        ...

    def read_bytes(self, relpath: str, *, start: int = 0) -> bytes | None:
        """The file's bytes from ``start`` (a ranged read), None when it does not exist."""
        ...

    def exists(self, relpath: str) -> bool: ...

    def list(self, prefix: str = "") -> list[str]:
        """Every file below ``prefix`` (recursively), as relpaths from the root; never a partial download."""
        ...

    def folders(self, prefix: str = "") -> list[str]:
        """The immediate sub-folders of ``prefix``."""
        ...

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """:meth:`list` with each file's size in bytes, from the same one listing (how a reader tells a folder
        that a background upload has only partly sent from a complete one)."""
        ...

    def upload_file(self, local_path: Path | str, relpath: str) -> None: ...

    def upload_tree(self, local_dir: Path | str, relprefix: str, *, workers: int = 8) -> int:
        """Copy a local folder under ``relprefix``, skipping files already there with the same content."""
        ...

    def remove_tree(self, relprefix: str) -> int:
        """Delete every file below the folder ``relprefix`` (``tpuft predict --overwrite``'s old shards);
        returns how many. A bucket has no folders, so nothing else is left behind either."""
        ...

    def download_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Copy ``relprefix`` into ``local_dir``; returns how many files were fetched (intact ones are
        skipped)."""
        ...

    def fetch_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> TreeTransfer:
        """:meth:`download_tree` with a report of files and bytes wanted and fetched."""
        ...
