"""The two GCS rigs the T5X backend's ``gs://`` MODEL_DIR tests stand on, checked on their own.

A T5X worker writes its checkpoints with Orbax: tensorstore (OCDBT arrays) and TensorFlow's GCS filesystem
(folders, manifests) as well as google-cloud-storage. Against the offline emulator two things must hold that
the emulator alone gets wrong, and one client must be let in that cannot be pointed at it:

* ``tests/rigs/gcs_emulator.py`` sends GCS's generation headers with every object body (tensorstore's OCDBT
  fails with "Malformed StorageGeneration" without them) and stores the empty ``uploadType=media`` uploads
  that TensorFlow's ``makedirs`` sends (the emulator answers 500, which TensorFlow retries for ever);
* ``tests/rigs/gcs_proxy.py`` answers ``CONNECT *.googleapis.com:443`` with its own CA and forwards the
  tunnelled requests to the emulator, since TensorFlow has ``https://www.googleapis.com`` compiled in.

Plain ``urllib`` / ``http.client`` requests, so that a failure names the rig and not a client library.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import pytest
from google.cloud.storage import Bucket

from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.gcs_proxy import GcsProxy

BUCKET = "tpuft-rig-test"
NAME = "model/checkpoint_100/manifest.ocdbt"
DATA = b"generation-tagged bytes\n" * 100
# never through a proxy of the environment
_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def bucket(gcs: GcsEmulator) -> Bucket:
    gcs.reset()
    return gcs.client().create_bucket(BUCKET)


@pytest.fixture(scope="module")
def proxy(gcs: GcsEmulator) -> Iterator[GcsProxy]:
    with GcsProxy(gcs) as rig:
        yield rig


def get(url: str, method: str = "GET", data: bytes | None = None) -> tuple[dict[str, str], bytes]:
    with _direct.open(urllib.request.Request(url, data=data, method=method), timeout=10) as answer:
        return {key.lower(): value for key, value in answer.headers.items()}, answer.read()


# ---- the emulator ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route",
    [
        "/download/storage/v1/b/{bucket}/o/{quoted}?alt=media",  # google-cloud-storage's download_as_bytes
        "/storage/v1/b/{bucket}/o/{quoted}?alt=media",  # tensorstore, TensorFlow
        "/{bucket}/{name}",  # the XML API
    ],
)
def test_media_download_carries_the_objects_generation(gcs: GcsEmulator, bucket: Bucket, route: str) -> None:
    bucket.blob(NAME).upload_from_string(DATA)
    quoted = quote(NAME, safe="")
    _, body = get(f"{gcs.endpoint}/storage/v1/b/{BUCKET}/o/{quoted}")
    metadata = json.loads(body)

    headers, body = get(gcs.endpoint + route.format(bucket=BUCKET, quoted=quoted, name=NAME))

    assert body == DATA
    assert headers["x-goog-generation"] == str(metadata["generation"]) != ""
    assert headers["x-goog-metageneration"] == str(metadata.get("metageneration", "1"))
    assert headers["x-goog-stored-content-length"] == str(metadata["size"]) == str(len(DATA))


def test_metadata_get_and_missing_object_carry_no_generation_headers(
    gcs: GcsEmulator, bucket: Bucket
) -> None:
    bucket.blob(NAME).upload_from_string(DATA)
    headers, _ = get(f"{gcs.endpoint}/storage/v1/b/{BUCKET}/o/{quote(NAME, safe='')}")
    assert "x-goog-generation" not in headers
    with pytest.raises(urllib.error.HTTPError) as missing:
        get(f"{gcs.endpoint}/storage/v1/b/{BUCKET}/o/nothing-here?alt=media")
    assert missing.value.code == 404
    assert "x-goog-generation" not in {key.lower() for key in missing.value.headers}


def test_empty_media_upload_makes_a_zero_byte_object(gcs: GcsEmulator, bucket: Bucket) -> None:
    """What TensorFlow's ``makedirs("gs://bucket/dir")`` sends: a ``dir/`` marker with no body."""
    _, body = get(f"{gcs.endpoint}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=dir%2F", "POST", b"")

    assert json.loads(body)["name"] == "dir/"
    blob = bucket.get_blob("dir/")
    assert blob is not None and blob.size == 0
    # Raw GET: the emulator's mediaLink leaves the name unquoted, and none of its routes matches one ending in
    # "/".
    headers, body = get(f"{gcs.endpoint}/storage/v1/b/{BUCKET}/o/dir%2F?alt=media")
    assert body == b"" and headers["x-goog-stored-content-length"] == "0"


def test_empty_media_upload_to_a_missing_bucket_is_a_404(gcs: GcsEmulator, bucket: Bucket) -> None:
    with pytest.raises(urllib.error.HTTPError) as missing:
        get(f"{gcs.endpoint}/upload/storage/v1/b/no-such-bucket/o?uploadType=media&name=dir%2F", "POST", b"")
    assert missing.value.code == 404


# ---- the proxy -------------------------------------------------------------------------------------------


def tunnel(proxy: GcsProxy, host: str) -> http.client.HTTPSConnection:
    """An HTTPS connection to ``host`` through the proxy that trusts only the rig's CA and checks the host
    name."""
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    netloc = urlsplit(proxy.endpoint)
    conn = http.client.HTTPSConnection(netloc.hostname, netloc.port, context=context, timeout=10)
    conn.set_tunnel(host, 443)
    return conn


def test_env_hands_clients_the_proxy_and_its_ca(proxy: GcsProxy) -> None:
    env = proxy.env(no_proxy=["10.0.0.2"])
    assert env["HTTPS_PROXY"] == env["https_proxy"] == proxy.endpoint
    assert env["CURL_CA_BUNDLE"] == str(proxy.ca_file) and proxy.ca_file.read_bytes().startswith(
        b"-----BEGIN"
    )
    assert env["NO_PROXY"] == "127.0.0.1,localhost,10.0.0.2"
    assert env["STORAGE_EMULATOR_HOST"] == env["TENSORSTORE_GCS_HTTP_URL"] == proxy.gcs.endpoint


@pytest.mark.parametrize("host", ["www.googleapis.com", "storage.googleapis.com"])
def test_tunnelled_request_reaches_the_emulator(
    gcs: GcsEmulator, proxy: GcsProxy, bucket: Bucket, host: str
) -> None:
    blob = bucket.blob(NAME)
    blob.upload_from_string(DATA)
    conn = tunnel(proxy, host)
    try:
        # the TLS handshake verifies host
        conn.request("GET", f"/storage/v1/b/{BUCKET}/o/{quote(NAME, safe='')}")
        answer = conn.getresponse()
        metadata = json.loads(answer.read())
    finally:
        conn.close()

    assert answer.status == 200
    assert (metadata["name"], int(metadata["size"])) == (NAME, len(DATA))
    assert int(metadata["generation"]) == blob.generation
    assert ("GET", f"https://{host}/storage/v1/b/{BUCKET}/o/{quote(NAME, safe='')}") in proxy.requests


def test_upload_through_the_tunnel_links_to_the_emulator(
    gcs: GcsEmulator, proxy: GcsProxy, bucket: Bucket
) -> None:
    """The emulator names the request's Host in ``mediaLink``; the proxy must send the emulator's, not
    Google's."""
    conn = tunnel(proxy, "www.googleapis.com")
    try:
        conn.request("POST", f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=dir%2F", body=b"")
        answer = conn.getresponse()
        metadata = json.loads(answer.read())
    finally:
        conn.close()

    assert answer.status == 200 and metadata["size"] in ("0", 0)
    assert metadata["mediaLink"].startswith(gcs.endpoint + "/")
    assert bucket.get_blob("dir/").size == 0


@pytest.mark.parametrize("host", ["example.com", "googleapis.com.evil.test"])
def test_connect_to_other_hosts_is_refused(proxy: GcsProxy, host: str) -> None:
    conn = tunnel(proxy, host)
    try:
        with pytest.raises(OSError, match="Tunnel connection failed: 403"):
            conn.request("GET", "/")
    finally:
        conn.close()
    assert ("CONNECT", f"{host}:443") in proxy.requests


def test_a_client_that_does_not_trust_the_rigs_ca_fails_the_handshake(proxy: GcsProxy) -> None:
    """The verified handshakes above are not vacuous: the system's CAs do not vouch for the rig's
    certificate."""
    netloc = urlsplit(proxy.endpoint)
    conn = http.client.HTTPSConnection(
        netloc.hostname, netloc.port, context=ssl.create_default_context(), timeout=10
    )
    conn.set_tunnel("www.googleapis.com", 443)
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            conn.request("GET", "/")
    finally:
        conn.close()
