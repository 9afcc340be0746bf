"""Run storage in ``gs://bucket[/prefix]`` through google-cloud-storage (and its transfer_manager for trees).

google-cloud-storage is imported only when a ``gs://`` storage is first used: the CLI imports this package at
start-up and most commands never touch GCS. Every call passes a retry that ends with the command's network
budget (:func:`_retry`, :mod:`tpuft.storage.network`), and the client's sessions bound each request and token
refresh.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.core.errors import TpuftError, UsageError
from tpuft.storage.base import (
    RUNS,
    Failures,
    MiB,
    Progress,
    TreeDownloads,
    TreeTransfer,
    clean_relpath,
    join_relpath,
    run_order,
)
from tpuft.storage.errors import LOGIN_HINT, gcs_call
from tpuft.storage.network import CLOCK, budget_session
from tpuft.storage.transfer import (
    Meter,
    PartialWriter,
    check_download,
    file_md5,
    finish_download,
    interruptible,
    partial_path,
    raise_failures,
    same_content,
    target_in,
    walk_files,
)

if TYPE_CHECKING:
    from google.cloud.storage import Blob, Bucket, Client


REGION_WARNING = "cross-region traffic is slow and billed"
EMULATOR_PROJECT = "tpuft-test"
"""Project used against ``$STORAGE_EMULATOR_HOST`` when ``$GOOGLE_CLOUD_PROJECT`` is not set."""
POOL_SIZE = 64
"""Connections kept open per host by a storage client: at least as many as transfer workers."""
_XML_MIN_PART = 5 * MiB
"""GCS XML multipart uploads reject parts under 5 MiB (except the last)."""
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


def _region_warning(url: str, actual: str | None, wanted: str | None) -> str | None:
    if not wanted or not actual or actual.lower() == wanted.lower():
        return None
    return (
        f"run storage {url} is in {actual.lower()}, not {wanted.lower()} where the TPU is: {REGION_WARNING}; "
        f"consider a bucket in {wanted.lower()}"
    )


@dataclass(eq=False)
class GcsStorage(TreeDownloads):
    """``gs://bucket[/prefix]``; every path is an object name under ``prefix``. The client is made on first
    use."""

    bucket: str
    prefix: str = ""
    project: str | None = None
    """Project that owns (or will own) the bucket; default: the credentials' or ``$GOOGLE_CLOUD_PROJECT``."""
    sliced_threshold: int = 256 * MiB
    """Files at least this big move in ``slice_size`` pieces in parallel (XML multipart up, ranged GETs
    down)."""
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
    def local_root(self) -> None:
        """Not on this machine."""
        return None

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"

    def run_dir(self, run_id: str) -> str:
        return f"{self.url}/{RUNS}/{run_id}"

    def run_ids(self) -> list[str]:
        """Run ids, oldest first. GCS keeps no time on a "folder", so order by the time stamp inside the
        id."""
        folder = self._folder(RUNS)
        with self._call("list runs", f"gs://{self.bucket}/{folder}"):
            pages = self._gcs().list_blobs(
                self.bucket, prefix=folder, delimiter="/", fields="prefixes,nextPageToken", retry=_retry()
            )
            for _ in pages:  # prefixes are collected while the pages are read
                pass
            ids = [p[len(folder) :].rstrip("/") for p in pages.prefixes]
        return sorted(ids, key=run_order)

    # ---- buckets and single objects -----------------------------------------------------------------------

    def ensure_bucket(self, location: str | None = None) -> tuple[bool, str | None]:
        """Create the bucket in ``location`` unless it exists. Returns (created, warning); the warning says
        when an existing bucket is in another region than asked, because every step would then read across
        regions."""
        target = f"gs://{self.bucket}"
        with self._call("get bucket", target):
            bucket = self._gcs().lookup_bucket(self.bucket, retry=_retry())
        if bucket is None:
            if self._create_bucket(location):
                return True, None
            with self._call("get bucket", target):
                bucket = self._gcs().get_bucket(self.bucket, retry=_retry())
        return False, _region_warning(target, bucket.location, location)

    def write_text(self, relpath: str, text: str) -> None:
        name = self._name(relpath)
        with self._call("upload", self._url_of(name)):
            blob = self._bucket().blob(name)
            blob.upload_from_string(
                text.encode("utf-8"), content_type="text/plain; charset=utf-8", retry=_retry()
            )

    def read_text(self, relpath: str) -> str | None:
        from google.api_core.exceptions import NotFound

        name = self._name(relpath)
        with self._call("download", self._url_of(name)):
            try:
                data: bytes = self._bucket().blob(name).download_as_bytes(retry=_retry())
            except NotFound:
                return None
        return data.decode("utf-8")

    def read_versioned(self, relpath: str) -> tuple[str | None, str]:
        """The object's text and generation ("0": no object), read as one: the bytes of exactly that
        generation."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        name = self._name(relpath)
        with self._call("download", self._url_of(name)):
            for _ in range(5):  # rewritten between the two calls: read the newer one
                blob = self._bucket().get_blob(name, retry=_retry())
                if blob is None:
                    return None, "0"
                try:
                    data: bytes = blob.download_as_bytes(if_generation_match=blob.generation, retry=_retry())
                except (NotFound, PreconditionFailed):
                    continue
                return data.decode("utf-8"), str(blob.generation)
        raise TpuftError(f"{self._url_of(name)}: rewritten faster than it can be read (5 tries)")

    def write_text_if(self, relpath: str, text: str, version: str) -> str | None:
        """An upload with ``ifGenerationMatch`` (0: only if there is no object), which GCS applies
        atomically."""
        from google.api_core.exceptions import PreconditionFailed

        name = self._name(relpath)
        with self._call("upload", self._url_of(name)):
            blob = self._bucket().blob(name)
            try:
                blob.upload_from_string(
                    text.encode("utf-8"),
                    content_type="text/plain; charset=utf-8",
                    if_generation_match=int(version),
                    retry=_retry(),  # the generation is given: safe to retry
                )
            except PreconditionFailed:
                return None
        return str(blob.generation)

    def read_bytes(self, relpath: str, *, start: int = 0) -> bytes | None:
        """The object's bytes from offset ``start`` on (a ranged GET); None if there is no object."""
        from google.api_core.exceptions import NotFound, RequestRangeNotSatisfiable

        name = self._name(relpath)
        with self._call("download", self._url_of(name)):
            try:
                blob = self._bucket().blob(name)
                return (
                    blob.download_as_bytes(start=start, retry=_retry())
                    if start
                    else blob.download_as_bytes(retry=_retry())
                )
            except NotFound:
                return None
            except RequestRangeNotSatisfiable:  # nothing past the end yet
                return b""

    def exists(self, relpath: str) -> bool:
        name = self._name(relpath)
        with self._call("get object", self._url_of(name)):
            return bool(self._bucket().blob(name).exists(retry=_retry()))

    def list(self, prefix: str = "") -> list[str]:
        """Objects under the folder ``prefix``, recursively, as sorted paths relative to the storage root."""
        start = clean_relpath(prefix)
        return sorted(join_relpath(start, rel) for rel in self._objects(start))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Objects under the folder ``prefix``, recursively, with their sizes in bytes: one listing, no object
        read. An object exists only once its upload is complete, so a size here is the whole object's."""
        start = clean_relpath(prefix)
        return {join_relpath(start, rel): int(blob.size or 0) for rel, blob in self._objects(start).items()}

    def folders(self, prefix: str = "") -> list[str]:
        """Names of the "folders" directly inside the folder ``prefix``, sorted: one delimited listing,
        however many objects are below them."""
        folder = self._folder(prefix)
        with self._call("list folders", f"gs://{self.bucket}/{folder}"):
            pages = self._gcs().list_blobs(
                self.bucket, prefix=folder, delimiter="/", fields="prefixes,nextPageToken", retry=_retry()
            )
            for _ in pages:  # prefixes are collected while the pages are read
                pass
            return sorted(p[len(folder) :].rstrip("/") for p in pages.prefixes)

    def upload_file(self, local_path: Path | str, relpath: str) -> None:
        """Upload one file (GCS shows the object only once it is complete); big ones go in parallel slices."""
        path, name = Path(local_path), self._name(relpath)
        with self._call("upload", self._url_of(name)):
            if path.stat().st_size >= self.sliced_threshold:
                self._upload_sliced(path, name, workers=8)
            else:
                self._bucket().blob(name).upload_from_filename(str(path), retry=_retry())

    # ---- trees --------------------------------------------------------------------------------------------

    def remove_tree(self, relprefix: str) -> int:
        if not clean_relpath(relprefix):
            return 0  # never the whole bucket
        blobs = self._objects(clean_relpath(relprefix))
        for blob in blobs.values():
            with self._call("delete", self._url_of(blob.name)):
                blob.delete(retry=_retry())
        return len(blobs)

    def upload_tree(self, local_dir: Path | str, relprefix: str, *, workers: int = 8) -> int:
        """Upload ``local_dir`` to ``relprefix`` with ``workers`` parallel requests; returns how many files
        were sent (objects with the same size and CRC32C are skipped)."""
        source = Path(local_dir)
        if not source.is_dir():
            raise TpuftError(f"{source}: no such folder to upload to {self._url_of(self._folder(relprefix))}")
        remote = self._objects(relprefix)
        todo = [
            (path, self._name(join_relpath(relprefix, rel)))
            for rel, path in walk_files(source)
            if not same_content(path, *_size_crc(remote.get(rel)))
        ]
        small = [(path, name) for path, name in todo if path.stat().st_size < self.sliced_threshold]
        large = [(path, name) for path, name in todo if path.stat().st_size >= self.sliced_threshold]
        failures = self._upload_many(small, workers)
        for path, name in large:
            try:
                self._upload_sliced(path, name, workers)
            except Exception as exc:  # noqa: BLE001 - reported with the others, as transfer_manager's are
                failures.append((self._url_of(name), exc))
        raise_failures("upload", failures, len(todo))
        return len(todo)

    def fetch_tree(
        self,
        relprefix: str,
        local_dir: Path | str,
        *,
        workers: int = 8,
        include: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> TreeTransfer:
        """:meth:`download_tree`, reporting files and bytes (wanted, and fetched) instead of a count. Every
        fetched file is checked against the size and CRC32C (else MD5) in the listing; a mismatch drops it and
        fails."""
        folder = Path(local_dir)
        folder.mkdir(parents=True, exist_ok=True)
        wanted = [
            (blob, target_in(folder, rel, self._url_of(blob.name)))
            for rel, blob in sorted(self._objects(relprefix).items())
            if include is None or include(rel)
        ]
        meter = Meter(sum(blob.size or 0 for blob, _ in wanted), progress)
        todo = []
        for blob, target in wanted:
            if same_content(target, blob.size, blob.crc32c, blob.md5_hash):
                meter.add(blob.size or 0)
            else:
                todo.append((blob, target))
        small = [(blob, target) for blob, target in todo if (blob.size or 0) < self.sliced_threshold]
        large = [(blob, target) for blob, target in todo if (blob.size or 0) >= self.sliced_threshold]
        failures = self._download_many(small, workers, meter) + [
            failure
            for blob, target in large
            for failure in self._download_sliced(blob, target, workers, meter)
        ]
        raise_failures("download", failures, len(todo))
        return TreeTransfer(len(wanted), meter.total, len(todo), sum(blob.size or 0 for blob, _ in todo))

    # ---- transfers: google.cloud.storage.transfer_manager with THREAD workers (the work waits on the
    # network, and
    # ---- threads share one client where PROCESS workers would pickle it into each process). Uploads are
    # retried
    # ---- like downloads: sending the same bytes again is idempotent here, though GCS cannot know that. -----

    def _upload_many(self, todo: Sequence[tuple[Path, str]], workers: int) -> Failures:
        if not todo:
            return []
        from google.cloud.storage import transfer_manager

        pairs = [(str(path), self._bucket().blob(name)) for path, name in todo]
        with self._call("upload", self._url_of(self._folder("")), wait=False):
            results = transfer_manager.upload_many(
                pairs,
                upload_kwargs={"retry": _retry()},
                worker_type=transfer_manager.THREAD,
                max_workers=workers,
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
            retry=_retry(),
        )

    def _download_many(
        self, todo: Sequence[tuple[Blob, Path]], workers: int, meter: Meter | None = None
    ) -> Failures:
        """Each object into a :class:`PartialWriter` (THREAD workers take file objects), which checks it and
        puts it in place from the worker as its last byte lands. ``raw_download``: the bytes as stored, which
        are what the listed size and checksums describe (no gzip transcoding)."""
        if not todo:
            return []
        from google.cloud.storage import transfer_manager

        meter, stop = meter or Meter(0, None), threading.Event()
        writers = [PartialWriter(blob, target, self._url_of(blob.name), meter, stop) for blob, target in todo]
        pairs = [(blob, writer) for (blob, _), writer in zip(todo, writers, strict=True)]
        try:
            with self._call("download", self._url_of(self._folder("")), wait=False):
                results = interruptible(
                    lambda: transfer_manager.download_many(
                        pairs,
                        download_kwargs={"raw_download": True, "retry": _retry()},
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
            except Exception as exc:  # noqa: BLE001 - reported with the others, as transfer_manager's are
                writer.discard()
                failures.append((writer.url, exc))
        return failures

    def _download_sliced(
        self, blob: Blob, target: Path, workers: int, meter: Meter | None = None
    ) -> Failures:
        """One big object in ranged GETs, ``workers`` at a time; transfer_manager checks the combined CRC32C
        of the slices against the object's. Progress moves when the whole file is in."""
        from google.cloud.storage import transfer_manager

        target.parent.mkdir(parents=True, exist_ok=True)
        partial, url = partial_path(target), self._url_of(blob.name)
        try:
            transfer_manager.download_chunks_concurrently(
                blob,
                str(partial),
                chunk_size=self.slice_size,
                worker_type=transfer_manager.THREAD,
                max_workers=workers,
                crc32c_checksum=blob.crc32c is not None,
                download_kwargs={"retry": _retry()},
            )
            got_md5 = file_md5(partial) if blob.crc32c is None and blob.md5_hash else None
            check_download(url, blob, partial.stat().st_size, blob.crc32c, got_md5)
        except BaseException as exc:  # like transfer_manager's own results: reported with the others
            finish_download(target, exc)
            if not isinstance(exc, Exception):  # Ctrl-C: the partial file is gone, the interrupt goes on
                raise
            return [(url, exc)]
        finish_download(target, None)
        if meter is not None:
            meter.add(blob.size or 0)
        return []

    # ---- names and the client -----------------------------------------------------------------------------

    def _name(self, relpath: str) -> str:
        name = join_relpath(self.prefix, relpath)
        if not name or name == self.prefix:
            raise UsageError(f"{self.url}: an object path is needed, got {relpath!r}")
        return name

    def _folder(self, relprefix: str) -> str:
        """The object-name prefix of a folder: ``prefix/relprefix/`` (``""`` for the root of a bare
        bucket)."""
        folder = join_relpath(self.prefix, relprefix)
        return f"{folder}/" if folder else ""

    def _url_of(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"

    def _objects(self, relprefix: str) -> dict[str, Blob]:
        """Objects under a folder, keyed by their path inside it ("folder" placeholder objects left out)."""
        folder = self._folder(relprefix)
        with self._call("list objects", f"gs://{self.bucket}/{folder}"):
            blobs = list(self._gcs().list_blobs(self.bucket, prefix=folder, retry=_retry()))
        return {blob.name[len(folder) :]: blob for blob in blobs if not blob.name.endswith("/")}

    def _call(self, call: str, target: str, *, wait: bool = True) -> AbstractContextManager[None]:
        """:func:`gcs_call` with this storage's project, which a refusal's fix names."""
        return gcs_call(call, target, project=self.project, wait=wait)

    def _bucket(self) -> Bucket:
        return self._gcs().bucket(self.bucket)

    def _gcs(self) -> Client:
        if self._client is None:
            self._client = _make_client(self.bucket, self.project)
        return self._client

    def _create_bucket(self, location: str | None) -> bool:
        """Create the bucket; False when it appeared meanwhile (409: another process made it, or it is
        taken)."""
        from google.api_core.exceptions import Conflict

        client = self._gcs()
        project = self.project or client.project
        if not project:
            raise TpuftError(
                f"gs://{self.bucket} does not exist and there is no project to create it in",
                hint="Set project: in the cluster file, or GOOGLE_CLOUD_PROJECT, or: gcloud config set "
                "project ID",
            )
        bucket = client.bucket(self.bucket)
        # Run storage holds checkpoints: IAM-only access, never public.
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = "enforced"
        with self._call(f"create bucket in {location or 'the default location'}", f"gs://{self.bucket}"):
            try:
                client.create_bucket(bucket, location=location, project=project, retry=_retry())
            except Conflict:
                return False
        return True


def _size_crc(blob: Blob | None) -> tuple[int | None, str | None]:
    return (blob.size, blob.crc32c) if blob is not None else (None, None)


def _failed(result: object) -> bool:
    return isinstance(result, BaseException)


def _make_client(bucket: str, project: str | None) -> Client:
    """A storage client: anonymous against ``$STORAGE_EMULATOR_HOST``, else Application Default
    Credentials."""
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        # google-cloud-storage itself sends every request (JSON, media and XML API) to the emulator's address.
        project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
        return _budgeted(storage.Client(project=project, credentials=AnonymousCredentials()))

    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, default_project = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.full_control"]
        )
    except DefaultCredentialsError as exc:
        raise TpuftError(
            f"gs://{bucket}: no Google Cloud credentials found ({exc})", hint=LOGIN_HINT
        ) from None
    project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or default_project
    return _budgeted(storage.Client(project=project, credentials=credentials))


def _budgeted(client: Client) -> Client:
    """The client's sessions (requests, and google-auth's token refreshes) under the network budget, keeping
    up to
    :data:`POOL_SIZE` connections per host instead of requests' 10: with more transfer workers than that, each
    extra connection was closed after one request ("Connection pool is full, discarding connection") and the
    next request paid a new TCP and TLS handshake. A mutual-TLS adapter, if one is configured, is left
    alone."""
    budget_session(client._http, "Cloud Storage", pool_maxsize=POOL_SIZE)
    return client


def _retry() -> Any:
    """Storage's default retry, ending where the command's network budget does (the library's own 120 s where
    no budget is armed: on the workers)."""
    from google.cloud.storage.retry import DEFAULT_RETRY

    deadline = CLOCK.retry_deadline()
    if deadline is None:
        return DEFAULT_RETRY
    # Pauses of at most 5 s: the library gives up when its next pause would pass the deadline, and its pauses
    # grow to 60 s, which ended some calls at a third of the budget.
    return DEFAULT_RETRY.with_timeout(deadline).with_delay(initial=1.0, maximum=5.0, multiplier=2.0)
