"""The fake Cloud TPU API (tests/rigs/fake_tpu.py) driven by the real ``google-cloud-tpu`` REST client.

These tests pin down both the rig and the client behaviour the GCP provider will rely on: which exception each
error becomes, what retries by default, how long ``operation.result()`` takes, and where state, endpoints and
queued-resource failures live on the Python objects. Raw-HTTP tests check the wire format without the client,
so they run even where the ``gcp`` extra is not installed; the client tests skip there.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.rigs.fake_tpu import ApiError, FakeTpuServer, topology_for

try:  # the gcp extra: pip install -e '.[gcp]'
    from google.api_core import exceptions as gexc
    from google.api_core import retry as gretry
    from google.api_core.future.polling import DEFAULT_POLLING
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2
    from google.protobuf import empty_pb2, field_mask_pb2

    HAVE_CLIENT = True
    # Milliseconds instead of google-api-core's 1 s first poll delay (see the rig's docstring).
    FAST_POLLING = DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.05).with_timeout(5)
    FAST_RETRY = gretry.Retry(
        predicate=gretry.if_exception_type(gexc.ServiceUnavailable), initial=0.01, maximum=0.05, timeout=5
    )
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_CLIENT = False

PROJECT = "tpuft-test"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-ubuntu2204-base"


@pytest.fixture
def server() -> Iterator[FakeTpuServer]:
    with FakeTpuServer() as fake:
        yield fake


@pytest.fixture
def client(server: FakeTpuServer) -> Any:
    if not HAVE_CLIENT:
        pytest.skip("google-cloud-tpu is not installed (pip install -e '.[gcp]')")
    return make_client(server.endpoint)


def make_client(endpoint: str) -> Any:
    """The real client over REST; an ``http://`` scheme in api_endpoint is kept, so plain HTTP works."""
    return tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )


def node_of(accelerator_type: str = "v4-8", **fields: Any) -> Any:
    return tpu_v2.Node(accelerator_type=accelerator_type, runtime_version=RUNTIME, **fields)


def create_ready(client: Any, node_id: str, accelerator_type: str = "v4-8", **fields: Any) -> Any:
    """create_node + wait, the way the provider will: returns the READY tpu_v2.Node."""
    operation = client.create_node(parent=PARENT, node_id=node_id, node=node_of(accelerator_type, **fields))
    return operation.result(polling=FAST_POLLING)


def queued_multislice(queued_id: str, prefix: str, count: int, accelerator_type: str = "v5litepod-16") -> Any:
    multislice = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=count, node_id_prefix=prefix)
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT, multislice_params=multislice, node=node_of(accelerator_type)
    )
    return tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        spot=tpu_v2.QueuedResource.Spot(),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration={"seconds": 3600}),
    )


def raw(server: FakeTpuServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request with urllib (no Google code at all): (HTTP status, parsed JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(server.endpoint + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# ---- connection and long-running operations --------------------------------------------------------------


def test_real_client_reaches_the_fake_over_plain_http(server: FakeTpuServer, client: Any) -> None:
    assert server.endpoint.startswith("http://127.0.0.1:")
    assert list(client.list_nodes(parent=PARENT)) == []
    (seen,) = server.requests
    assert (seen.method, seen.path, seen.rpc, seen.status) == ("GET", f"/v2/{PARENT}/nodes", "ListNodes", 200)
    assert seen.query == {"$alt": "json;enum-encoding=int"}  # the client asks for numeric enums


def test_create_node_operation_ends_with_a_ready_node(server: FakeTpuServer, client: Any) -> None:
    started = time.monotonic()
    operation = client.create_node(
        parent=PARENT, node_id="trainer", node=node_of("v4-16", metadata={"k": "v"}, labels={"team": "t5"})
    )
    assert not operation.done() and server.node("trainer")["state"] == "CREATING"
    assert operation.metadata.verb == "create" and operation.metadata.target == f"{PARENT}/nodes/trainer"
    node = operation.result(polling=FAST_POLLING)
    assert time.monotonic() - started < 1.0

    assert isinstance(node, tpu_v2.Node)
    assert node.name == f"{PARENT}/nodes/trainer"
    assert node.state == tpu_v2.Node.State.READY and node.health == tpu_v2.Node.Health.HEALTHY
    assert node.api_version == tpu_v2.Node.ApiVersion.V2 and node.create_time.year >= 2024
    # v4-16: 8 chips, 4 per host
    assert [(e.ip_address, e.port, e.access_config.external_ip) for e in node.network_endpoints] == [
        ("127.0.1.10", 8470, "127.0.1.10"),
        ("127.0.1.11", 8470, "127.0.1.11"),
    ]
    assert dict(node.metadata) == {"k": "v"} and dict(node.labels) == {"team": "t5"}
    assert node.network_config.enable_external_ips
    assert [r.rpc for r in server.requests] == ["CreateNode", "GetOperation", "GetOperation"]
    create = server.requests[0]
    assert create.query["nodeId"] == "trainer" and create.body["acceleratorType"] == "v4-16"


def test_one_poll_operations_make_default_polling_instant(server: FakeTpuServer, client: Any) -> None:
    """google-api-core polls first and sleeps (0..1 s, jittered) only when not done: operation_polls=1 never
    sleeps."""
    server.operation_polls = 1
    started = time.monotonic()
    client.create_node(parent=PARENT, node_id="quick", node=node_of()).result()  # DEFAULT_POLLING
    assert time.monotonic() - started < 0.5


def test_result_timeout_raises_futures_timeout(server: FakeTpuServer, client: Any) -> None:
    server.operation_polls = 1000
    operation = client.create_node(parent=PARENT, node_id="slow", node=node_of())
    with pytest.raises(concurrent.futures.TimeoutError):
        operation.result(timeout=0.1, polling=FAST_POLLING)


@pytest.mark.parametrize(
    ("accelerator_type", "hosts"),
    [
        ("v2-8", 1),
        ("v3-32", 4),
        ("v4-8", 1),
        ("v4-16", 2),
        ("v4-32", 4),
        ("v5p-16", 2),
        ("v5litepod-1", 1),
        ("v5litepod-8", 1),
        ("v5litepod-16", 4),
        ("v6e-8", 1),
        ("v6e-64", 16),
    ],
)
def test_hosts_per_accelerator_type(accelerator_type: str, hosts: int) -> None:
    assert topology_for(accelerator_type).hosts == hosts


@pytest.mark.parametrize("accelerator_type", ["v9-8", "v4-3", "v5litepod-12", "tpu"])
def test_unknown_accelerator_types_are_invalid(accelerator_type: str) -> None:
    with pytest.raises(ApiError) as error:
        topology_for(accelerator_type)
    assert error.value.status == "INVALID_ARGUMENT" and error.value.http == 400


def test_accelerator_config_instead_of_type(client: Any) -> None:
    config = tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V5LITE_POD, topology="4x4")
    operation = client.create_node(
        parent=PARENT, node_id="cfg", node=tpu_v2.Node(accelerator_config=config, runtime_version=RUNTIME)
    )
    node = operation.result(polling=FAST_POLLING)
    assert node.accelerator_type == "v5litepod-16" and len(node.network_endpoints) == 4
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD


def test_worker_addresses_come_from_the_settable_pool(server: FakeTpuServer, client: Any) -> None:
    server.worker_addresses = ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    server.external_addresses = ["34.0.0.2", "34.0.0.3", "34.0.0.4"]

    def addresses(node: Any) -> list[tuple[str, str]]:
        return [(e.ip_address, e.access_config.external_ip) for e in node.network_endpoints]

    first = create_ready(client, "a", "v4-16")
    assert addresses(first) == [("10.0.0.2", "34.0.0.2"), ("10.0.0.3", "34.0.0.3")]
    assert addresses(create_ready(client, "b")) == [("10.0.0.4", "34.0.0.4")]
    client.delete_node(name=first.name).result(polling=FAST_POLLING)
    # freed addresses come back first
    assert addresses(create_ready(client, "c", "v4-16"))[0][0] == "10.0.0.2"
    server.worker_addresses = ["127.0.0.1"]  # exhausted pools are reused cyclically
    assert {e.ip_address for e in create_ready(client, "d", "v4-32").network_endpoints} == {"127.0.0.1"}


def test_internal_only_network_has_no_access_config(client: Any) -> None:
    """A request networkConfig without enable_external_ips (proto3 default False) gives workers no external
    IP."""
    node = create_ready(client, "private", network_config=tpu_v2.NetworkConfig(network="default"))
    (endpoint,) = node.network_endpoints
    assert endpoint.ip_address == "127.0.1.10" and endpoint.access_config.external_ip == ""


def test_guest_attributes_carry_each_workers_host_keys(server: FakeTpuServer, client: Any) -> None:
    """The real client parses GetGuestAttributes: one entry per asked worker, in the order asked, keys split
    into key type and base64 blob like a TPU VM's guest agent publishes them; unpublished workers have no
    items."""
    server.host_keys = {
        "127.0.1.10": "ssh-ed25519 AAAAkey0 root@w0",
        "127.0.1.12": "ssh-ed25519 AAAAkey2\nssh-rsa AAAArsa2",
    }
    node = create_ready(client, "hk", "v4-32")
    request = tpu_v2.GetGuestAttributesRequest(name=node.name, query_path="hostkeys/")
    every = client.get_guest_attributes(request=request).guest_attributes
    items = [[(i.namespace, i.key, i.value) for i in entry.query_value.items] for entry in every]
    assert items == [
        [("hostkeys", "ssh-ed25519", "AAAAkey0")],
        [],
        [("hostkeys", "ssh-ed25519", "AAAAkey2"), ("hostkeys", "ssh-rsa", "AAAArsa2")],
        [],
    ]
    assert every[0].query_path == "hostkeys/"
    request = tpu_v2.GetGuestAttributesRequest(
        name=node.name, query_path="hostkeys/ssh-ed25519", worker_ids=["2", "0"]
    )
    picked = client.get_guest_attributes(request=request).guest_attributes
    assert [[i.value for i in entry.query_value.items] for entry in picked] == [["AAAAkey2"], ["AAAAkey0"]]
    assert server.calls("GetGuestAttributes")[-1].body == {
        "queryPath": "hostkeys/ssh-ed25519",
        "workerIds": ["2", "0"],
    }

    server.omit_unpublished = True
    answer = client.get_guest_attributes(request={"name": node.name, "query_path": "hostkeys/"})
    assert len(answer.guest_attributes) == 2
    with pytest.raises(gexc.BadRequest, match="Invalid worker id '4'"):
        client.get_guest_attributes(request={"name": node.name, "worker_ids": ["4"]})
    with pytest.raises(gexc.NotFound):
        client.get_guest_attributes(request={"name": f"{PARENT}/nodes/missing"})
    status, body = raw(server, "POST", f"/v2/{node.name}:getGuestAttributes", {"queryPath": "/", "bogus": 1})
    assert status == 400 and 'Unknown name "bogus"' in body["error"]["message"]
    status, body = raw(server, "POST", f"/v2/{node.name}:reset", {})
    assert (status, body["error"]["status"]) == (501, "UNIMPLEMENTED")


def test_what_gcloud_tpu_vm_ssh_asks_for_worker_all(server: FakeTpuServer, client: Any) -> None:
    """`gcloud compute tpus tpu-vm ssh --worker=all` asks for the guest attributes of workerIds [""] (every
    worker) and reads the project from Compute Engine (benchmarks/fanout.py points gcloud's compute endpoint
    here)."""
    server.host_keys = {"127.0.1.10": "ssh-ed25519 AAAAkey0", "127.0.1.11": "ssh-ed25519 AAAAkey1"}
    node = create_ready(client, "all", "v4-16")
    status, body = raw(server, "POST", f"/v2/{node.name}:getGuestAttributes", {"workerIds": [""]})
    assert status == 200 and [e["queryValue"]["items"][0]["value"] for e in body["guestAttributes"]] == [
        "AAAAkey0",
        "AAAAkey1",
    ]
    status, body = raw(server, "GET", "/compute/v1/projects/p1")
    assert status == 200 and body["name"] == "p1" and body["commonInstanceMetadata"]["items"] == []


# ---- reading, updating, deleting -------------------------------------------------------------------------


def test_get_and_list_nodes_follow_pages(server: FakeTpuServer, client: Any) -> None:
    for node_id in ("n-0", "n-1", "n-2"):
        create_ready(client, node_id)
    got = client.get_node(name=f"{PARENT}/nodes/n-1")
    assert got.name.endswith("/n-1") and got.state == tpu_v2.Node.State.READY
    listed = client.list_nodes(request={"parent": PARENT, "page_size": 2})
    assert [n.name.rsplit("/", 1)[1] for n in listed] == ["n-0", "n-1", "n-2"]
    pages = server.calls("ListNodes")
    assert [c.query.get("pageToken") for c in pages] == [None, "2"]
    assert list(client.list_nodes(parent="projects/tpuft-test/locations/europe-west4-a")) == []


def test_update_node_changes_only_the_masked_fields(server: FakeTpuServer, client: Any) -> None:
    node = create_ready(client, "upd", metadata={"old": "1"}, labels={"team": "t5"})
    wanted = tpu_v2.Node(name=node.name, metadata={"startup-script": "echo hi"}, labels={"team": "CHANGED"})
    operation = client.update_node(node=wanted, update_mask=field_mask_pb2.FieldMask(paths=["metadata"]))
    updated = operation.result(polling=FAST_POLLING)
    assert dict(updated.metadata) == {"startup-script": "echo hi"}
    assert dict(updated.labels) == {"team": "t5"}  # in the body, but not in the mask
    assert dict(client.get_node(name=node.name).metadata) == {"startup-script": "echo hi"}
    (call,) = server.calls("UpdateNode")
    assert (
        call.method == "PATCH" and call.path == f"/v2/{node.name}" and call.query["updateMask"] == "metadata"
    )
    assert set(call.body) == {"metadata", "labels"}  # the client sends the whole Node minus its name


def test_update_node_without_mask_is_bad_request(client: Any) -> None:
    node = create_ready(client, "nomask")
    with pytest.raises(gexc.BadRequest, match="updateMask is required"):
        client.update_node(node=tpu_v2.Node(name=node.name, metadata={"a": "b"}))


def test_delete_node_then_get_is_not_found(server: FakeTpuServer, client: Any) -> None:
    node = create_ready(client, "gone")
    operation = client.delete_node(name=node.name)
    assert client.get_node(name=node.name).state == tpu_v2.Node.State.DELETING
    assert isinstance(operation.result(polling=FAST_POLLING), empty_pb2.Empty)
    with pytest.raises(gexc.NotFound) as error:
        client.get_node(name=node.name)
    assert error.value.code == 404 and "was not found" in error.value.message
    assert list(client.list_nodes(parent=PARENT)) == []
    assert server.node("gone") is None


def test_polling_the_node_also_finishes_its_operation(server: FakeTpuServer, client: Any) -> None:
    """A provider may poll get_node instead of the operation; both make progress."""
    client.create_node(parent=PARENT, node_id="watched", node=node_of())
    states = [client.get_node(name=f"{PARENT}/nodes/watched").state for _ in range(2)]
    assert states == [tpu_v2.Node.State.CREATING, tpu_v2.Node.State.READY]


def test_preempt_shows_preempted(server: FakeTpuServer, client: Any) -> None:
    node = create_ready(client, "spot", scheduling_config=tpu_v2.SchedulingConfig(spot=True))
    server.preempt("spot")
    seen = client.get_node(name=node.name)
    assert seen.state == tpu_v2.Node.State.PREEMPTED and seen.scheduling_config.spot
    assert seen.health == tpu_v2.Node.Health.HEALTH_UNSPECIFIED and len(seen.network_endpoints) == 1


def test_symptoms_are_reported(server: FakeTpuServer, client: Any) -> None:
    node = create_ready(client, "sick")
    server.add_symptom("sick", "HBM_OUT_OF_MEMORY", details="worker 0 OOM", worker_id="0")
    (symptom,) = client.get_node(name=node.name).symptoms
    assert symptom.symptom_type == tpu_v2.Symptom.SymptomType.HBM_OUT_OF_MEMORY and symptom.worker_id == "0"


# ---- errors as the client raises them --------------------------------------------------------------------


def test_creating_an_existing_node_is_conflict_not_already_exists(client: Any) -> None:
    create_ready(client, "dup")
    with pytest.raises(gexc.Conflict) as error:
        client.create_node(parent=PARENT, node_id="dup", node=node_of())
    # REST maps by HTTP status: 409 -> Conflict, never AlreadyExists
    assert type(error.value) is gexc.Conflict
    assert error.value.code == 409 and "already exists" in error.value.message
    assert error.value.response.json()["error"]["status"] == "ALREADY_EXISTS"


def test_stockout_fails_the_operation_with_resource_exhausted(server: FakeTpuServer, client: Any) -> None:
    server.fail_next_create()
    # the call itself succeeds
    operation = client.create_node(parent=PARENT, node_id="big", node=node_of("v4-32"))
    with pytest.raises(gexc.ResourceExhausted) as error:
        operation.result(polling=FAST_POLLING)
    assert isinstance(error.value, gexc.TooManyRequests)
    assert operation.operation.error.code == 8  # google.rpc.Code, not HTTP
    assert f'no more capacity in the zone "{ZONE}"' in error.value.message
    with pytest.raises(gexc.NotFound):
        client.get_node(name=f"{PARENT}/nodes/big")
    assert create_ready(client, "big", "v4-32").state == tpu_v2.Node.State.READY  # one-shot


def test_quota_error_is_a_synchronous_429(server: FakeTpuServer, client: Any) -> None:
    server.fail_next_create(synchronous=True)
    with pytest.raises(gexc.TooManyRequests) as error:
        client.create_node(parent=PARENT, node_id="q", node=node_of())
    assert type(error.value) is gexc.TooManyRequests and error.value.code == 429  # not ResourceExhausted
    assert "Quota limit" in error.value.message and server.node("q") is None


def test_transient_errors_reach_a_caller_that_does_not_retry(server: FakeTpuServer, client: Any) -> None:
    """TPU RPCs have no default retry in google-cloud-tpu 1.28: every 503 surfaces as ServiceUnavailable."""
    node = create_ready(client, "flaky")
    server.transient_errors(2)
    for _ in range(2):
        with pytest.raises(gexc.ServiceUnavailable):
            client.get_node(name=node.name)
    assert client.get_node(name=node.name).state == tpu_v2.Node.State.READY


def test_transient_errors_are_absorbed_by_an_explicit_retry(server: FakeTpuServer, client: Any) -> None:
    node = create_ready(client, "flaky")
    server.transient_errors(2)
    assert client.get_node(name=node.name, retry=FAST_RETRY).name == node.name
    assert [c.status for c in server.calls("GetNode")] == [503, 503, 200]


def test_transient_errors_while_polling_are_retried(server: FakeTpuServer, client: Any) -> None:
    """Operation polling GETs retry 503 by default (0.5 s first delay); result(retry=...) makes that fast."""
    operation = client.create_node(parent=PARENT, node_id="poll", node=node_of())
    server.transient_errors(2)
    assert operation.result(polling=FAST_POLLING, retry=FAST_RETRY).state == tpu_v2.Node.State.READY
    assert [c.status for c in server.calls("GetOperation")][:2] == [503, 503]


def test_denied_permission_is_forbidden_with_reason(server: FakeTpuServer, client: Any) -> None:
    server.deny("tpu.nodes.create")
    with pytest.raises(gexc.Forbidden) as error:
        client.create_node(parent=PARENT, node_id="nope", node=node_of())
    assert error.value.code == 403 and error.value.reason == "IAM_PERMISSION_DENIED"
    assert error.value.metadata == {"permission": "tpu.nodes.create", "resource": f"{PARENT}/nodes/nope"}
    assert list(client.list_nodes(parent=PARENT)) == []  # other permissions still allowed
    server.allow()
    assert create_ready(client, "nope").state == tpu_v2.Node.State.READY


def test_invalid_requests_are_bad_request(client: Any) -> None:
    with pytest.raises(gexc.BadRequest, match="not supported"):
        client.create_node(parent=PARENT, node_id="x", node=node_of("v9-8"))
    with pytest.raises(gexc.BadRequest, match="runtimeVersion is required"):
        client.create_node(parent=PARENT, node_id="x", node=tpu_v2.Node(accelerator_type="v4-8"))
    with pytest.raises(gexc.BadRequest, match="Invalid nodeId"):
        client.create_node(parent=PARENT, node_id="Bad_Name", node=node_of())


def test_operations_get_and_list(client: Any) -> None:
    with pytest.raises(gexc.NotFound):
        client.get_operation(request={"name": f"{PARENT}/operations/operation-404"})
    create_ready(client, "op")
    (listed,) = client.list_operations(request={"name": PARENT}).operations
    assert listed.done and listed.name == f"{PARENT}/operations/operation-1"
    assert client.get_operation(request={"name": listed.name}).done


# ---- queued resources ------------------------------------------------------------------------------------


def test_queued_resource_multislice_lifecycle(server: FakeTpuServer, client: Any) -> None:
    name = f"{PARENT}/queuedResources/qr"
    operation = client.create_queued_resource(
        parent=PARENT, queued_resource_id="qr", queued_resource=queued_multislice("qr", "slice", 2)
    )
    created = operation.result(polling=FAST_POLLING)
    assert created.name == name and created.state.state == tpu_v2.QueuedResourceState.State.ACCEPTED
    assert "spot" in created and created.queueing_policy.valid_until_duration.total_seconds() == 3600

    states = []
    for _ in range(3):
        queued = client.get_queued_resource(name=name)
        states.append(queued.state.state.name)
        if queued.state.state == tpu_v2.QueuedResourceState.State.PROVISIONING:
            assert {n.state for n in client.list_nodes(parent=PARENT)} == {tpu_v2.Node.State.CREATING}
    assert states == ["ACCEPTED", "PROVISIONING", "ACTIVE"]
    assert queued.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE

    nodes = list(client.list_nodes(parent=PARENT))
    assert [n.name for n in nodes] == [f"{PARENT}/nodes/slice-0", f"{PARENT}/nodes/slice-1"]
    for node in nodes:
        assert node.state == tpu_v2.Node.State.READY and len(node.network_endpoints) == 4  # v5litepod-16
        assert node.queued_resource == name and node.multislice_node and node.scheduling_config.spot
    assert [q.name for q in client.list_queued_resources(parent=PARENT)] == [name]

    with pytest.raises(gexc.BadRequest) as refused:  # nodes exist and force is not set
        client.delete_queued_resource(name=name)
    assert refused.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"

    forced = client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True))
    assert server.calls("DeleteQueuedResource")[-1].query["force"] == "true"
    assert client.get_queued_resource(name=name).state.state == tpu_v2.QueuedResourceState.State.DELETING
    assert isinstance(forced.result(polling=FAST_POLLING), empty_pb2.Empty)
    with pytest.raises(gexc.NotFound):
        client.get_queued_resource(name=name)
    assert list(client.list_nodes(parent=PARENT)) == []


def test_queued_resource_single_node_guaranteed_with_reservation(server: FakeTpuServer, client: Any) -> None:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node_id="solo", node=node_of("v4-8"))
    request = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        guaranteed=tpu_v2.QueuedResource.Guaranteed(),
        reservation_name=f"projects/{PROJECT}/locations/{ZONE}/reservations/r1",
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_time={"seconds": 2_000_000_000}),
    )
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="solo-qr", queued_resource=request
    ).result(polling=FAST_POLLING)
    server.settle()
    queued = client.get_queued_resource(name=f"{PARENT}/queuedResources/solo-qr")
    assert queued.state.state == tpu_v2.QueuedResourceState.State.ACTIVE and "guaranteed" in queued
    assert queued.reservation_name.endswith("/reservations/r1")
    assert queued.queueing_policy.valid_until_time.timestamp() == 2_000_000_000
    node = client.get_node(name=f"{PARENT}/nodes/solo")
    assert (
        node.state == tpu_v2.Node.State.READY and node.scheduling_config.reserved and not node.multislice_node
    )


def test_fail_queued_next_reports_failed_data(server: FakeTpuServer, client: Any) -> None:
    server.fail_queued(None, "no v5e capacity right now")
    name = f"{PARENT}/queuedResources/doomed"
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="doomed", queued_resource=queued_multislice("doomed", "d", 1)
    ).result(polling=FAST_POLLING)
    states = [client.get_queued_resource(name=name).state for _ in range(3)]
    assert [s.state.name for s in states] == ["ACCEPTED", "FAILED", "FAILED"]
    failed = states[-1].failed_data.error
    assert failed.message == "no v5e capacity right now" and failed.code == 8
    assert list(client.list_nodes(parent=PARENT)) == []
    client.delete_queued_resource(name=name).result(polling=FAST_POLLING)  # no nodes: force not needed


def test_fail_queued_by_id_fails_an_active_one(server: FakeTpuServer, client: Any) -> None:
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="live", queued_resource=queued_multislice("live", "l", 2)
    ).result(polling=FAST_POLLING)
    server.settle()
    server.fail_queued("live", "maintenance ate it")
    queued = client.get_queued_resource(name=f"{PARENT}/queuedResources/live")
    assert (
        queued.state.state.name == "FAILED" and queued.state.failed_data.error.message == "maintenance ate it"
    )
    assert list(client.list_nodes(parent=PARENT)) == []


def test_queued_states_are_configurable(server: FakeTpuServer, client: Any) -> None:
    server.queued_states = ("WAITING_FOR_RESOURCES", "ACTIVE")
    server.queued_gets_per_state = 2
    name = f"{PARENT}/queuedResources/wait"
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="wait", queued_resource=queued_multislice("wait", "w", 1)
    ).result(polling=FAST_POLLING)
    states = [client.get_queued_resource(name=name).state.state.name for _ in range(3)]
    assert states == ["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "ACTIVE"]
    assert client.get_node(name=f"{PARENT}/nodes/w-0").state == tpu_v2.Node.State.READY


def test_suspend_queued_deletes_its_nodes(server: FakeTpuServer, client: Any) -> None:
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="sus", queued_resource=queued_multislice("sus", "s", 1)
    ).result(polling=FAST_POLLING)
    server.settle()
    server.suspend_queued("sus")
    queued = client.get_queued_resource(name=f"{PARENT}/queuedResources/sus")
    assert (
        queued.state.state == tpu_v2.QueuedResourceState.State.SUSPENDED and "suspended_data" in queued.state
    )
    assert list(client.list_nodes(parent=PARENT)) == []


def test_a_multislice_queued_resource_loses_one_slice_and_is_recreated_whole(
    server: FakeTpuServer, client: Any
) -> None:
    """Each slice is its own node with its own workers and host keys; one slice preempted takes the queued
    resource with it (SUSPENDING, then SUSPENDED with every node gone); created again, it comes back as new
    nodes on the addresses the pool gives then."""
    server.worker_addresses = [f"127.0.2.{i}" for i in range(1, 5)]
    server.host_keys = {a: f"ssh-ed25519 AAAAkey{a.rsplit('.', 1)[1]}" for a in server.worker_addresses}
    name = f"{PARENT}/queuedResources/ms"
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="ms", queued_resource=queued_multislice("ms", "ms", 2, "v4-16")
    ).result(polling=FAST_POLLING)
    server.settle()
    first = [client.get_node(name=f"{PARENT}/nodes/ms-{s}") for s in range(2)]
    assert [[e.ip_address for e in n.network_endpoints] for n in first] == [
        ["127.0.2.1", "127.0.2.2"],
        ["127.0.2.3", "127.0.2.4"],
    ]
    keys = [
        [
            entry.query_value.items[0].value
            for entry in client.get_guest_attributes(
                request={"name": n.name, "query_path": "hostkeys/"}
            ).guest_attributes
        ]
        for n in first
    ]
    # each slice answers for its own workers
    assert keys == [
        ["AAAAkey1", "AAAAkey2"],
        ["AAAAkey3", "AAAAkey4"],
    ]

    server.preempt("ms-1")
    states = [client.get_node(name=n.name).state.name for n in first]
    queued = client.get_queued_resource(name=name)
    assert states == ["READY", "PREEMPTED"]
    assert queued.state.state.name == "SUSPENDING" and queued.state.state_initiator.name == "SERVICE"
    assert queued.state.state.name == client.get_queued_resource(name=name).state.state.name  # it stays there
    server.suspend_queued("ms")
    assert client.get_queued_resource(name=name).state.state.name == "SUSPENDED"
    assert list(client.list_nodes(parent=PARENT)) == []

    client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True)).result(
        polling=FAST_POLLING
    )
    server.worker_addresses = [f"127.0.3.{i}" for i in range(1, 5)]
    client.create_queued_resource(
        parent=PARENT, queued_resource_id="ms", queued_resource=queued_multislice("ms", "ms", 2, "v4-16")
    ).result(polling=FAST_POLLING)
    server.settle()
    again = [client.get_node(name=f"{PARENT}/nodes/ms-{s}") for s in range(2)]
    assert [n.state.name for n in again] == ["READY", "READY"]
    assert client.get_queued_resource(name=name).state.state.name == "ACTIVE"
    assert {n.id for n in again}.isdisjoint({n.id for n in first})
    assert [e.ip_address for n in again for e in n.network_endpoints] == server.worker_addresses


# ---- wire format without the client ----------------------------------------------------------------------


def test_errors_have_googles_json_shape(server: FakeTpuServer) -> None:
    status, body = raw(server, "GET", f"/v2/{PARENT}/nodes/missing")
    assert status == 404
    assert body == {
        "error": {
            "code": 404,
            "message": f"Resource '{PARENT}/nodes/missing' was not found",
            "status": "NOT_FOUND",
        }
    }
    status, body = raw(
        server, "POST", f"/v2/{PARENT}/nodes", {"acceleratorType": "v4-8", "runtimeVersion": RUNTIME}
    )
    assert (status, body["error"]["status"], body["error"]["code"]) == (400, "INVALID_ARGUMENT", 400)
    status, body = raw(
        server, "POST", f"/v2/{PARENT}/nodes?nodeId=n", {"acceleratorType": "v4-8", "bogus": 1}
    )
    assert status == 400 and 'Unknown name "bogus"' in body["error"]["message"]
    status, body = raw(server, "GET", f"/v2/{PARENT}/operations/operation-9")
    assert (status, body["error"]["status"]) == (404, "NOT_FOUND")
    status, body = raw(server, "GET", "/v1/whatever")
    assert (status, body["error"]["status"]) == (404, "NOT_FOUND")
    server.transient_errors(1)
    status, body = raw(server, "GET", f"/v2/{PARENT}/nodes")
    assert (status, body["error"]["status"], body["error"]["code"]) == (503, "UNAVAILABLE", 503)
    server.deny("DELETE")
    status, body = raw(server, "DELETE", f"/v2/{PARENT}/nodes/x")
    assert (status, body["error"]["status"]) == (403, "PERMISSION_DENIED")
    assert body["error"]["details"][0]["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"


def test_raw_operation_json_and_enum_encoding(server: FakeTpuServer) -> None:
    """Enums are names unless the caller asks for ``$alt=json;enum-encoding=int`` (as the client does)."""
    body = {"acceleratorConfig": {"type": "V4", "topology": "2x2x1"}, "runtimeVersion": RUNTIME}
    status, operation = raw(server, "POST", f"/v2/{PARENT}/nodes?nodeId=wire", body)
    assert status == 200 and operation["done"] is False
    assert operation["name"] == f"{PARENT}/operations/operation-1"
    assert operation["metadata"]["@type"] == "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
    for _ in range(2):
        _, operation = raw(server, "GET", f"/v2/{operation['name']}")
    assert operation["done"] is True and operation["response"]["@type"].endswith("google.cloud.tpu.v2.Node")
    assert operation["response"]["state"] == "READY" and "endTime" in operation["metadata"]
    _, named = raw(server, "GET", f"/v2/{PARENT}/nodes/wire")
    _, numbered = raw(server, "GET", f"/v2/{PARENT}/nodes/wire?%24alt=json%3Benum-encoding%3Dint")
    assert (named["state"], named["apiVersion"], named["acceleratorConfig"]["type"]) == ("READY", "V2", "V4")
    assert (numbered["state"], numbered["apiVersion"], numbered["acceleratorConfig"]["type"]) == (2, 4, 7)
    assert named["createTime"].endswith("Z") and named["acceleratorType"] == "v4-8"


def test_enum_tables_match_the_installed_protos(client: Any) -> None:
    """The rig hard-codes enum numbers (stdlib only); they must equal google.cloud.tpu.v2's."""
    from tests.rigs import fake_tpu

    node = tpu_v2.Node.pb().DESCRIPTOR
    queued_state = tpu_v2.QueuedResourceState.pb().DESCRIPTOR

    def numbers(descriptor: Any, field: str) -> dict[str, int]:
        return {v.name: v.number for v in descriptor.fields_by_name[field].enum_type.values}

    assert numbers(node, "state") == fake_tpu.NODE_STATE
    assert numbers(node, "health") == fake_tpu.NODE_HEALTH
    assert numbers(node, "api_version") == fake_tpu.API_VERSION
    assert numbers(tpu_v2.AcceleratorConfig.pb().DESCRIPTOR, "type_") == fake_tpu.ACCELERATOR_CONFIG_TYPE
    assert numbers(tpu_v2.AttachedDisk.pb().DESCRIPTOR, "mode") == fake_tpu.DISK_MODE
    assert numbers(tpu_v2.Symptom.pb().DESCRIPTOR, "symptom_type") == fake_tpu.SYMPTOM_TYPE
    assert numbers(queued_state, "state") == fake_tpu.QUEUED_STATE
    assert numbers(queued_state, "state_initiator") == fake_tpu.STATE_INITIATOR
    assert {f.json_name for f in node.fields} == fake_tpu.NODE_FIELDS


def test_close_is_prompt_with_kept_alive_connections(client: Any) -> None:
    with FakeTpuServer() as other:
        other_client = make_client(other.endpoint)
        list(other_client.list_nodes(parent=PARENT))  # leaves a keep-alive connection open
        started = time.monotonic()
    assert time.monotonic() - started < 1.0
