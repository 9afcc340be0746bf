"""Google's storage hosts, answered by the GCS emulator: an HTTPS proxy for the clients that cannot be pointed
at one.

Why it exists
-------------
A T5X worker reaches ``gs://`` through three clients, and only two of them can be told where GCS is:

* google-cloud-storage (tpuft's own storage, Orbax's bucket check): ``STORAGE_EMULATOR_HOST``;
* tensorstore (Orbax's OCDBT arrays): ``TENSORSTORE_GCS_HTTP_URL``, with ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` so
  that it does not look for credentials;
* TensorFlow's GCS filesystem (``tf.io.gfile``, and ``etils.epath`` through it: Orbax's folders, tpuft's
  manifests, pruning and gin reads) has the hosts ``https://www.googleapis.com`` (JSON API, uploads) and
  ``https://storage.googleapis.com`` (XML reads) compiled in. It honours ``HTTPS_PROXY`` and
  ``CURL_CA_BUNDLE`` (it is libcurl underneath), and that is the only way in.

So this rig is an HTTP proxy on 127.0.0.1 that answers ``CONNECT *.googleapis.com:443`` itself: it ends the
TLS with a certificate for ``*.googleapis.com`` signed by a CA made for this rig alone (``ca_file``, given to
the clients as ``CURL_CA_BUNDLE``), reads the plain requests in the tunnel and forwards each one to the
emulator with its own address as ``Host``: the emulator writes the request's host into the links it hands out,
and an object's ``mediaLink`` is what google-cloud-storage downloads from, on any machine, so it must name the
emulator, not ``www.googleapis.com``. Going back, a ``Location`` that names the emulator (a resumable upload's
session URL) is rewritten to ``https://<the tunnel's host>``, so that TensorFlow sends the upload's bytes
through the tunnel too. CONNECTs to any other host are refused with 403, so a client that would reach the
internet fails plainly instead of on a bad certificate.

Usage::

    with GcsEmulator() as gcs, GcsProxy(gcs) as proxy:
        env = proxy.env(no_proxy=pod.addresses)  # everything a worker process needs, emulator variables
        included

``no_proxy``: hosts that must be reached directly besides 127.0.0.1 and localhost. gRPC honours
``https_proxy`` too, so JAX's coordinator address (a worker's) belongs there. ``requests`` lists ``(method,
url)`` of every request forwarded. Needs ``cryptography`` (a dependency of paramiko, hence of tpuft).
"""

from __future__ import annotations

import datetime
import http.client
import shutil
import ssl
import tempfile
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from typing_extensions import Self

    from tests.rigs.gcs_emulator import GcsEmulator

GOOGLE_HOSTS: Final = ("www.googleapis.com", "storage.googleapis.com", "*.googleapis.com")
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "transfer-encoding",
        "content-length",
        "expect",
        "te",
        "trailer",
        "upgrade",
    }
)


def _make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) as PEM files: a CA valid for a day and a leaf it
    signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpuft test rig CA (throwaway)")])
    usage = {
        name: False
        for name in (
            "digital_signature",
            "content_commitment",
            "key_encipherment",
            "data_encipherment",
            "key_agreement",
            "key_cert_sign",
            "crl_sign",
            "encipher_only",
            "decipher_only",
        )
    }
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(**{**usage, "digital_signature": True, "key_cert_sign": True, "crl_sign": True}),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_HOSTS[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in GOOGLE_HOSTS]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(leaf.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def _is_google(host: str) -> bool:
    return host == "googleapis.com" or host.endswith(".googleapis.com")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    rig: GcsProxy


class _Handler(BaseHTTPRequestHandler):
    """A CONNECT turns this connection into a TLS server for the tunnelled host; every request after it is
    forwarded to the emulator."""

    protocol_version = (
        "HTTP/1.1"  # keep-alive in the tunnel; also answers "Expect: 100-continue" (curl sends it)
    )
    server: _Server
    _tunnel_host: str | None = None

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        pass

    def do_CONNECT(self) -> None:
        host = self.path.rsplit(":", 1)[0]
        if self._tunnel_host is not None or not _is_google(host):
            self.server.rig._log("CONNECT", self.path)
            self.send_error(403, f"the test rig's proxy only stands in for *.googleapis.com, not {self.path}")
            self.close_connection = True
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        tls = self.server.rig._tls.wrap_socket(self.connection, server_side=True)
        self.connection = tls
        self.rfile = tls.makefile("rb", self.rbufsize)
        self.wfile = tls.makefile("wb", 0)
        self._tunnel_host = host
        self.close_connection = False

    def _forward(self) -> None:
        body = self._body()
        if self._tunnel_host is None:  # only HTTPS_PROXY points here: every request comes through a CONNECT
            self.send_error(405, "the test rig's proxy serves only the requests in a CONNECT tunnel")
            return
        rig = self.server.rig
        rig._log(self.command, f"https://{self._tunnel_host}{self.path}")
        headers = {key: value for key, value in self.headers.items() if key.lower() not in _HOP_BY_HOP}
        # the emulator writes its Host into mediaLink, which others follow
        headers["Host"] = rig._upstream_netloc
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(rig._upstream_netloc, timeout=300)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        except OSError as exc:
            self.send_error(502, f"the GCS emulator did not answer: {exc}")
            return
        finally:
            upstream.close()
        self.send_response(answer.status, answer.reason)
        emulator = f"http://{rig._upstream_netloc}"
        for key, value in answer.getheaders():
            if key.lower() in _HOP_BY_HOP:
                continue
            if key.lower() == "location" and value.startswith(emulator):  # a resumable upload's session URL
                value = f"https://{self._tunnel_host}{value.removeprefix(emulator)}"
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""


class GcsProxy:
    """``https://*.googleapis.com`` through ``HTTPS_PROXY``, answered by ``gcs`` (see the module
    docstring)."""

    def __init__(self, gcs: GcsEmulator, project: str = "test") -> None:
        self.gcs = gcs
        self.project = project
        self.requests: list[tuple[str, str]] = []
        """``(method, url)`` of every request forwarded (and of every CONNECT refused), oldest first."""
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._tls: ssl.SSLContext
        self._upstream_netloc = ""
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._upstream_netloc = urlsplit(self.gcs.endpoint).netloc
        self._folder = Path(tempfile.mkdtemp(prefix="tpuft-gcs-proxy-"))
        _, certificate, key = _make_certificates(self._folder)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(certificate, key)
        httpd = _Server(("127.0.0.1", 0), _Handler)
        httpd.rig = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.05,), name="gcs-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._httpd is None:
            raise RuntimeError("GcsProxy is not started")
        return f"http://127.0.0.1:{self._httpd.server_port}"

    @property
    def ca_file(self) -> Path:
        """The throwaway CA's certificate (PEM): the only CA a client given ``env()`` trusts."""
        if self._folder is None:
            raise RuntimeError("GcsProxy is not started")
        return self._folder / "ca.pem"

    def env(self, no_proxy: Iterable[str] = ()) -> dict[str, str]:
        """What a process needs so that google-cloud-storage, tensorstore and TensorFlow all use the
        emulator."""
        bypass = ",".join(dict.fromkeys(["127.0.0.1", "localhost", *no_proxy]))
        return {
            **self.gcs.env(),  # STORAGE_EMULATOR_HOST: google-cloud-storage
            # google-cloud-storage's Client() without a project argument
            "GOOGLE_CLOUD_PROJECT": self.project,
            "TENSORSTORE_GCS_HTTP_URL": self.gcs.endpoint,
            # tensorstore and TensorFlow: no credential search
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "tpuft-test-rig",
            "HTTPS_PROXY": self.endpoint,
            "https_proxy": self.endpoint,
            "NO_PROXY": bypass,
            "no_proxy": bypass,
            "CURL_CA_BUNDLE": str(self.ca_file),  # TensorFlow (libcurl) trusts the rig's CA only
        }

    def _log(self, method: str, url: str) -> None:
        with self._lock:
            self.requests.append((method, url))
