"""Run storage: where run directories live. A local folder for the local provider, ``gs://bucket[/prefix]`` for the
GCP provider (through google-cloud-storage), behind one small duck-typed interface so callers do not care which.

Both classes offer: ``url``, ``run_dir(run_id)``, ``run_ids()``, ``ensure_bucket(location)``, ``write_text``,
``read_text``, ``exists``, ``list``, ``folders``, ``upload_file``, ``upload_tree``, ``download_tree`` and
``fetch_tree`` (``download_tree`` with a :class:`TreeTransfer` report). Paths given to them are relative to the storage
root and always use ``/``.

Transfers skip files whose size and CRC32C already match (the checksum GCS keeps for every object; MD5 for an object
that has no CRC32C), so running an interrupted ``upload_tree``/``download_tree`` again only moves what is missing or
different. A download is written under a temporary name (``.NAME.tpuft-part``), checked against the size and checksum
GCS listed for the object, and renamed as soon as it is complete (a run killed midway keeps the files it finished), so
a file under its final name is always whole; GCS itself only shows an uploaded object once it is complete.

google-cloud-storage is imported only when a ``gs://`` storage is first used: the CLI imports this module at start-up
and most commands never touch GCS.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tpuft.errors import TpuftError, UsageError

if TYPE_CHECKING:
    from google.cloud.storage import Blob, Bucket, Client

RUNS = "runs"
PARTIAL_SUFFIX = ".tpuft-part"
"""Suffix of a file being downloaded or copied; never listed, uploaded or left under the final name."""
REGION_WARNING = "cross-region traffic is slow and billed"
EMULATOR_PROJECT = "tpuft-test"
"""Project used against ``$STORAGE_EMULATOR_HOST`` when ``$GOOGLE_CLOUD_PROJECT`` is not set."""
LOGIN_HINT = "Run: gcloud auth application-default login (on a VM, check its service account and scopes)"
MiB = 1024 * 1024
POOL_SIZE = 64
"""Connections kept open per host by a storage client: at least as many as transfer workers."""
_XML_MIN_PART = 5 * MiB
"""GCS XML multipart uploads reject parts under 5 MiB (except the last)."""
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
Failures = list[tuple[str, BaseException]]
"""``(gs:// url, exception)`` of each file a transfer could not move. (An alias: inside the storage classes the name
``list`` is their method.)"""
_RUN_STAMP = re.compile(r"-(\d{8}-\d{6})-\d+$")
"""The creation time inside a run id (``rundir.new_run_id``: ``<recipe>-YYYYmmdd-HHMMSS-<pid>``)."""
Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)`` of a tree download: called once the files are listed (0 done), then as bytes
land, from worker threads but never two at a time; files already in place count as done when they are checked."""
_REPORT_EVERY = MiB
"""A download reports its progress every this many bytes (the client writes 8 KiB at a time)."""
RERUN_HINT = "Run it again: files already complete are kept and only the rest is fetched"


@dataclass(frozen=True)
class TreeTransfer:
    """What a tree download did: the files it was asked for, and those it fetched (the others were already there
    with the same size and checksum)."""

    files: int
    total_bytes: int
    fetched: int
    fetched_bytes: int

    @property
    def skipped(self) -> int:
        return self.files - self.fetched


# ---- helpers shared by both storages -------------------------------------------------------------------------------


def clean_relpath(relpath: str) -> str:
    """``a//b/`` -> ``a/b``. A storage path never leaves the storage root, whatever a caller or object name says."""
    parts = [p for p in relpath.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UsageError(f"{relpath!r}: storage paths must stay inside the storage root (no '..')")
    return "/".join(parts)


def _join(*relpaths: str) -> str:
    return clean_relpath("/".join(relpaths))


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


def _same_content(path: Path, size: int | None, crc32c: str | None, md5: str | None = None) -> bool:
    """True when ``path`` is a file with this size and CRC32C (or MD5, for an object without a CRC32C); the checksum
    is only computed when sizes agree, and without any checksum nothing counts as the same."""
    try:
        if size is None or (crc32c is None and md5 is None) or path.stat().st_size != size or not path.is_file():
            return False
    except OSError:
        return False
    return file_crc32c(path) == crc32c if crc32c is not None else file_md5(path) == md5


def _same_files(a: Path, b: Path) -> bool:
    try:
        if not b.is_file() or a.stat().st_size != b.stat().st_size:
            return False
    except OSError:
        return False
    return file_crc32c(a) == file_crc32c(b)


def _partial(target: Path) -> Path:
    return target.with_name(f".{target.name}{PARTIAL_SUFFIX}")


def _is_partial(name: str) -> bool:
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX)


def _walk_files(folder: Path) -> list[tuple[str, Path]]:
    """``(relpath, path)`` of every file under ``folder``, sorted; symlinked folders are not followed."""
    found = []
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if _is_partial(name):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                found.append((path.relative_to(folder).as_posix(), path))
    return sorted(found)


def _target_in(folder: Path, rel: str, source: str) -> Path:
    """Where ``rel`` lands under ``folder``, refusing names (``../x``) that would land outside it."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise TpuftError(f"{source}: name {rel!r} would be written outside {folder}; refusing to download it")
    return folder.joinpath(*parts)


def _copy_atomic(source: Path, target: Path, on_bytes: Callable[[int], None] | None = None) -> None:
    """Copy through the partial name (removed again if the copy fails or is interrupted); with ``on_bytes``, 8 MiB at
    a time so a big file's progress moves."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial(target)
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


class _Meter:
    """Bytes done out of a known total, for a :data:`Progress` callback fed from several threads: updates are
    serialised under a lock, so the callback sees a count that only grows and need not be thread-safe itself."""

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
            self._progress(min(self.done, self.total), self.total)  # a retried read may count some bytes twice


def _region_warning(url: str, actual: str | None, wanted: str | None) -> str | None:
    if not wanted or not actual or actual.lower() == wanted.lower():
        return None
    return (
        f"run storage {url} is in {actual.lower()}, not {wanted.lower()} where the TPU is: {REGION_WARNING}; "
        f"consider a bucket in {wanted.lower()}"
    )


# ---- local folder --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalStorage:
    root: Path

    @property
    def url(self) -> str:
        return str(self.root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / RUNS / run_id

    def run_ids(self) -> list[str]:
        """Run ids, oldest first (ids start with the recipe name, so order by creation time)."""
        runs = self.root / RUNS
        if not runs.is_dir():
            return []
        found = [p for p in runs.iterdir() if p.is_dir()]
        return [p.name for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.name))]

    def _path(self, relpath: str) -> Path:
        clean = clean_relpath(relpath)
        return self.root.joinpath(*clean.split("/")) if clean else self.root

    def ensure_bucket(self, location: str | None = None) -> tuple[bool, str | None]:
        """Create the folder; a local folder has no region, so ``location`` is ignored and there is no warning."""
        existed = self.root.is_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        return not existed, None

    def write_text(self, relpath: str, text: str) -> None:
        """Write through a temporary file, so a reader never sees half a file."""
        target = self._path(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = _partial(target)
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)

    def read_text(self, relpath: str) -> str | None:
        try:
            return self._path(relpath).read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_bytes(self, relpath: str, *, start: int = 0) -> bytes | None:
        """The file's bytes from offset ``start`` on (for following a growing log); None if there is no file."""
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
        return [_join(start, rel) for rel, _ in _walk_files(base)]

    def folders(self, prefix: str = "") -> list[str]:
        """Names of the folders directly inside the folder ``prefix``, sorted (``checkpoints`` -> ``step_...``)."""
        base = self._path(prefix)
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    def upload_file(self, local_path: Path | str, relpath: str) -> None:
        """Copy one file in, through a temporary name (a reader never sees half of it)."""
        _copy_atomic(Path(local_path), self._path(relpath))

    def upload_tree(self, local_dir: Path | str, relprefix: str, *, workers: int = 8) -> int:
        """Copy ``local_dir`` to ``relprefix``; returns how many files were copied (unchanged ones are skipped).
        ``workers`` is accepted for the same signature as GCS; a local copy is disk-bound, so it runs serially."""
        source = Path(local_dir)
        if not source.is_dir():
            raise TpuftError(f"{source}: no such folder to upload to {self._path(relprefix)}")
        return _sync_tree(source, self._path(relprefix)).fetched

    def download_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Copy ``relprefix`` into ``local_dir``; returns how many files were copied (unchanged ones are skipped).
        ``include`` picks files by their path inside ``relprefix``."""
        return self.fetch_tree(relprefix, local_dir, workers=workers, include=include, progress=progress).fetched

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
            _Meter(0, progress)
            return TreeTransfer(0, 0, 0, 0)
        return _sync_tree(source, target, include, progress)


def _sync_tree(
    source: Path, target: Path, include: Callable[[str], bool] | None = None, progress: Progress | None = None
) -> TreeTransfer:
    files = [(rel, path, path.stat().st_size) for rel, path in _walk_files(source) if include is None or include(rel)]
    meter = _Meter(sum(size for _, _, size in files), progress)
    copied = copied_bytes = 0
    for rel, path, size in files:
        destination = target.joinpath(*rel.split("/"))
        if _same_files(path, destination):
            meter.add(size)
            continue
        _copy_atomic(path, destination, meter.add if progress is not None else None)
        copied += 1
        copied_bytes += size
    return TreeTransfer(len(files), meter.total, copied, copied_bytes)


# ---- Google Cloud Storage ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class GcsStorage:
    """``gs://bucket[/prefix]``; every path is an object name under ``prefix``. The client is made on first use."""

    bucket: str
    prefix: str = ""
    project: str | None = None
    """Project that owns (or will own) the bucket; default: the credentials' or ``$GOOGLE_CLOUD_PROJECT``."""
    sliced_threshold: int = 256 * MiB
    """Files at least this big move in ``slice_size`` pieces in parallel (XML multipart up, ranged GETs down)."""
    slice_size: int = 64 * MiB
    _client: Client | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_url(cls, url: str, *, project: str | None = None) -> GcsStorage:
        bucket, _, prefix = url.removeprefix("gs://").partition("/")
        if not _BUCKET_NAME.match(bucket):
            raise UsageError(
                f"{url}: {bucket!r} is not a valid bucket name",
                hint="Bucket names are 3-222 characters: lowercase letters, digits, '-', '_' and '.'",
            )
        return cls(bucket, clean_relpath(prefix), project)

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"

    def run_dir(self, run_id: str) -> str:
        return f"{self.url}/{RUNS}/{run_id}"

    def run_ids(self) -> list[str]:
        """Run ids, oldest first. GCS keeps no time on a "folder", so order by the time stamp inside the id."""
        folder = self._folder(RUNS)
        with _gcs_call("list runs", f"gs://{self.bucket}/{folder}"):
            pages = self._gcs().list_blobs(self.bucket, prefix=folder, delimiter="/", fields="prefixes,nextPageToken")
            for _ in pages:  # prefixes are collected while the pages are read
                pass
            ids = [p[len(folder) :].rstrip("/") for p in pages.prefixes]
        return sorted(ids, key=_run_order)

    # ---- buckets and single objects ----------------------------------------------------------------------------

    def ensure_bucket(self, location: str | None = None) -> tuple[bool, str | None]:
        """Create the bucket in ``location`` unless it exists. Returns (created, warning); the warning says when an
        existing bucket is in another region than asked, because every step would then read across regions."""
        target = f"gs://{self.bucket}"
        with _gcs_call("get bucket", target):
            bucket = self._gcs().lookup_bucket(self.bucket)
        if bucket is None:
            if self._create_bucket(location):
                return True, None
            with _gcs_call("get bucket", target):
                bucket = self._gcs().get_bucket(self.bucket)
        return False, _region_warning(target, bucket.location, location)

    def write_text(self, relpath: str, text: str) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        name = self._name(relpath)
        with _gcs_call("upload", self._url_of(name)):
            blob = self._bucket().blob(name)
            blob.upload_from_string(text.encode("utf-8"), content_type="text/plain; charset=utf-8", retry=DEFAULT_RETRY)

    def read_text(self, relpath: str) -> str | None:
        from google.api_core.exceptions import NotFound

        name = self._name(relpath)
        with _gcs_call("download", self._url_of(name)):
            try:
                data: bytes = self._bucket().blob(name).download_as_bytes()
            except NotFound:
                return None
        return data.decode("utf-8")

    def read_bytes(self, relpath: str, *, start: int = 0) -> bytes | None:
        """The object's bytes from offset ``start`` on (a ranged GET); None if there is no object."""
        from google.api_core.exceptions import NotFound, RequestRangeNotSatisfiable

        name = self._name(relpath)
        with _gcs_call("download", self._url_of(name)):
            try:
                blob = self._bucket().blob(name)
                return blob.download_as_bytes(start=start) if start else blob.download_as_bytes()
            except NotFound:
                return None
            except RequestRangeNotSatisfiable:  # nothing past the end yet
                return b""

    def exists(self, relpath: str) -> bool:
        name = self._name(relpath)
        with _gcs_call("get object", self._url_of(name)):
            return bool(self._bucket().blob(name).exists())

    def list(self, prefix: str = "") -> list[str]:
        """Objects under the folder ``prefix``, recursively, as sorted paths relative to the storage root."""
        start = clean_relpath(prefix)
        return sorted(_join(start, rel) for rel in self._objects(start))

    def folders(self, prefix: str = "") -> list[str]:
        """Names of the "folders" directly inside the folder ``prefix``, sorted: one delimited listing, however many
        objects are below them."""
        folder = self._folder(prefix)
        with _gcs_call("list folders", f"gs://{self.bucket}/{folder}"):
            pages = self._gcs().list_blobs(self.bucket, prefix=folder, delimiter="/", fields="prefixes,nextPageToken")
            for _ in pages:  # prefixes are collected while the pages are read
                pass
            return sorted(p[len(folder) :].rstrip("/") for p in pages.prefixes)

    def upload_file(self, local_path: Path | str, relpath: str) -> None:
        """Upload one file (GCS shows the object only once it is complete); big ones go in parallel slices."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        path, name = Path(local_path), self._name(relpath)
        with _gcs_call("upload", self._url_of(name)):
            if path.stat().st_size >= self.sliced_threshold:
                self._upload_sliced(path, name, workers=8)
            else:
                self._bucket().blob(name).upload_from_filename(str(path), retry=DEFAULT_RETRY)

    # ---- trees -------------------------------------------------------------------------------------------------

    def upload_tree(self, local_dir: Path | str, relprefix: str, *, workers: int = 8) -> int:
        """Upload ``local_dir`` to ``relprefix`` with ``workers`` parallel requests; returns how many files were sent
        (objects with the same size and CRC32C are skipped)."""
        source = Path(local_dir)
        if not source.is_dir():
            raise TpuftError(f"{source}: no such folder to upload to {self._url_of(self._folder(relprefix))}")
        remote = self._objects(relprefix)
        todo = [
            (path, self._name(_join(relprefix, rel)))
            for rel, path in _walk_files(source)
            if not _same_content(path, *_size_crc(remote.get(rel)))
        ]
        small = [(path, name) for path, name in todo if path.stat().st_size < self.sliced_threshold]
        large = [(path, name) for path, name in todo if path.stat().st_size >= self.sliced_threshold]
        failures = self._upload_many(small, workers)
        for path, name in large:
            try:
                self._upload_sliced(path, name, workers)
            except Exception as exc:  # noqa: BLE001 - like transfer_manager's own results: reported with the others
                failures.append((self._url_of(name), exc))
        _raise_failures("upload", failures, len(todo))
        return len(todo)

    def download_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Download ``relprefix`` into ``local_dir`` with ``workers`` parallel requests; returns how many files were
        fetched. Files already there with the same size and CRC32C are skipped, so an interrupted download resumes.
        ``include`` picks files by their path inside ``relprefix``."""
        return self.fetch_tree(relprefix, local_dir, workers=workers, include=include, progress=progress).fetched

    def fetch_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> TreeTransfer:
        """:meth:`download_tree`, reporting files and bytes (wanted, and fetched) instead of a count. Every fetched
        file is checked against the size and CRC32C (else MD5) in the listing; a mismatch drops it and fails."""
        folder = Path(local_dir)
        folder.mkdir(parents=True, exist_ok=True)
        wanted = [
            (blob, _target_in(folder, rel, self._url_of(blob.name)))
            for rel, blob in sorted(self._objects(relprefix).items())
            if include is None or include(rel)
        ]
        meter = _Meter(sum(blob.size or 0 for blob, _ in wanted), progress)
        todo = []
        for blob, target in wanted:
            if _same_content(target, blob.size, blob.crc32c, blob.md5_hash):
                meter.add(blob.size or 0)
            else:
                todo.append((blob, target))
        small = [(blob, target) for blob, target in todo if (blob.size or 0) < self.sliced_threshold]
        large = [(blob, target) for blob, target in todo if (blob.size or 0) >= self.sliced_threshold]
        failures = self._download_many(small, workers, meter) + [
            failure for blob, target in large for failure in self._download_sliced(blob, target, workers, meter)
        ]
        _raise_failures("download", failures, len(todo))
        return TreeTransfer(len(wanted), meter.total, len(todo), sum(blob.size or 0 for blob, _ in todo))

    # ---- transfers: google.cloud.storage.transfer_manager with THREAD workers (the work waits on the network, and
    # ---- threads share one client where PROCESS workers would pickle it into each process). Uploads are retried
    # ---- like downloads: sending the same bytes again is idempotent here, though GCS cannot know that. ----------

    def _upload_many(self, todo: Sequence[tuple[Path, str]], workers: int) -> Failures:
        if not todo:
            return []
        from google.cloud.storage import transfer_manager
        from google.cloud.storage.retry import DEFAULT_RETRY

        pairs = [(str(path), self._bucket().blob(name)) for path, name in todo]
        with _gcs_call("upload", self._url_of(self._folder(""))):
            results = transfer_manager.upload_many(
                pairs, upload_kwargs={"retry": DEFAULT_RETRY}, worker_type=transfer_manager.THREAD, max_workers=workers
            )
        return [(self._url_of(name), r) for (_, name), r in zip(todo, results, strict=True) if _failed(r)]

    def _upload_sliced(self, path: Path, name: str, workers: int) -> None:
        """One big file as an XML multipart upload, ``workers`` parts at a time (cancelled on failure)."""
        from google.cloud.storage import transfer_manager

        transfer_manager.upload_chunks_concurrently(
            str(path),
            self._bucket().blob(name),
            chunk_size=max(self.slice_size, _XML_MIN_PART),
            worker_type=transfer_manager.THREAD,
            max_workers=workers,
        )

    def _download_many(self, todo: Sequence[tuple[Blob, Path]], workers: int, meter: _Meter | None = None) -> Failures:
        """Each object into a :class:`_PartialWriter` (THREAD workers take file objects), which checks it and puts it
        in place from the worker as its last byte lands. ``raw_download``: the bytes as stored, which are what the
        listed size and checksums describe (no gzip transcoding)."""
        if not todo:
            return []
        from google.cloud.storage import transfer_manager

        meter, stop = meter or _Meter(0, None), threading.Event()
        writers = [_PartialWriter(blob, target, self._url_of(blob.name), meter, stop) for blob, target in todo]
        pairs = [(blob, writer) for (blob, _), writer in zip(todo, writers, strict=True)]
        try:
            with _gcs_call("download", self._url_of(self._folder(""))):
                results = _interruptible(
                    lambda: transfer_manager.download_many(
                        pairs,
                        download_kwargs={"raw_download": True},
                        worker_type=transfer_manager.THREAD,
                        max_workers=workers,
                    ),
                    stop,
                )
        except BaseException:
            for writer in writers:
                writer.discard()
            raise
        failures: Failures = []
        for writer, result in zip(writers, results, strict=True):
            try:
                if _failed(result):
                    raise result
                writer.finish()  # an empty object never calls write()
            except Exception as exc:  # noqa: BLE001 - like transfer_manager's own results: reported with the others
                writer.discard()
                failures.append((writer.url, exc))
        return failures

    def _download_sliced(self, blob: Blob, target: Path, workers: int, meter: _Meter | None = None) -> Failures:
        """One big object in ranged GETs, ``workers`` at a time; transfer_manager checks the combined CRC32C of the
        slices against the object's. Progress moves when the whole file is in."""
        from google.cloud.storage import transfer_manager

        target.parent.mkdir(parents=True, exist_ok=True)
        partial, url = _partial(target), self._url_of(blob.name)
        try:
            transfer_manager.download_chunks_concurrently(
                blob,
                str(partial),
                chunk_size=self.slice_size,
                worker_type=transfer_manager.THREAD,
                max_workers=workers,
                crc32c_checksum=blob.crc32c is not None,
            )
            got_md5 = file_md5(partial) if blob.crc32c is None and blob.md5_hash else None
            _check_download(url, blob, partial.stat().st_size, blob.crc32c, got_md5)
        except BaseException as exc:  # noqa: BLE001 - like transfer_manager's own results: reported with the others
            _finish_download(target, exc)
            if not isinstance(exc, Exception):  # Ctrl-C: the partial file is gone, the interrupt goes on
                raise
            return [(url, exc)]
        _finish_download(target, None)
        if meter is not None:
            meter.add(blob.size or 0)
        return []

    # ---- names and the client ----------------------------------------------------------------------------------

    def _name(self, relpath: str) -> str:
        name = _join(self.prefix, relpath)
        if not name or name == self.prefix:
            raise UsageError(f"{self.url}: an object path is needed, got {relpath!r}")
        return name

    def _folder(self, relprefix: str) -> str:
        """The object-name prefix of a folder: ``prefix/relprefix/`` (``""`` for the root of a bare bucket)."""
        folder = _join(self.prefix, relprefix)
        return f"{folder}/" if folder else ""

    def _url_of(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def _objects(self, relprefix: str) -> dict[str, Blob]:
        """Objects under a folder, keyed by their path inside it ("folder" placeholder objects left out)."""
        folder = self._folder(relprefix)
        with _gcs_call("list objects", f"gs://{self.bucket}/{folder}"):
            blobs = list(self._gcs().list_blobs(self.bucket, prefix=folder))
        return {blob.name[len(folder) :]: blob for blob in blobs if not blob.name.endswith("/")}

    def _bucket(self) -> Bucket:
        return self._gcs().bucket(self.bucket)

    def _gcs(self) -> Client:
        if self._client is None:
            self._client = _make_client(self.bucket, self.project)
        return self._client

    def _create_bucket(self, location: str | None) -> bool:
        """Create the bucket; False when it appeared meanwhile (409: another process made it, or it is taken)."""
        from google.api_core.exceptions import Conflict

        client = self._gcs()
        project = self.project or client.project
        if not project:
            raise TpuftError(
                f"gs://{self.bucket} does not exist and there is no project to create it in",
                hint="Set project: in the cluster file, or GOOGLE_CLOUD_PROJECT, or: gcloud config set project ID",
            )
        bucket = client.bucket(self.bucket)
        # Run storage holds checkpoints: IAM-only access, never public.
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = "enforced"
        with _gcs_call(f"create bucket in {location or 'the default location'}", f"gs://{self.bucket}"):
            try:
                client.create_bucket(bucket, location=location, project=project)
            except Conflict:
                return False
        return True


def _run_order(run_id: str) -> tuple[str, str]:
    stamp = _RUN_STAMP.search(run_id)
    return (stamp.group(1) if stamp else "", run_id)


def _size_crc(blob: Blob | None) -> tuple[int | None, str | None]:
    return (blob.size, blob.crc32c) if blob is not None else (None, None)


def _failed(result: object) -> bool:
    return isinstance(result, BaseException)


class _PartialWriter:
    """The file object one download_many transfer writes into: ``.NAME.tpuft-part``, opened at the first byte (so
    thousands of queued downloads hold no file descriptors), checksummed as it is written, then checked against the
    listed size and CRC32C (MD5 when the object has no CRC32C) and renamed to NAME by the worker thread itself as the
    last byte lands, so a download killed midway keeps every file it completed. One thread writes at a time."""

    def __init__(self, blob: Blob, target: Path, url: str, meter: _Meter, stop: threading.Event) -> None:
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
        self._md5 = hashlib.md5(usedforsecurity=False) if self.blob.crc32c is None and self.blob.md5_hash else None

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise _Stopped(f"{self.url}: download stopped (interrupted)")
        if self.finished:
            raise TpuftError(f"{self.url}: download: more than the {self.size} bytes listed", hint=RERUN_HINT)
        if self._file is None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._file = _partial(self.target).open("wb")
        self._file.write(data)
        self._crc.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        self._written += len(data)
        self._unreported += len(data)
        if self._unreported >= _REPORT_EVERY:
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
        partial = _partial(self.target)
        if self._file is None:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._file = partial.open("wb")
        self._file.close()
        try:
            got_crc = base64.b64encode(self._crc.digest()).decode("ascii")
            got_md5 = base64.b64encode(self._md5.digest()).decode("ascii") if self._md5 is not None else None
            _check_download(self.url, self.blob, self._written, got_crc, got_md5)
        except TpuftError:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, self.target)

    def discard(self) -> None:
        """After a failed transfer: close and drop the partial file (a file already put in place was checked)."""
        if self._file is not None:
            self._file.close()
        _partial(self.target).unlink(missing_ok=True)

    def _report(self) -> None:
        self.meter.add(self._unreported)
        self._unreported = 0


class _Stopped(Exception):
    """Raised into a download that was still running when the transfer was interrupted."""


def _interruptible(work: Callable[[], Any], stop: threading.Event) -> Any:
    """Run ``work`` (a transfer_manager call) in a helper thread, so that Ctrl-C reaches this thread at once: inside
    transfer_manager the interrupt would wait for its pool to finish the whole queue. On Ctrl-C, ``stop`` makes every
    download still running or queued fail at its next write, and the interrupt is raised again once they have."""
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


def _check_download(url: str, blob: Blob, size: int, crc32c: str | None, md5: str | None) -> None:
    """Raise unless a download has the object's listed size and CRC32C (or MD5, for an object without CRC32C)."""
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
            hint=f"{RERUN_HINT}. A repeated mismatch means the object changes while it is read, or data is corrupted",
        )


def _finish_download(target: Path, failure: BaseException | None) -> None:
    """Move a complete download into place, or drop the partial file of a failed one."""
    partial = _partial(target)
    if failure is None:
        os.replace(partial, target)
    else:
        partial.unlink(missing_ok=True)


def _raise_failures(verb: str, failures: Failures, total: int) -> None:
    if not failures:
        return
    url, exc = failures[0]
    first = exc if isinstance(exc, TpuftError) else _as_tpuft(exc, verb, url)
    raise TpuftError(
        f"{len(failures)} of {total} {verb}s failed (the others completed; run it again to retry only these). "
        f"First: {first.message}",
        hint=first.hint,
    ) from exc


def _make_client(bucket: str, project: str | None) -> Client:
    """A storage client: anonymous against ``$STORAGE_EMULATOR_HOST``, else Application Default Credentials."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        # google-cloud-storage itself sends every request (JSON, media and XML API) to the emulator's address.
        project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
        return _widen_pool(storage.Client(project=project, credentials=AnonymousCredentials()))

    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, default_project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.full_control"]
        )
    except DefaultCredentialsError as exc:
        raise TpuftError(f"gs://{bucket}: no Google Cloud credentials found ({exc})", hint=LOGIN_HINT) from None
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or default_project
    return _widen_pool(storage.Client(project=project, credentials=credentials))


def _widen_pool(client: Client) -> Client:
    """Keep up to :data:`POOL_SIZE` connections per host instead of requests' 10: with more transfer workers than
    that, each extra connection was closed after one request ("Connection pool is full, discarding connection") and
    the next request paid a new TCP and TLS handshake. A mutual-TLS adapter, if one is configured, is left alone."""
    from requests.adapters import HTTPAdapter

    session = client._http
    for scheme in ("https://", "http://"):
        if type(session.adapters.get(scheme)) is HTTPAdapter:
            session.mount(scheme, HTTPAdapter(pool_maxsize=POOL_SIZE))
    return client


@contextmanager
def _gcs_call(call: str, target: str) -> Iterator[None]:
    """Turn what google-cloud-storage raises into a :class:`TpuftError` that names the object and the call."""
    try:
        yield
    except TpuftError:
        raise
    except Exception as exc:
        raise _as_tpuft(exc, call, target) from exc


def _as_tpuft(exc: BaseException, call: str, target: str) -> TpuftError:
    bucket = "gs://" + target.removeprefix("gs://").split("/", 1)[0]
    for kind, explain in _EXPLAINERS:
        if kind(exc):
            message, hint = explain(exc, bucket)
            return TpuftError(f"{target}: {call}: {message}", hint=hint)
    return TpuftError(f"{target}: {call} failed: {type(exc).__name__}: {exc}")


def _api_error(code: int) -> Callable[[BaseException], bool]:
    def check(exc: BaseException) -> bool:
        from google.api_core.exceptions import GoogleAPICallError

        return isinstance(exc, GoogleAPICallError) and exc.code == code

    return check


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return str(text).strip().splitlines()[0] if str(text).strip() else type(exc).__name__


def _is_auth_error(exc: BaseException) -> bool:
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    return isinstance(exc, RefreshError | DefaultCredentialsError) or _api_error(401)(exc)


def _is_corruption(exc: BaseException) -> bool:
    try:
        from google.cloud.storage.exceptions import DataCorruption
    except ImportError:  # google-cloud-storage 2.x (worker venvs may have it): google-resumable-media's
        from google.resumable_media import DataCorruption
    return isinstance(exc, DataCorruption)


def _is_bad_response(exc: BaseException) -> bool:
    try:
        from google.cloud.storage.exceptions import InvalidResponse
    except ImportError:  # google-cloud-storage 2.x
        from google.resumable_media import InvalidResponse
    return isinstance(exc, InvalidResponse)


def _is_connection_error(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def _is_api_error(exc: BaseException) -> bool:
    from google.api_core.exceptions import GoogleAPICallError

    return isinstance(exc, GoogleAPICallError)


def _status_of(exc: BaseException) -> str:
    response: Any = getattr(exc, "response", None)
    return f"HTTP {getattr(response, 'status_code', '?')}"


_EXPLAINERS: list[tuple[Callable[[BaseException], bool], Callable[[BaseException, str], tuple[str, str | None]]]] = [
    (
        _api_error(404),
        lambda e, b: (
            f"not found ({_message(e)})",
            f"Check the cluster's bucket setting; `tpuft up` creates {b} when it is missing",
        ),
    ),
    (
        _api_error(403),
        lambda e, b: (
            f"permission denied ({_message(e)})",
            (
                f"The account in use needs roles/storage.objectAdmin on {b} (roles/storage.admin to create it). "
                "Bucket names are global: if another project owns this one, choose another name"
            ),
        ),
    ),
    (_is_auth_error, lambda e, b: (f"credentials were refused or have expired ({_message(e)})", LOGIN_HINT)),
    (
        _api_error(409),
        lambda e, b: (f"conflict ({_message(e)})", "Bucket names are global: another project may own this one"),
    ),
    (
        _api_error(429),
        lambda e, b: (f"rate limited ({_message(e)})", "Use fewer workers, or retry in a minute"),
    ),
    (
        _is_corruption,
        lambda e, b: ("checksum mismatch, the copy was discarded", "Run it again; a repeated mismatch is a bug"),
    ),
    (_is_bad_response, lambda e, b: (f"unexpected answer {_status_of(e)} ({_message(e)})", None)),
    (
        _is_connection_error,
        lambda e, b: (f"cannot reach Cloud Storage ({type(e).__name__})", "Check the network (and a proxy, if any)"),
    ),
    (_is_api_error, lambda e, b: (f"failed: {_message(e)}", None)),
]


def open_storage(url: str, *, project: str | None = None) -> LocalStorage | GcsStorage:
    """``gs://bucket[/prefix]`` -> :class:`GcsStorage` (``project`` owns the bucket); anything else is a folder."""
    if url.startswith("gs://"):
        return GcsStorage.from_url(url, project=project)
    return LocalStorage(Path(url).expanduser())
