"""The Compute Engine requests tpuft sends for a TPU7x slice are gcloud's for the same intent (issue 40,
"Measured").

Both sides are recorded by the same stand-in (tests/rigs/fake_compute.py): tpuft through its own code and the
real google-cloud-compute client, gcloud (/usr/bin/gcloud, skipped where it is not installed) with its
Compute Engine endpoint pointed at the stand-in. The commands are the ones Google's TPU7x and TPU Spot pages
give: ``instance-templates create`` (the TPU machine type, the image family,
``--maintenance-policy=TERMINATE``, spot with ``--instance-termination-action=STOP``, a reservation),
``resource-policies create workload-policy --type=HIGH_THROUGHPUT --accelerator-topology``,
``instance-groups managed create --workload-policy``.

Compared as the API reads them: a reference to another resource may be written as a full URL (gcloud resolves
them against its endpoint) or as a partial one (``projects/P/global/...``, what tpuft sends), which the API
takes as the same; fields at their defaults (``canIpForward: false``) are what the API assumes when they are
absent. Nothing else is set aside.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tpuft.providers.gcp.tuning as tuning
from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.gcloud import GCLOUD, gcloud_available, gcloud_env
from tpuft.config import GcpConfig
from tpuft.core.accelerators import lookup
from tpuft.providers.gcp.compute_api import ComputeApi
from tpuft.providers.gcp.compute_slices import ComputeSlices

pytestmark = pytest.mark.skipif(not gcloud_available(), reason="needs gcloud (/usr/bin/gcloud)")

PROJECT, ZONE, NAME = "tpuft-test", "us-central1-c", "tx"
TEMPLATE = f"{NAME}-tpuft"
POLICY = f"projects/{PROJECT}/regions/us-central1/resourcePolicies/{NAME}-tpuft"
DEFAULTS = {"canIpForward": False}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeComputeServer]:
    with FakeComputeServer(operation_polls=0) as fake, pytest.MonkeyPatch.context() as patch:
        patch.setattr(tuning, "POLL_SECONDS", 0.0)
        yield fake


def tpufts(server: FakeComputeServer, **gcp: Any) -> dict[str, Any]:
    """Create a tpu7x-16 through tpuft's own code; the insert bodies it sent, by RPC."""
    server.reset()
    config = GcpConfig(project=PROJECT, zone=ZONE, api="compute", **gcp)
    ComputeSlices(ComputeApi(PROJECT, ZONE, NAME, 1, server.endpoint), config, lookup("tpu7x-16")).create(
        None
    )
    return {r.rpc: r.body for r in server.requests if r.rpc.endswith(".insert")}


def gclouds(server: FakeComputeServer, tmp_path: Path, *template_flags: str) -> dict[str, Any]:
    """The same slice made by gcloud, by the commands of Google's TPU7x pages; the insert bodies it sent."""
    server.reset()
    env = gcloud_env(tmp_path, PROJECT, compute_endpoint=server.endpoint)
    commands = [
        [
            "instance-templates",
            "create",
            TEMPLATE,
            "--machine-type=tpu7x-standard-4t",
            "--image-family=ubuntu-accel-2404-amd64-tpu-tpu7x",
            "--image-project=ubuntu-os-accelerator-images",
            "--maintenance-policy=TERMINATE",
            f"--labels=created-by=tpuft,tpuft-cluster={NAME}",
            "--metadata=enable-guest-attributes=TRUE",
            "--scopes=cloud-platform",
            *template_flags,
        ],
        [
            "resource-policies",
            "create",
            "workload-policy",
            f"{NAME}-tpuft",
            "--type=HIGH_THROUGHPUT",
            "--accelerator-topology=2x2x2",
            "--region=us-central1",
        ],
        [
            "instance-groups",
            "managed",
            "create",
            NAME,
            f"--template={TEMPLATE}",
            "--size=2",
            f"--zone={ZONE}",
            f"--workload-policy={POLICY}",
        ],
    ]
    for command in commands:
        done = subprocess.run(
            [GCLOUD, "compute", *command], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, (command, done.stderr[-2000:])
    return {r.rpc: r.body for r in server.requests if r.rpc.endswith(".insert")}


def as_the_api_reads_it(body: Any) -> Any:
    """References as partial URLs (``projects/...``), whoever wrote them how, and defaults left out."""
    if isinstance(body, dict):
        return {k: as_the_api_reads_it(v) for k, v in body.items() if DEFAULTS.get(k, object()) != v}
    if isinstance(body, list):
        return [as_the_api_reads_it(v) for v in body]
    if isinstance(body, str):
        return re.sub(r"^https?://[^/]+/compute/v1/", "", body)
    return body


@pytest.mark.parametrize(
    ("intent", "gcp", "flags"),
    [
        ("on-demand", {}, ()),
        (
            "spot",
            {"spot": True},
            ("--provisioning-model=SPOT", "--instance-termination-action=STOP"),
        ),
        (
            "a named reservation",
            {"reservation": "r1"},
            ("--reservation-affinity=specific", "--reservation=r1"),
        ),
        ("any reservation", {"reserved": True}, ("--reservation-affinity=any",)),
    ],
)
def test_a_tpu7x_slice_is_asked_for_as_gcloud_asks(
    server: FakeComputeServer, tmp_path: Path, intent: str, gcp: dict[str, Any], flags: tuple[str, ...]
) -> None:
    ours, theirs = tpufts(server, **gcp), gclouds(server, tmp_path, *flags)
    assert (
        set(ours)
        == set(theirs)
        == {
            "instanceTemplates.insert",
            "resourcePolicies.insert",
            "instanceGroupManagers.insert",
        }
    )
    for rpc in ours:
        # gcloud says the group's zone and the policy's region in the body too, which the path already says
        theirs[rpc].pop("zone" if rpc.startswith("instanceGroup") else "region", None)
        assert as_the_api_reads_it(ours[rpc]) == as_the_api_reads_it(theirs[rpc]), (intent, rpc)
