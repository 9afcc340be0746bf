"""Each create request tpuft sends is the one gcloud sends for the same intent (issue 25, item 9).

gcloud's bodies are written out below as gcloud 578.0.0 (GA track, TPU API v2) builds them, from its sources:
``surface/compute/tpus/tpu_vm/create.yaml`` with ``command_lib/compute/tpus/tpu_vm/flags.yaml`` (``--spot``,
``--preemptible``, ``--reserved`` are ``node.schedulingConfig.*``; ``--network`` defaults to ``default``; the
metadata hook always sets a ``metadata`` map), and ``surface/compute/tpus/queued_resources/create.yaml`` with
``command_lib/compute/tpus/queued_resources/util.py`` (``CreateNodeSpec``: the node without a scheduling
config, always a ``serviceAccount`` and ``networkConfig``; ``SetSpot``: ``spot: {}``;
``CreateReservationName``: ``--reserved`` becomes ``reservationName:
projects/P/locations/ZONE/reservations/-``, a short ``--reservation`` name (alpha track)
``projects/P/locations/ZONE/reservations/NAME``; ``--node-count``/``--node-prefix``: ``multisliceParams``).
Every gcloud line below adds ``--labels=created-by=tpuft``, the label tpuft puts on its nodes.

Both sides are compared as the API reads them: parsed into the ``tpu_v2`` message and written back, which
drops what proto3 cannot tell from absent (``false``, ``""``, an empty map) and keeps what it can (``spot:
{}``). One equivalence is the API's own and is stated where it is used: an empty ``serviceAccount`` is the
default one ("If empty, default Compute service account will be used", NetworkConfig/ServiceAccount in the v2
reference). tpuft's side is what the fake TPU API server recorded (tests/rigs/fake_tpu.py): nothing is mocked
in the client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import tpuft.providers.gcp.tuning as tuning
from tests.rigs.fake_tpu import FakeTpuServer
from tpuft.config import GcpConfig
from tpuft.core.accelerators import lookup
from tpuft.providers.gcp.api import TpuApi
from tpuft.providers.gcp.nodes import TpuNodes

PROJECT, ZONE, NAME = "tpuft-test", "us-central2-b", "tp"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "tpu-ubuntu2204-base"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeTpuServer]:
    with (
        FakeTpuServer(operation_polls=1, queued_gets_per_state=0) as fake,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(tuning, "POLL_SECONDS", 0.0)
        yield fake


def sent(server: FakeTpuServer, accelerator: str = "v4-8", **gcp: Any) -> tuple[str, dict[str, str], Any]:
    """Create through tpuft's own code against the fake server; what it recorded: (rpc, query, body)."""
    server.reset()
    config = GcpConfig(project=PROJECT, zone=ZONE, **gcp)
    nodes = TpuNodes(TpuApi(PROJECT, ZONE, NAME, config.slices, server.endpoint), config, lookup(accelerator))
    (nodes.create_queued if config.queued else nodes.create_node)(None)
    [request] = [r for r in server.requests if r.rpc.startswith("Create")]
    assert request.path == f"/v2/{PARENT}/{'queuedResources' if config.queued else 'nodes'}"
    return request.rpc, request.query, request.body


def as_the_api_reads_it(body: dict[str, Any], kind: str) -> dict[str, Any]:
    from google.cloud import tpu_v2
    from google.protobuf import json_format

    message = getattr(tpu_v2, kind).pb(getattr(tpu_v2, kind)())
    read = json_format.MessageToDict(json_format.ParseDict(body, message))
    for node in [read] if kind == "Node" else [spec["node"] for spec in read["tpu"]["nodeSpec"]]:
        if node.get("serviceAccount") == {}:
            del node["serviceAccount"]  # the API: an empty service account is the default one
    return read


def gcloud_node(**scheduling: bool) -> dict[str, Any]:
    """``gcloud compute tpus tpu-vm create tp --zone=us-central2-b --accelerator-type=v4-8
    --version=tpu-ubuntu2204-base --labels=created-by=tpuft [--spot | --preemptible | --reserved]``."""
    return {
        "acceleratorType": "v4-8",
        "runtimeVersion": RUNTIME,
        "networkConfig": {"network": "default", "enableExternalIps": True},
        "schedulingConfig": {"preemptible": False, "spot": False, "reserved": False, **scheduling},
        "labels": {"created-by": "tpuft"},
        "metadata": {},
    }


def gcloud_node_spec(**where: Any) -> dict[str, Any]:
    """One ``nodeSpec`` of ``gcloud compute tpus queued-resources create tp --zone=us-central2-b
    --accelerator-type=v4-8 --runtime-version=tpu-ubuntu2204-base --labels=created-by=tpuft`` with
    ``--node-id=tp`` (or ``--node-count``/``--node-prefix``: ``where``)."""
    return {
        "parent": PARENT,
        **(where or {"nodeId": NAME}),
        "node": {
            "acceleratorType": "v4-8",
            "runtimeVersion": RUNTIME,
            "labels": {"created-by": "tpuft"},
            "networkConfig": {"network": "default", "enableExternalIps": True},
            "serviceAccount": {},
            "metadata": {},
        },
    }


@pytest.mark.parametrize(
    ("intent", "gcp", "gcloud"),
    [
        ("on-demand", {}, gcloud_node()),
        ("--spot", {"spot": True}, gcloud_node(spot=True)),
        ("--preemptible", {"preemptible": True}, gcloud_node(preemptible=True)),
        ("--reserved", {"reserved": True}, gcloud_node(reserved=True)),
    ],
)
def test_node_bodies_are_gclouds(
    server: FakeTpuServer, intent: str, gcp: dict[str, Any], gcloud: dict[str, Any]
) -> None:
    rpc, query, body = sent(server, **gcp)
    assert rpc == "CreateNode" and query["nodeId"] == NAME
    assert as_the_api_reads_it(body, "Node") == as_the_api_reads_it(gcloud, "Node"), intent


@pytest.mark.parametrize(
    ("intent", "gcp", "gcloud"),
    [
        ("--node-id=tp (no tier flag)", {}, {"tpu": {"nodeSpec": [gcloud_node_spec()]}}),
        ("--node-id=tp --spot", {"spot": True}, {"tpu": {"nodeSpec": [gcloud_node_spec()]}, "spot": {}}),
        (
            "--node-id=tp --reserved",
            {"reserved": True},
            {"tpu": {"nodeSpec": [gcloud_node_spec()]}, "reservationName": f"{PARENT}/reservations/-"},
        ),
        (
            "--node-id=tp --reservation=r1 (alpha track)",
            {"reservation": "r1"},
            {"tpu": {"nodeSpec": [gcloud_node_spec()]}, "reservationName": f"{PARENT}/reservations/r1"},
        ),
        (
            "--node-count=2 --node-prefix=tp --spot --valid-until-duration=6h",
            {"slices": 2, "spot": True, "valid_until": "6h"},
            {
                "tpu": {
                    "nodeSpec": [gcloud_node_spec(multisliceParams={"nodeCount": 2, "nodeIdPrefix": NAME})]
                },
                "spot": {},
                "queueingPolicy": {"validUntilDuration": "21600s"},
            },
        ),
    ],
)
def test_queued_resource_bodies_are_gclouds(
    server: FakeTpuServer, intent: str, gcp: dict[str, Any], gcloud: dict[str, Any]
) -> None:
    rpc, query, body = sent(server, queued=True, **gcp)
    assert rpc == "CreateQueuedResource" and query["queuedResourceId"] == NAME
    assert as_the_api_reads_it(body, "QueuedResource") == as_the_api_reads_it(gcloud, "QueuedResource"), (
        intent
    )


def test_a_spot_queued_resource_says_spot_once(server: FakeTpuServer) -> None:
    """The issue's finding: spot was sent twice, as the queued resource's tier and as the node's
    scheduling."""
    _, _, body = sent(server, queued=True, spot=True)
    assert body["spot"] == {} and "schedulingConfig" not in body["tpu"]["nodeSpec"][0]["node"]
    assert server.node(NAME)["schedulingConfig"]["spot"] is True  # the API makes the node a spot one itself
