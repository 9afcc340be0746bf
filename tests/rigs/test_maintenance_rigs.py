"""The maintenance side of the rigs: the fake TPU API's upcoming maintenance, simulated maintenance event and
StopNode (raw HTTP, as the v2alpha1 calls go on the wire), and the metadata server rig that follows it per
worker."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.metadata_server import MetadataServer

PARENT = "projects/tpuft-test/locations/us-central2-b"


@pytest.fixture
def server() -> Iterator[FakeTpuServer]:
    with FakeTpuServer(operation_polls=0) as fake:
        yield fake


def call(server: FakeTpuServer, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{server.endpoint}/{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ready_node(server: FakeTpuServer, node_id: str = "t5", accelerator: str = "v4-16") -> None:
    status, _ = call(
        server,
        "POST",
        f"v2/{PARENT}/nodes?nodeId={node_id}",
        {"acceleratorType": accelerator, "runtimeVersion": "tpu-ubuntu2204-base"},
    )
    assert status == 200
    server.settle()
    assert server.node(node_id)["state"] == "READY"  # type: ignore[index]


def get_metadata(host: str, key: str, flavor: str | None = "Google") -> tuple[int, str]:
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/{key}")
    if flavor:
        request.add_header("Metadata-Flavor", flavor)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_upcoming_maintenance_is_on_v2alpha1_only(server: FakeTpuServer) -> None:
    ready_node(server)
    _, before = call(server, "GET", f"v2alpha1/{PARENT}/nodes/t5")
    assert "upcomingMaintenance" not in before and before["state"] == "READY"
    window = server.announce_maintenance("t5", starts_in=120, lasts=600)
    _, alpha = call(server, "GET", f"v2alpha1/{PARENT}/nodes/t5")
    _, v2 = call(server, "GET", f"v2/{PARENT}/nodes/t5")
    assert alpha["upcomingMaintenance"] == window
    assert window["type"] == "SCHEDULED" and window["maintenanceStatus"] == "PENDING"
    assert window["windowStartTime"] < window["windowEndTime"]
    assert "upcomingMaintenance" not in v2  # the v2 Node has no such field
    # only the create's check above
    assert server.calls("v2alpha1.GetNode") and not server.calls("GetNode")[1:]
    server.begin_maintenance("t5")
    _, alpha = call(server, "GET", f"v2alpha1/{PARENT}/nodes/t5")
    assert alpha["state"] == "REPAIRING" and alpha["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    status, refused = call(server, "GET", f"v2alpha1/{PARENT}/nodes")
    assert status == 501 and "only GetNode" in refused["error"]["message"]


def test_simulate_maintenance_event_announces_on_the_first_worker(server: FakeTpuServer) -> None:
    ready_node(server)  # v4-16: two hosts
    heard: list[tuple[str, str, dict[str, Any]]] = []
    server.maintenance_listeners.append(lambda node, worker, window: heard.append((node, worker, window)))
    status, operation = call(
        server, "POST", f"v2alpha1/{PARENT}/nodes/t5:simulateMaintenanceEvent", {"workerIds": ["1", "0"]}
    )
    assert status == 200 and operation["done"] and operation["metadata"]["verb"] == "simulateMaintenanceEvent"
    assert [(n, w) for n, w, _ in heard] == [("t5", "1")]
    assert heard[0][2]["type"] == "UNSCHEDULED"
    assert server.node("t5")["state"] == "READY"  # type: ignore[index]  # the notice comes first; the window later
    status, bad = call(
        server, "POST", f"v2alpha1/{PARENT}/nodes/t5:simulateMaintenanceEvent", {"workerIds": ["7"]}
    )
    assert status == 400 and "workers 0..1" in bad["error"]["message"]
    status, _ = call(server, "POST", f"v2/{PARENT}/nodes/t5:simulateMaintenanceEvent", {})
    assert status == 501  # v2 has no such call


def test_stop_node_takes_a_ready_node_to_stopped(server: FakeTpuServer) -> None:
    ready_node(server, accelerator="v4-8")
    status, operation = call(server, "POST", f"v2/{PARENT}/nodes/t5:stop", {})
    assert status == 200 and operation["done"]
    assert server.node("t5")["state"] == "STOPPED" and "health" not in server.node("t5")  # type: ignore[index,operator]
    status, again = call(server, "POST", f"v2/{PARENT}/nodes/t5:stop", {})
    assert status == 400 and "STOPPED" in again["error"]["message"]


def test_metadata_server_serves_each_worker_its_own_keys(server: FakeTpuServer) -> None:
    ready_node(server)
    with MetadataServer(workers=2) as meta:
        meta.follow(server, ["t5"], hosts_per_node=2)
        assert get_metadata(meta.host(1), "upcoming-maintenance")[0] == 404
        assert get_metadata(meta.host(1), "maintenance-event") == (200, "NONE")
        assert get_metadata(meta.host(1), "maintenance-event", flavor=None)[0] == 403
        call(server, "POST", f"v2alpha1/{PARENT}/nodes/t5:simulateMaintenanceEvent", {"workerIds": ["1"]})
        status, text = get_metadata(meta.host(1), "upcoming-maintenance")
        window = json.loads(text)
        assert status == 200 and window["maintenance_status"] == "PENDING" and window["window_start_time"]
        assert get_metadata(meta.host(0), "upcoming-maintenance")[0] == 404  # worker 0 was not named
        meta.begin(1)
        assert get_metadata(meta.host(1), "maintenance-event") == (200, "TERMINATE_ON_HOST_MAINTENANCE")
        assert (1, "upcoming-maintenance") in meta.requests
