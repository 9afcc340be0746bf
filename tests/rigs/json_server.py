"""What the stand-ins for Google's JSON APIs share (the fake Cloud TPU API, the fake Compute Engine API): a
stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, keep-alive connections like Google's front end, and
one ``handle(method, path, body) -> (status, JSON)`` per request, run by the subclass under its lock."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

Json = dict[str, Any]


class JsonApiServer:
    """Serve ``handle`` on ``endpoint`` (``http://127.0.0.1:PORT``) from a daemon thread, between ``start``
    and ``close`` (or as a context manager)."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    def handle(self, method: str, raw_path: str, raw_body: bytes) -> tuple[int, Json]:
        raise NotImplementedError

    # ---- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread."""
        if self._httpd is not None:
            return self
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        httpd.fake = self  # type: ignore[attr-defined]
        self._httpd = httpd
        # A short poll interval: shutdown() waits for it, and tests close one server each.
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.02,), name=self.thread_name, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop kept-alive connections so no handler thread lingers."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return int(self._httpd.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class _Handler(BaseHTTPRequestHandler):
    """Bytes in, the server's ``handle`` answers, JSON out; keep-alive like Google's front end."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = (
        True  # headers and body go out in two writes: without this each answer waits ~40 ms
    )

    @property
    def fake(self) -> JsonApiServer:
        return self.server.fake  # type: ignore[attr-defined,no-any-return]

    def setup(self) -> None:
        super().setup()
        with self.fake._lock:
            self.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._connections.discard(self.connection)
        super().finish()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        status, payload = self.fake.handle(self.command, self.path, raw)
        data = json.dumps(payload, indent=2).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the server's ``requests``."""
