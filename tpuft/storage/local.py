"""Run storage in a local folder (the local provider's "bucket"): the same interface as a bucket, plain
files."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tpuft.core.errors import TpuftError
from tpuft.storage.base import (
    PARTIAL_SUFFIX,
    RUNS,
    Progress,
    TreeDownloads,
    TreeTransfer,
    clean_relpath,
    join_relpath,
    run_order,
)
from tpuft.storage.transfer import Meter, copy_atomic, partial_path, sync_tree, walk_files


@dataclass(frozen=True)
class LocalStorage(TreeDownloads):
    root: Path

    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def local_root(self) -> Path:
        return self.root

    def run_dir(self, run_id: str) -> Path:
        return self.root / RUNS / run_id

    def run_ids(self) -> list[str]:
        """Run ids, oldest first: by the start time in the id, as in a bucket (a folder's mtime changes as it
        trains and is lost by a copy)."""
        runs = self.root / RUNS
        if not runs.is_dir():
            return []
        return sorted((p.name for p in runs.iterdir() if p.is_dir()), key=run_order)

    def _path(self, relpath: str) -> Path:
        clean = clean_relpath(relpath)
        return self.root.joinpath(*clean.split("/")) if clean else self.root

    def ensure_bucket(self, location: str | None = None) -> tuple[bool, str | None]:
        """Create the folder; a local folder has no region, so ``location`` is ignored and there is no
        warning."""
        existed = self.root.is_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        return not existed, None

    def write_text(self, relpath: str, text: str) -> None:
        """Write through a temporary file, so a reader never sees half a file. The temporary name is this
        process's own: several workers' supervisors may write the same small file (run.json) at once."""
        target = self._path(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = partial_path(target).with_name(f".{target.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)

    def read_text(self, relpath: str) -> str | None:
        try:
            return self._path(relpath).read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_versioned(self, relpath: str) -> tuple[str | None, str]:
        target = self._path(relpath)
        with _locked(target):
            return self.read_text(relpath), _version(target)

    def write_text_if(self, relpath: str, text: str, version: str) -> str | None:
        """Under an advisory lock beside the file (``.NAME.lock.tpuft-part``, never listed); every write
        replaces the file, so its inode and mtime are a version that changes with each write."""
        target = self._path(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(target):
            if _version(target) != version:
                return None
            self.write_text(relpath, text)
            return _version(target)

    def read_bytes(self, relpath: str, *, start: int = 0) -> bytes | None:
        """The file's bytes from offset ``start`` on (for following a growing log); None if there is no
        file."""
        try:
            with self._path(relpath).open("rb") as handle:
                handle.seek(start)
                return handle.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists(self, relpath: str) -> bool:
        """Whether a file is there (folders do not count: GCS has none)."""
        return self._path(relpath).is_file()

    def list(self, prefix: str = "") -> list[str]:
        """Files under the folder ``prefix``, recursively, as sorted paths relative to the storage root."""
        base = self._path(prefix)
        if not base.is_dir():
            return []
        start = clean_relpath(prefix)
        return [join_relpath(start, rel) for rel, _ in walk_files(base)]

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Files under the folder ``prefix``, recursively, with their sizes in bytes (keys as :meth:`list` has
        them)."""
        base = self._path(prefix)
        if not base.is_dir():
            return {}
        start = clean_relpath(prefix)
        return {join_relpath(start, rel): path.stat().st_size for rel, path in walk_files(base)}

    def folders(self, prefix: str = "") -> list[str]:
        """Names of the folders directly inside the folder ``prefix``, sorted (``checkpoints`` ->
        ``step_...``)."""
        base = self._path(prefix)
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def upload_file(self, local_path: Path | str, relpath: str) -> None:
        """Copy one file in, through a temporary name (a reader never sees half of it)."""
        copy_atomic(Path(local_path), self._path(relpath))

    def remove_tree(self, relprefix: str) -> int:
        base = self._path(relprefix)
        if not clean_relpath(relprefix) or not base.is_dir():
            return 0  # never the root itself
        count = sum(1 for _ in walk_files(base))
        shutil.rmtree(base)
        return count

    def upload_tree(self, local_dir: Path | str, relprefix: str, *, workers: int = 8) -> int:
        """Copy ``local_dir`` to ``relprefix``; returns how many files were copied (unchanged ones are
        skipped). ``workers`` is accepted for the same signature as GCS; a local copy is disk-bound, so it
        runs serially."""
        source = Path(local_dir)
        if not source.is_dir():
            raise TpuftError(f"{source}: no such folder to upload to {self._path(relprefix)}")
        return sync_tree(source, self._path(relprefix)).fetched

    def fetch_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> TreeTransfer:
        """:meth:`download_tree`, reporting files and bytes (wanted, and copied) instead of a count."""
        target = Path(local_dir)
        target.mkdir(parents=True, exist_ok=True)
        source = self._path(relprefix)
        if not source.is_dir():
            Meter(0, progress)
            return TreeTransfer(0, 0, 0, 0)
        return sync_tree(source, target, include, progress)


def _version(path: Path) -> str:
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "0"
    return f"{info.st_ino}:{info.st_mtime_ns}:{info.st_size}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock for ``path``'s compare-and-write; a missing folder needs none (nothing to
    race)."""
    try:
        # named like a partial file: never listed, uploaded or synced
        fd = os.open(path.with_name(f".{path.name}.lock{PARTIAL_SUFFIX}"), os.O_WRONLY | os.O_CREAT, 0o644)
    except (FileNotFoundError, NotADirectoryError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
