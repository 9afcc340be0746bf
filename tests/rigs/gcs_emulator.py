"""A local Google Cloud Storage that the real ``google-cloud-storage`` client talks to: the
``gcp-storage-emulator`` package from PyPI (pure Python, in-memory) served on 127.0.0.1, plus the few things
tpuft needs that it lacks.

Nothing here reaches Google. Test dependency: ``gcp-storage-emulator>=2026.7.19`` (verified with 2026.7.19 and
google-cloud-storage 3.17, google-api-core 2.44).

Connecting the real client
--------------------------
Setting ``STORAGE_EMULATOR_HOST`` (scheme included) is all google-cloud-storage 3.x needs::

    with GcsEmulator() as gcs:
        os.environ.update(gcs.env())             # {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:PORT"}
        client = storage.Client(project="test", credentials=AnonymousCredentials())

``Client.__init__`` takes ``api_endpoint`` from ``client_options`` first, else from ``STORAGE_EMULATOR_HOST``;
it then uses that endpoint for the JSON API, media uploads/downloads and the XML API alike, and with the
variable set it falls back to ``AnonymousCredentials`` and ``$GOOGLE_CLOUD_PROJECT`` on its own.
``client_options={"api_endpoint": ...}`` is therefore not needed (it also works, but without the variable
``Client`` would look for real credentials).

tensorstore (Orbax's arrays) takes ``TENSORSTORE_GCS_HTTP_URL`` (this endpoint) and
``GOOGLE_AUTH_TOKEN_FOR_TESTING``; TensorFlow's GCS filesystem cannot be pointed anywhere but Google, and
reaches this emulator through the TLS proxy of ``tests/rigs/gcs_proxy.py``, whose ``env()`` gives a process
all of these variables.

What the emulator does faithfully (checked against the real client)
-------------------------------------------------------------------
* Buckets: create, get, 404 -> ``NotFound``, duplicate create -> 409 ``Conflict``.
* Objects: simple, multipart and resumable JSON uploads (a 12 MiB resumable upload included), downloads with
  ``x-goog-hash`` (the client verifies crc32c on download), ranged GETs, ``exists``, delete, 404 ->
  ``NotFound``.
* ``blob.crc32c`` / ``blob.md5_hash`` are base64 of the big-endian CRC32C / MD5, the same as GCS and as
  ``base64(google_crc32c.Checksum(data).digest())``.
* ``list_blobs`` with ``prefix`` and ``delimiter`` (``iterator.prefixes`` after the pages are consumed).
* ``transfer_manager.upload_many[_from_filenames]``, ``download_many[_to_path]`` and
  ``download_chunks_concurrently``.

Gaps, and what this rig does about them
---------------------------------------
* **Bucket location is ignored** (every bucket comes back ``US`` / ``multi-region``). The rig answers bucket
  inserts itself: it keeps ``location`` upper-cased as GCS does (``us-east1`` -> ``US-EAST1``), sets
  ``locationType`` (``region`` / ``dual-region`` / ``multi-region``) and keeps ``storageClass`` and
  ``iamConfiguration``.
* **No XML multipart upload** (``POST /bucket/object?uploads`` answers 501), which
  ``transfer_manager.upload_chunks_concurrently`` uses. The rig implements initiate / upload part / complete /
  abort with GCS's rules: parts are checked against the client's ``x-goog-hash``, answer an ``ETag`` and
  ``x-goog-hash``, every part but the last must be at least 5 MiB (``EntityTooSmall``), and the finished
  object has a crc32c but no md5 (like every composite object on GCS).
* **One request at a time**: the emulator's ``HTTPServer`` is single-threaded with a listen backlog of 5, so
  eight transfer_manager workers overflowed it and the kernel dropped SYNs (each costing a 1 s retransmit).
  The rig serves the emulator's own handler from an ``HTTPServer`` with a deep backlog instead: requests still
  run one at a time (the emulator's store is not thread-safe), but nobody waits for a retransmit.
* **Media downloads lack the object's generation headers** (``x-goog-generation``, ``x-goog-metageneration``,
  ``x-goog-stored-content-length``), which GCS sends with every object body and tensorstore's gcs kvstore
  needs: without them OCDBT (Orbax's checkpoint format, written by T5X) fails with "Malformed
  StorageGeneration". The rig adds them to every 2xx media download (JSON API ``?alt=media``,
  ``/download/storage/v1/...`` and the XML API's ``GET /BUCKET/OBJECT``).
* **An empty ``uploadType=media`` upload crashes the emulator** (it takes ``len()`` of a missing body):
  TensorFlow's GCS filesystem writes such zero-byte ``dir/`` markers in ``makedirs`` and retries the 500 for
  ever. The rig stores the empty object itself.
* **Preconditions are ignored** by the emulator: every conditional write succeeds. The rig answers uploads
  with ``ifGenerationMatch`` itself (412 ``conditionNotMet`` when the object is at another generation, 0
  meaning "must not exist"), which the recovery watcher's lease relies on; the other preconditions stay
  ignored (harmless while each object has one writer at a time, as in the runs these rigs host: Orbax's hosts
  write their own OCDBT files).
* An object's ``mediaLink`` names the host of the request that uploaded it (the ``Host`` header): a front that
  forwards requests here must send the emulator's own address (``tests/rigs/gcs_proxy.py`` does).
* Not emulated at all, and not used by tpuft: IAM enforcement (everything is allowed, so ``Forbidden`` cannot
  be provoked), object versioning, requester pays, retention policies.

Test controls: ``reset()`` (drop all buckets, objects, uploads and faults), ``requests`` (``(method, path)``
of every request, for asserting that a resumed transfer sent nothing), ``fail(method, path_contains, status)``
and ``reset_faults()`` (answer matching requests with a GCS-shaped JSON error, e.g. 403 for one object's media
GET, with the JSON API's ``reason`` and Google's ``details`` when given: ``accessNotConfigured`` for a
disabled API, ``accountDisabled`` for billing, ``quotaExceeded``; use 4xx codes: google-cloud-storage retries
429/5xx for up to two minutes), ``client()`` (a client bound
to this emulator).
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from http.server import HTTPServer
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, unquote, urlsplit
from xml.etree import ElementTree

import google_crc32c
from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets as emulator_buckets
from gcp_storage_emulator.handlers import objects as emulator_objects
from gcp_storage_emulator.server import RequestHandler
from gcp_storage_emulator.storage import Storage

if TYPE_CHECKING:
    from google.cloud.storage import Client
    from typing_extensions import Self

S3_NS: Final = "http://s3.amazonaws.com/doc/2006-03-01/"
MIN_PART_SIZE: Final = 5 * 1024 * 1024
"""GCS XML multipart uploads: every part except the last must be at least 5 MiB."""
_REGION: Final = re.compile(r"^[a-z]+-[a-z]+\d+$")
_DUAL_REGIONS: Final = {"nam4", "eur4", "asia1"}
_OBJECT_PATH: Final = re.compile(r"^/(?P<bucket>[-.\w]+)/(?P<object>.+)$")
_MEDIA_UPLOAD_PATH: Final = re.compile(r"^(?:/upload)?(?:/storage/v1)?/b/(?P<bucket>[-.\w]+)/o$")


@dataclass
class _Multipart:
    """An XML multipart upload in progress: what ``initiate`` said, and the parts received so far."""

    bucket: str
    name: str
    content_type: str
    metadata: dict[str, str]
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)
    """part number -> (bytes, quoted md5 hex ETag)"""


def _not_a_404(record: logging.LogRecord) -> bool:
    """The emulator logs every missing object at ERROR, in two records (a polled ``stop.json`` makes hundreds
    a run); a 404 is an answer, not an error: dropped, so that a failing test's captured log shows what
    matters."""
    return not (record.msg == "Resource not found:" or isinstance(record.msg, OSError))


logging.getLogger("gcp_storage_emulator.storage").addFilter(_not_a_404)


def _crc32c_b64(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode("ascii")


def _location_type(location: str) -> str:
    lowered = location.lower()
    if _REGION.match(lowered):
        return "region"
    return "dual-region" if lowered in _DUAL_REGIONS else "multi-region"


class _Server(HTTPServer):
    """The emulator's request handler behind a deep listen backlog (see "One request at a time" above)."""

    request_queue_size = 256
    rig: GcsEmulator


class _Handler(RequestHandler):
    """The emulator's router, with bucket inserts and XML multipart uploads answered by the rig first."""

    server: _Server

    def do_POST(self) -> None:
        self._record("POST")
        if self._injected_fault("POST"):
            return
        if not (
            self._bucket_insert()
            or self._multipart("POST")
            or self._failed_precondition()
            or self._empty_media_upload()
        ):
            super().do_POST()

    def do_PUT(self) -> None:
        self._record("PUT")
        if self._injected_fault("PUT"):
            return
        if not self._multipart("PUT"):
            super().do_PUT()

    def do_DELETE(self) -> None:
        self._record("DELETE")
        if self._injected_fault("DELETE"):
            return
        if not self._multipart("DELETE"):
            super().do_DELETE()

    def do_GET(self) -> None:
        self._record("GET")
        if self._injected_fault("GET"):
            return
        self._object_headers = self._media_download_headers()
        try:
            super().do_GET()
        finally:
            self._object_headers = {}

    def do_PATCH(self) -> None:
        self._record("PATCH")
        if self._injected_fault("PATCH"):
            return
        super().do_PATCH()

    # ---- plumbing -----------------------------------------------------------------------------------------

    _status = 0
    _object_headers: dict[str, str] = {}  # replaced per request, never mutated
    """Sent with the response of the request being served when it succeeds (see
    ``_media_download_headers``)."""

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def end_headers(self) -> None:
        if 200 <= self._status < 300:
            for key, value in self._object_headers.items():
                self.send_header(key, value)
        super().end_headers()

    def _record(self, method: str) -> None:
        self.server.rig._log(method, urlsplit(self.path).path)

    def _injected_fault(self, method: str) -> bool:
        fault = self.server.rig._fault_for(method, unquote(urlsplit(self.path).path))
        if fault is None:
            return False
        self._body()
        status = fault.status
        message = fault.message or f"injected by the test rig: {method} {unquote(urlsplit(self.path).path)}"
        reason = fault.reason or {403: "forbidden", 404: "notFound"}.get(status, "backendError")
        error: dict[str, Any] = {
            "code": status,
            "message": message,
            "errors": [{"reason": reason, "domain": fault.domain, "message": message}],
        }
        if fault.details:
            error["details"] = fault.details
        self._json(status, {"error": error})
        return True

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._reply(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _xml(self, status: int, root: ElementTree.Element) -> None:
        body = ElementTree.tostring(root, xml_declaration=True, encoding="UTF-8")
        self._reply(status, body, {"Content-Type": "application/xml"})

    def _xml_error(self, status: int, code: str, message: str) -> None:
        root = ElementTree.Element("Error")
        for tag, text in (("Code", code), ("Message", message), ("Details", message)):
            ElementTree.SubElement(root, tag).text = text
        self._xml(status, root)

    # ---- what the emulator gets wrong about plain objects -------------------------------------------------

    def _media_download_headers(self) -> dict[str, str]:
        """The object headers GCS sends with an object's bytes, for a GET that the emulator serves as a
        download (found with the emulator's own routing table); empty for any other request."""
        url = urlsplit(self.path)
        for pattern, handlers in emulator_server.HANDLERS:  # noqa: B007 - read after the break
            match = re.fullmatch(pattern, url.path)
            if match is not None:
                break
        else:
            return {}
        handler = handlers.get("GET")
        media = handler is emulator_objects.get and parse_qs(url.query).get("alt") == ["media"]
        if not (handler is emulator_objects.download or media):
            return {}
        try:
            obj = self.storage.get_file_obj(match["bucket_name"], unquote(match["object_id"]))
        except NotFound:  # the emulator answers the 404 itself
            return {}
        return {
            "x-goog-generation": str(obj.get("generation", "")),
            "x-goog-metageneration": str(obj.get("metageneration", "1")),
            "x-goog-stored-content-length": str(obj.get("size", "")),
        }

    def _failed_precondition(self) -> bool:
        """An upload with ``ifGenerationMatch`` (0: the object must not exist) whose object is at another
        generation: 412 ``conditionNotMet``, nothing stored, as GCS does. A matching one goes on to the
        emulator, its body put back for it to read."""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        match = _MEDIA_UPLOAD_PATH.match(url.path)
        if match is None or "ifGenerationMatch" not in query:
            return False
        body = self._body()
        self.rfile = io.BytesIO(body)
        name = (query.get("name") or [None])[0]
        if name is None:  # a multipart upload: the name is in its JSON part
            found = re.search(rb'"name"\s*:\s*("(?:[^"\\]|\\.)*")', body)
            name = json.loads(found.group(1)) if found else None
        if name is None:
            return False
        try:
            generation = str(self.storage.get_file_obj(match["bucket"], name).get("generation", ""))
        except NotFound:
            generation = "0"
        if generation == query["ifGenerationMatch"][0]:
            return False
        message = (
            f"At least one of the pre-conditions you specified did not hold. ({name} is at {generation})"
        )
        self._json(
            412,
            {
                "error": {
                    "code": 412,
                    "message": message,
                    "errors": [{"reason": "conditionNotMet", "message": message}],
                }
            },
        )
        return True

    def _empty_media_upload(self) -> bool:
        """``POST .../o?uploadType=media&name=N`` with no body: a zero-byte object (the emulator would
        crash)."""
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        match = _MEDIA_UPLOAD_PATH.match(url.path)
        if match is None or query.get("uploadType") != ["media"] or not query.get("name"):
            return False
        if int(self.headers.get("Content-Length") or 0) or self.headers.get("Transfer-Encoding"):
            return False
        bucket, name = match["bucket"], query["name"][0]
        if self.storage.get_bucket(bucket) is None:
            self._json(
                HTTPStatus.NOT_FOUND, {"error": {"code": 404, "message": f"bucket {bucket} not found"}}
            )
            return True
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        obj = emulator_objects._make_object_resource(
            f"http://{self.headers.get('Host')}", bucket, name, content_type, "0"
        )
        obj = emulator_objects._checksums(b"", obj)
        self.storage.create_file(bucket, name, b"", obj)
        self._json(HTTPStatus.OK, obj)
        return True

    # ---- buckets.insert that keeps location ---------------------------------------------------------------

    def _bucket_insert(self) -> bool:
        if urlsplit(self.path).path not in ("/storage/v1/b", "/b"):
            return False
        body = json.loads(self._body() or b"{}")
        name = body.get("name")
        if not name:
            self._json(HTTPStatus.BAD_REQUEST, emulator_buckets.BAD_REQUEST)
            return True
        bucket = emulator_buckets.create_bucket(name, self.storage)
        if not bucket:
            self._json(HTTPStatus.CONFLICT, emulator_buckets.CONFLICT)
            return True
        if body.get("location"):
            bucket["location"] = str(body["location"]).upper()
            bucket["locationType"] = _location_type(bucket["location"])
        for key in ("storageClass", "iamConfiguration", "labels"):
            if body.get(key):
                bucket[key] = body[key]
        self.storage.create_bucket(name, bucket)
        self._json(HTTPStatus.OK, bucket)
        return True

    # ---- XML API multipart uploads (transfer_manager.upload_chunks_concurrently) --------------------------

    def _multipart(self, method: str) -> bool:
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        match = _OBJECT_PATH.match(url.path)
        if match is None or not ({"uploads", "uploadId"} & query.keys()) or url.path.startswith("/storage/"):
            return False
        bucket, name = match["bucket"], unquote(match["object"])
        rig = self.server.rig
        if method == "POST" and "uploads" in query:
            self._initiate(bucket, name)
        elif method == "PUT" and "partNumber" in query:
            self._upload_part(rig._upload(query["uploadId"][0]), int(query["partNumber"][0]))
        elif method == "POST":
            self._complete(query["uploadId"][0])
        elif method == "DELETE":
            found = rig._drop_upload(query["uploadId"][0])
            self._reply(HTTPStatus.NO_CONTENT if found else HTTPStatus.NOT_FOUND)
        else:
            self._xml_error(HTTPStatus.BAD_REQUEST, "InvalidRequest", f"{method} {url.path}?{url.query}")
        return True

    def _initiate(self, bucket: str, name: str) -> None:
        self._body()
        if self.storage.get_bucket(bucket) is None:
            self._xml_error(
                HTTPStatus.NOT_FOUND, "NoSuchBucket", f"The specified bucket does not exist: {bucket}"
            )
            return
        metadata = {
            k[len("x-goog-meta-") :]: v
            for k, v in self.headers.items()
            if k.lower().startswith("x-goog-meta-")
        }
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        upload_id = self.server.rig._start_upload(_Multipart(bucket, name, content_type, metadata))
        root = ElementTree.Element(f"{{{S3_NS}}}InitiateMultipartUploadResult")
        for tag, text in (("Bucket", bucket), ("Key", name), ("UploadId", upload_id)):
            ElementTree.SubElement(root, f"{{{S3_NS}}}{tag}").text = text
        self._xml(HTTPStatus.OK, root)

    def _upload_part(self, upload: _Multipart | None, number: int) -> None:
        data = self._body()
        if upload is None:
            self._xml_error(HTTPStatus.NOT_FOUND, "NoSuchUpload", "The requested upload was not found.")
            return
        crc, md5 = _crc32c_b64(data), _md5_b64(data)
        for claim in (self.headers.get("x-goog-hash") or "").split(","):
            kind, _, value = claim.strip().partition("=")
            if (kind == "crc32c" and value != crc) or (kind == "md5" and value != md5):
                self._xml_error(
                    HTTPStatus.BAD_REQUEST, "BadDigest", f"part {number}: {kind} {value} != {crc}"
                )
                return
        etag = f'"{hashlib.md5(data).hexdigest()}"'
        upload.parts[number] = (data, etag)
        self._reply(HTTPStatus.OK, headers={"ETag": etag, "x-goog-hash": f"crc32c={crc},md5={md5}"})

    def _complete(self, upload_id: str) -> None:
        body = self._body()
        upload = self.server.rig._upload(upload_id)
        if upload is None:
            self._xml_error(HTTPStatus.NOT_FOUND, "NoSuchUpload", "The requested upload was not found.")
            return
        listed = _listed_parts(body)
        problem = _check_parts(upload, listed)
        if problem:
            self._xml_error(HTTPStatus.BAD_REQUEST, *problem)
            return
        data = b"".join(upload.parts[number][0] for number, _ in listed)
        obj = emulator_objects._make_object_resource(
            f"http://{self.headers.get('Host')}",
            upload.bucket,
            upload.name,
            upload.content_type,
            str(len(data)),
        )
        obj = emulator_objects._checksums(data, obj)
        obj["md5Hash"] = None  # composite objects have a crc32c and no md5 on GCS
        if upload.metadata:
            obj["metadata"] = upload.metadata
        self.storage.create_file(upload.bucket, upload.name, data, obj)
        self.server.rig._drop_upload(upload_id)
        root = ElementTree.Element(f"{{{S3_NS}}}CompleteMultipartUploadResult")
        for tag, text in (("Bucket", upload.bucket), ("Key", upload.name), ("ETag", f'"{obj["etag"]}"')):
            ElementTree.SubElement(root, f"{{{S3_NS}}}{tag}").text = text
        self._xml(HTTPStatus.OK, root)


def _listed_parts(body: bytes) -> list[tuple[int, str]]:
    """(PartNumber, ETag) pairs of a CompleteMultipartUpload body, with or without the S3 namespace."""
    parts = []
    for element in ElementTree.fromstring(body).iter():
        if element.tag.rsplit("}", 1)[-1] != "Part":
            continue
        fields = {child.tag.rsplit("}", 1)[-1]: (child.text or "") for child in element}
        parts.append((int(fields["PartNumber"]), fields["ETag"]))
    return parts


def _check_parts(upload: _Multipart, listed: list[tuple[int, str]]) -> tuple[str, str] | None:
    """GCS's checks on completion: known parts with matching ETags, ascending, all but the last >= 5 MiB."""
    if not listed:
        return "MalformedXML", "no parts listed"
    numbers = [number for number, _ in listed]
    if numbers != sorted(set(numbers)):
        return "InvalidPartOrder", "parts must be listed in ascending order"
    for number, etag in listed:
        stored = upload.parts.get(number)
        if stored is None or stored[1].strip('"') != etag.strip('"'):
            return "InvalidPart", f"part {number} was not uploaded or its ETag does not match"
    for number, _ in listed[:-1]:
        if len(upload.parts[number][0]) < MIN_PART_SIZE:
            return "EntityTooSmall", f"part {number} is smaller than 5 MiB and is not the last part"
    return None


@dataclass(frozen=True)
class Fault:
    """A GCS-shaped JSON error answered to matching requests: the JSON API's legacy ``errors[].reason``
    (``forbidden``, ``accessNotConfigured``, ``accountDisabled``, ``quotaExceeded``, ``conditionNotMet``) and,
    where Google adds them, ``details`` (an ``ErrorInfo``)."""

    method: str
    path_contains: str
    status: int
    reason: str = ""
    message: str = ""
    domain: str = "global"
    details: tuple[dict[str, Any], ...] = ()


class GcsEmulator:
    """An in-memory GCS on ``self.endpoint`` while in ``with GcsEmulator() as gcs:`` (see the module
    docstring)."""

    def __init__(self) -> None:
        self._storage = Storage(use_memory_fs=True)
        self._lock = threading.Lock()
        self._uploads: dict[str, _Multipart] = {}
        self._ids = itertools.count(1)
        self.requests: list[tuple[str, str]] = []
        """``(method, path)`` of every request served, oldest first."""
        self._faults: list[Fault] = []
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind 127.0.0.1 on a port the kernel picks (no race with other tests) and serve from a daemon
        thread."""
        if self._httpd is not None:
            return self
        httpd = _Server(("127.0.0.1", 0), partial(_Handler, self._storage))
        httpd.rig = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.02,), name="gcs-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- what tests use -----------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        if self._httpd is None:
            raise RuntimeError("GcsEmulator is not started")
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to use this emulator through google-cloud-storage."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def client(self, project: str = "test") -> Client:
        """A real client bound to this emulator (``client_options`` pins it even without the variable set)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def fail(
        self,
        method: str,
        path_contains: str,
        status: int = 403,
        *,
        reason: str = "",
        message: str = "",
        domain: str = "global",
        details: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """Answer every ``method`` request whose (unquoted) path contains ``path_contains`` with ``status``
        (and the error's ``reason``, ``message``, ``domain`` and ``details``, when given: :class:`Fault`)."""
        with self._lock:
            self._faults.append(Fault(method, path_contains, status, reason, message, domain, details))

    def reset_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        """Forget every bucket, object, upload and fault, and the request log."""
        with self._lock:
            self._storage.wipe()
            self._uploads.clear()
            self._faults.clear()
            self.requests.clear()

    # ---- called from the handler (server thread) ----------------------------------------------------------

    def _log(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, unquote(path)))

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            return next((f for f in self._faults if f.method == method and f.path_contains in path), None)

    def _start_upload(self, upload: _Multipart) -> str:
        with self._lock:
            upload_id = f"tpuft-rig-{next(self._ids)}"
            self._uploads[upload_id] = upload
            return upload_id

    def _upload(self, upload_id: str) -> _Multipart | None:
        with self._lock:
            return self._uploads.get(upload_id)

    def _drop_upload(self, upload_id: str) -> bool:
        with self._lock:
            return self._uploads.pop(upload_id, None) is not None
