"""Moving files whole or not at all: checksums, partial files, atomic copies, progress, interruptible work.

Transfers skip files whose size and CRC32C already match (the checksum GCS keeps for every object; MD5 for an
object that has no CRC32C), so running an interrupted transfer again only moves what is missing or different.
A download is written under a temporary name (``.NAME.tpuft-part``), checked against the size and checksum GCS
listed for the object, and renamed as soon as it is complete (a run killed midway keeps the files it
finished), so a file under its final name is always whole; GCS itself only shows an uploaded object once it is
complete.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tpuft.core.errors import TpuftError
from tpuft.storage.base import PARTIAL_SUFFIX, RERUN_HINT, Failures, MiB, Progress, TreeTransfer
from tpuft.storage.errors import as_tpuft

if TYPE_CHECKING:
    from google.cloud.storage import Blob


REPORT_EVERY = MiB
"""A download reports its progress every this many bytes (the client writes 8 KiB at a time)."""


def file_crc32c(path: Path) -> str:
    """Base64 of the big-endian CRC32C of a file: the form GCS gives in ``blob.crc32c``."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(4 * MiB), b""):
            checksum.update(chunk)
    return base64.b64encode(checksum.digest()).decode("ascii")


def file_md5(path: Path) -> str:
    """Base64 of a file's MD5: the form GCS gives in ``blob.md5_hash`` (composite objects have none)."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(4 * MiB), b""):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode("ascii")


def same_content(path: Path, size: int | None, crc32c: str | None, md5: str | None = None) -> bool:
    """True when ``path`` is a file with this size and CRC32C (or MD5, for an object without a CRC32C); the
    checksum is only computed when sizes agree, and without any checksum nothing counts as the same."""
    try:
        if (
            size is None
            or (crc32c is None and md5 is None)
            or path.stat().st_size != size
            or not path.is_file()
        ):
            return False
    except OSError:
        return False
    return file_crc32c(path) == crc32c if crc32c is not None else file_md5(path) == md5


def same_files(a: Path, b: Path) -> bool:
    try:
        if not b.is_file() or a.stat().st_size != b.stat().st_size:
            return False
    except OSError:
        return False
    return file_crc32c(a) == file_crc32c(b)


def partial_path(target: Path) -> Path:
    return target.with_name(f".{target.name}{PARTIAL_SUFFIX}")


def is_partial(name: str) -> bool:
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX)


def walk_files(folder: Path) -> list[tuple[str, Path]]:
    """``(relpath, path)`` of every file under ``folder``, sorted; symlinked folders are not followed."""
    found = []
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if is_partial(name):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def target_in(folder: Path, rel: str, source: str) -> Path:
    """Where ``rel`` lands under ``folder``, refusing names (``../x``) that would land outside it."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise TpuftError(f"{source}: name {rel!r} would be written outside {folder}; refusing to download it")
    return folder.joinpath(*parts)


def copy_atomic(source: Path, target: Path, on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy through the partial name (removed again if the copy fails or is interrupted); with ``on_bytes``, 8
    MiB at a time so a big file's progress moves."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    try:
        if on_bytes is None:
            shutil.copy2(source, partial)
        else:
            with source.open("rb") as src, partial.open("wb") as dst:
                for chunk in iter(lambda: src.read(8 * MiB), b""):
                    dst.write(chunk)
                    on_bytes(len(chunk))
            shutil.copystat(source, partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, target)


class Meter:
    """Bytes done out of a known total, for a :data:`Progress` callback fed from several threads: updates are
    serialised under a lock, so the callback sees a count that only grows and need not be thread-safe
    itself."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self._progress = progress
        self._lock = threading.Lock()
        self.add(0)

    def add(self, nbytes: int) -> None:
        if self._progress is None:
            return
        with self._lock:
            self.done += nbytes
            # a retried read may count some bytes twice
            self._progress(min(self.done, self.total), self.total)


def sync_tree(
    source: Path, target: Path, include: Callable[[str], bool] | None = None, progress: Progress | None = None
) -> TreeTransfer:
    files = [
        (rel, path, path.stat().st_size)
        for rel, path in walk_files(source)
        if include is None or include(rel)
    ]
    meter = Meter(sum(size for _, _, size in files), progress)
    copied = copied_bytes = 0
    for rel, path, size in files:
        destination = target.joinpath(*rel.split("/"))
        if same_files(path, destination):
            meter.add(size)
            continue
        copy_atomic(path, destination, meter.add if progress is not None else None)
        copied += 1
        copied_bytes += size
    return TreeTransfer(len(files), meter.total, copied, copied_bytes)


class PartialWriter:
    """The file object one download_many transfer writes into: ``.NAME.tpuft-part``, opened at the first byte
    (so thousands of queued downloads hold no file descriptors), checksummed as it is written, then checked
    against the listed size and CRC32C (MD5 when the object has no CRC32C) and renamed to NAME by the worker
    thread itself as the last byte lands, so a download killed midway keeps every file it completed. One
    thread writes at a time."""

    def __init__(self, blob: Blob, target: Path, url: str, meter: Meter, stop: threading.Event) -> None:
        self.blob, self.target, self.url, self.meter, self.stop = blob, target, url, meter, stop
        self.size = blob.size or 0
        self.finished = False
        self._file: IO[bytes] | None = None
        self._unreported = 0
        self._restart()

    def _restart(self) -> None:
        import google_crc32c

        self._written = 0
        self._crc = google_crc32c.Checksum()
        self._md5 = (
            hashlib.md5(usedforsecurity=False) if self.blob.crc32c is None and self.blob.md5_hash else None
        )

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise Stopped(f"{self.url}: download stopped (interrupted)")
        if self.finished:
            raise TpuftError(f"{self.url}: download: more than the {self.size} bytes listed", hint=RERUN_HINT)
        if self._file is None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._file = partial_path(self.target).open("wb")
        self._file.write(data)
        self._crc.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        self._written += len(data)
        self._unreported += len(data)
        if self._unreported >= REPORT_EVERY:
            self._report()
        if self._written >= self.size:
            self.finish()
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        """Only ``seek(0)``, which the client does to start over (a transcoded response ignores ranges)."""
        if (offset, whence) != (0, 0) or self.finished:
            raise OSError(f"{self.url}: a download can only start over from byte 0")
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()
        self._restart()
        return 0

    def finish(self) -> None:
        """Check the complete file and put it under its final name (once; a mismatch drops it and raises)."""
        if self.finished:
            return
        self.finished = True
        self._report()
        partial = partial_path(self.target)
        if self._file is None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._file = partial.open("wb")
        self._file.close()
        try:
            got_crc = base64.b64encode(self._crc.digest()).decode("ascii")
            got_md5 = base64.b64encode(self._md5.digest()).decode("ascii") if self._md5 is not None else None
            check_download(self.url, self.blob, self._written, got_crc, got_md5)
        except TpuftError:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, self.target)

    def discard(self) -> None:
        """After a failed transfer: close and drop the partial file (a file already put in place was
        checked)."""
        if self._file is not None:
            self._file.close()
        partial_path(self.target).unlink(missing_ok=True)

    def _report(self) -> None:
        self.meter.add(self._unreported)
        self._unreported = 0


class Stopped(Exception):
    """Raised into a download that was still running when the transfer was interrupted."""


def interruptible(work: Callable[[], Any], stop: threading.Event) -> Any:
    """Run ``work`` (a transfer_manager call) in a helper thread, so that Ctrl-C reaches this thread at once:
    inside transfer_manager the interrupt would wait for its pool to finish the whole queue. On Ctrl-C,
    ``stop`` makes every download still running or queued fail at its next write, and the interrupt is raised
    again once they have."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            outcome["error"] = exc

    helper = threading.Thread(target=run, name="tpuft-transfer", daemon=True)
    helper.start()
    try:
        while helper.is_alive():
            helper.join(0.25)
    except BaseException:
        stop.set()
        helper.join()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def check_download(url: str, blob: Blob, size: int, crc32c: str | None, md5: str | None) -> None:
    """Raise unless a download has the object's listed size and CRC32C (or MD5, for an object without
    CRC32C)."""
    problem = None
    if blob.size is not None and size != blob.size:
        problem = f"got {size} bytes, the object has {blob.size}"
    elif blob.crc32c is not None and crc32c is not None and crc32c != blob.crc32c:
        problem = f"crc32c {crc32c}, the object's is {blob.crc32c}"
    elif blob.crc32c is None and blob.md5_hash and md5 is not None and md5 != blob.md5_hash:
        problem = f"md5 {md5}, the object's is {blob.md5_hash}"
    if problem:
        raise TpuftError(
            f"{url}: download: checksum mismatch ({problem}); the copy was discarded",
            hint=f"{RERUN_HINT}. A repeated mismatch means the object changes while it is read, or data is "
            "corrupted",
        )


def finish_download(target: Path, failure: BaseException | None) -> None:
    """Move a complete download into place, or drop the partial file of a failed one."""
    partial = partial_path(target)
    if failure is None:
        os.replace(partial, target)
    else:
        partial.unlink(missing_ok=True)


def raise_failures(verb: str, failures: Failures, total: int) -> None:
    if not failures:
        return
    url, exc = failures[0]
    first = exc if isinstance(exc, TpuftError) else as_tpuft(exc, verb, url)
    raise TpuftError(
        f"{len(failures)} of {total} {verb}s failed (the others completed; run it again to retry "
        f"only these). First: {first.message}",
        hint=first.hint,
    ) from exc
