"""A loopback stand-in for the GCE metadata server's maintenance keys, one listener per worker.

A TPU VM learns of maintenance from its metadata server: ``instance/upcoming-maintenance`` (404 while nothing
is announced; JSON with the window once one is) and ``instance/maintenance-event`` (``NONE`` until the event
begins, then e.g. ``TERMINATE_ON_HOST_MAINTENANCE``). Every request must carry ``Metadata-Flavor: Google``, as
on GCE. Clients reach a metadata server at ``$GCE_METADATA_HOST`` (host:port), which google-auth and Google's
metadata clients honour, so each worker of a rig gets its own listener's ``host(i)`` in that variable: a
worker cannot be told apart by the path it asks, only by the server it asks.

``follow(fake_tpu, nodes, hosts_per_node)`` makes the fake TPU API's announcements (``announce_maintenance``,
the ``:simulateMaintenanceEvent`` call) reach the matching worker's key, the way the real service and metadata
server agree. ``requests`` logs (worker, path) of every answered call.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self

    from tests.rigs.fake_tpu import FakeTpuServer

PREFIX = "/computeMetadata/v1/instance/"
UPCOMING = "upcoming-maintenance"
EVENT = "maintenance-event"

# The API's UpcomingMaintenance (camelCase) as the metadata server spells it (snake_case).
_SNAKE = {
    "type": "type",
    "canReschedule": "can_reschedule",
    "windowStartTime": "window_start_time",
    "windowEndTime": "window_end_time",
    "latestWindowStartTime": "latest_window_start_time",
    "maintenanceStatus": "maintenance_status",
}


class MetadataServer:
    """``with MetadataServer(workers=2) as meta:`` serves worker i on ``meta.host(i)`` until exit."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.requests: list[tuple[int, str]] = []
        self._upcoming: dict[int, dict[str, Any]] = {}
        self._event: dict[int, str] = {}
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []

    def __enter__(self) -> Self:
        for worker in range(self.workers):
            server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
            server.daemon_threads = True
            server.rig = self  # type: ignore[attr-defined]
            server.worker = worker  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(server)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def host(self, worker: int) -> str:
        """``127.0.0.1:PORT``: the ``GCE_METADATA_HOST`` of ``worker``."""
        return f"127.0.0.1:{self._servers[worker].server_address[1]}"

    # -- test controls --------------------------------------------------------------------------------------
    def announce(self, worker: int, window: dict[str, Any]) -> None:
        """Serve ``window`` (the API's camelCase or the metadata's snake_case keys) as the worker's upcoming
        maintenance."""
        with self._lock:
            self._upcoming[worker] = {_SNAKE.get(k, k): v for k, v in window.items()}

    def clear(self, worker: int) -> None:
        with self._lock:
            self._upcoming.pop(worker, None)
            self._event.pop(worker, None)

    def begin(self, worker: int, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        with self._lock:
            self._event[worker] = event
            if worker in self._upcoming:
                self._upcoming[worker]["maintenance_status"] = "ONGOING"

    def follow(self, fake: FakeTpuServer, nodes: list[str], hosts_per_node: int = 1) -> None:
        """Announcements on ``nodes[s]``'s worker ``w`` reach worker ``s * hosts_per_node + w`` here."""

        def heard(node: str, worker_id: str, window: dict[str, Any]) -> None:
            if node in nodes:
                self.announce(nodes.index(node) * hosts_per_node + int(worker_id), window)

        fake.maintenance_listeners.append(heard)

    # -- answers --------------------------------------------------------------------------------------------
    def answer(self, worker: int, path: str, flavor: str | None) -> tuple[int, str, str]:
        """(status, content type, body) for one GET."""
        if flavor != "Google":
            return 403, "text/html", "Missing Metadata-Flavor:Google header."
        key = path.split("?", 1)[0]
        if not key.startswith(PREFIX):
            return 404, "text/html", "not found"
        name = key[len(PREFIX) :]
        with self._lock:
            self.requests.append((worker, name))
            if name == UPCOMING:
                window = self._upcoming.get(worker)
                if window is None:
                    return 404, "text/html", "not found"
                return 200, "application/json", json.dumps(window)
            if name == EVENT:
                return 200, "application/text", self._event.get(worker, "NONE")
        return 404, "text/html", "not found"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        rig: MetadataServer = self.server.rig  # type: ignore[attr-defined]
        status, content_type, body = rig.answer(
            self.server.worker,
            self.path,  # type: ignore[attr-defined]
            self.headers.get("Metadata-Flavor"),
        )
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the log is ``MetadataServer.requests``."""
