"""``gcp.api: compute`` through the CLI, against the stand-in Compute Engine API (tests/rigs/fake_compute.py)
with the real google-cloud-compute client: TPU7x slices as managed instance groups with a workload policy,
single-host slices as instances, the bad combinations refused at their line before any call. Nothing here
reaches Google."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.providers.gcp.tuning as gcp_module
from tests.rigs.fake_compute import FakeComputeServer
from tests.rigs.gcs_emulator import GcsEmulator

ZONE = "us-central1-c"


@pytest.fixture
def fake_compute(monkeypatch: pytest.MonkeyPatch, gcs: GcsEmulator) -> Iterator[FakeComputeServer]:
    monkeypatch.setattr(gcp_module, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(gcp_module, "RETRY_BASE_S", 0.01)
    for key, value in gcs.env().items():  # `create` makes the bucket: in the emulator
        monkeypatch.setenv(key, value)
    with FakeComputeServer(operation_polls=2) as server:
        yield server


def cluster_yaml(
    tmp_path: Path, server: FakeComputeServer, *, extra_gcp: str = "", accelerator: str = "tpu7x-16"
) -> Path:
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        f"name: tx\nprovider: gcp\naccelerator: {accelerator}\n"
        f"gcp:\n  project: tpuft-test\n  zone: {ZONE}\n  api: compute\n"
        f"  compute_api_endpoint: {server.endpoint}\n{extra_gcp}"
    )
    return path


def test_a_tpu7x_slice_is_a_group_whose_hosts_are_the_workers_in_worker_id_order(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_compute, extra_gcp="  spot: true\n  labels: {team: nlp}\n")
    refused = cli("create", "-c", str(cluster))
    assert refused.code == 2 and "costs money: pass --yes" in refused.err
    assert "8 chips: about $96.00 per hour" in refused.out
    assert not [r for r in fake_compute.requests if r.method != "GET"]  # it looked, and made nothing

    made = cli("create", "-c", str(cluster), "--yes", "--json")
    assert made.code == 0, made.err
    info = json.loads(made.out)
    assert info["created"] is True and info["state"] == "READY" and info["details"]["api"] == "compute"
    assert fake_compute.resources() == {
        "instanceTemplates": ["tx-tpuft"],
        "resourcePolicies": ["tx-tpuft"],
        "instanceGroupManagers": ["tx"],
        "instances": sorted(i["name"] for i in fake_compute.instances()),
    }
    # the stand-in names hosts so that name order is the reverse of worker order: tpuft follows TPU_WORKER_ID
    by_worker = sorted(fake_compute.instances(), key=lambda i: i["metadata"]["items"][-1]["value"])
    assert [w["address"] for w in info["workers"]] == [
        i["networkInterfaces"][0]["networkIP"] for i in by_worker
    ]
    assert [i["name"] for i in by_worker] == sorted((i["name"] for i in by_worker), reverse=True)
    # every poll of every operation was answered here (the client's own helpers would have left for
    # compute.googleapis.com, which this machine cannot reach)
    assert len(fake_compute.calls("operations.get")) >= 3
    template = fake_compute.calls("instanceTemplates.insert")[0].body["properties"]
    assert template["labels"] == {"created-by": "tpuft", "tpuft-cluster": "tx", "team": "nlp"}
    assert template["scheduling"]["provisioningModel"] == "SPOT"

    again = cli("create", "-c", str(cluster), "--json")  # no --yes needed: nothing new is billed
    assert again.code == 0 and json.loads(again.out)["created"] is False
    assert len(fake_compute.calls("instanceGroupManagers.insert")) == 1

    shown = cli("status", "-c", str(cluster))
    assert shown.code == 0 and "READY" in shown.out and info["workers"][1]["address"] in shown.out

    gone = cli("delete", "-c", str(cluster), "--yes")
    assert gone.code == 0, gone.err
    assert fake_compute.resources() == {
        "instanceTemplates": [],
        "resourcePolicies": [],
        "instanceGroupManagers": [],
        "instances": [],
    }
    assert json.loads(cli("status", "-c", str(cluster), "--json").out)["state"] == "NOT_FOUND"


def test_a_stocked_out_zone_is_waited_out_and_said_while_waiting(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    fake_compute.stockout[ZONE] = 4  # the MIG's first four tries find no capacity; the fifth does
    made = cli("create", "-c", str(cluster_yaml(tmp_path, fake_compute)), "--yes", "--json")
    assert made.code == 0, made.err
    assert json.loads(made.out)["state"] == "READY" and fake_compute.stockout[ZONE] == 0


def test_a_stockout_that_outlasts_the_wait_is_named(
    cli, tmp_path: Path, fake_compute: FakeComputeServer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(gcp_module, "CREATE_TIMEOUT_S", 0.5)
    fake_compute.stockout[ZONE] = 10**6
    failed = cli("create", "-c", str(cluster_yaml(tmp_path, fake_compute)), "--yes")
    assert failed.code != 0
    assert "0 of 2 hosts running" in failed.err and "ZONE_RESOURCE_POOL_EXHAUSTED" in failed.err, failed.err


def test_a_single_host_slice_is_one_instance_and_its_stockout_is_said_as_such(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_compute, accelerator="v6e-8", extra_gcp="  skip_zone_check: true\n")
    fake_compute.stockout[ZONE] = 1
    failed = cli("create", "-c", str(cluster), "--yes")
    assert failed.code != 0 and "the zone has no capacity for it now" in failed.err, failed.err
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in failed.err

    made = cli("create", "-c", str(cluster), "--yes", "--json")  # capacity is back: the rest is made
    assert made.code == 0, made.err
    assert len(json.loads(made.out)["workers"]) == 1
    assert fake_compute.resources()["instances"] == ["tx"]
    assert fake_compute.resources()["resourcePolicies"] == []  # one host: no workload policy
    assert len(fake_compute.calls("instanceTemplates.insert")) == 1  # made once, reused by the retry
    assert fake_compute.calls("instances.insert")[-1].query["sourceInstanceTemplate"].endswith("/tx-tpuft")


def test_multislice_is_one_group_per_slice_from_one_template_and_policy(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_compute, extra_gcp="  slices: 2\n")
    made = cli("create", "-c", str(cluster), "--yes", "--json")
    assert made.code == 0, made.err
    info = json.loads(made.out)
    assert [w["slice"] for w in info["workers"]] == [0, 0, 1, 1]
    assert fake_compute.resources()["instanceGroupManagers"] == ["tx-0", "tx-1"]
    assert fake_compute.resources()["resourcePolicies"] == ["tx-tpuft"]
    assert cli("delete", "-c", str(cluster), "--yes").code == 0
    assert not any(fake_compute.resources().values())


def test_the_dry_run_shows_every_body_and_calls_nothing(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    shown = cli("create", "-c", str(cluster_yaml(tmp_path, fake_compute)), "--dry-run", "--json")
    assert shown.code == 0, shown.err
    plan = json.loads(shown.out)["create"]
    assert plan["machine_type"] == "tpu7x-standard-4t" and plan["topology"] == "2x2x2"
    assert [r["rpc"] for r in plan["requests"]] == [
        "instanceTemplates.insert",
        "resourcePolicies.insert",
        "instanceGroupManagers.insert",
    ]
    assert plan["requests"][2]["body"]["targetSize"] == 2
    assert fake_compute.requests == []


@pytest.mark.parametrize(
    ("accelerator", "gcp", "key", "said"),
    [
        ("tpu7x-16", "", "accelerator", "set gcp.api: compute"),
        ("v4-8", "  api: compute\n", "accelerator", "Compute Engine makes no v4 TPUs"),
        ("v6e-16", "  api: compute\n", "accelerator", "multi-host v6e slice"),
        ("tpu7x-16", "  api: compute\n  queued: true\n", "queued", "does not apply to gcp.api: compute"),
        (
            "tpu7x-16",
            "  api: compute\n  runtime_version: v2-alpha-tpuv6e\n",
            "runtime_version",
            "use gcp.image",
        ),
        (
            "v4-8",
            "  image: projects/p1/global/images/family/f\n",
            "image",
            "applies to gcp.api: compute only",
        ),
        ("tpu7x-16", "  api: compute\n  image: ubuntu\n", "image", "is not a Compute Engine image path"),
        ("tpu7x-16", "  api: kompute\n", "api", "compute"),
        (
            "tpu7x-16",
            "  api: compute\n  metadata: {enable-guest-attributes: 'FALSE'}\n",
            "enable-guest-attributes",
            "host keys",
        ),
    ],
)
def test_bad_compute_keys_are_refused_at_their_line_before_any_call(
    cli, tmp_path: Path, accelerator: str, gcp: str, key: str, said: str
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        f"name: tx\nprovider: gcp\naccelerator: {accelerator}\ngcp:\n  project: tpuft-test\n"
        f"  zone: {ZONE}\n  skip_zone_check: true\n{gcp}"
    )
    refused = cli("create", "-c", str(path), "--dry-run")
    assert refused.code == 2, refused.out
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if f"{key}:" in text)
    assert f"tpuft.yaml:{line}" in refused.err and said in refused.err, refused.err


def test_gc_finds_a_preempted_slice_an_idle_one_and_a_stocked_out_group_and_nothing_else(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    def made(name: str, extra: str = "") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        path = cluster_yaml(folder, fake_compute, extra_gcp=f"  spot: true\n{extra}")
        path.write_text(path.read_text().replace("name: tx", f"name: {name}"))
        done = cli("create", "-c", str(path), "--yes")
        assert done.code == 0, done.err
        return path

    made("gone"), made("idle")
    fake_compute.backdate(3 * 3600)  # both made three hours ago, no run since
    fresh = made("fresh")  # made now: not idle yet
    fake_compute.preempt(next(i["name"] for i in fake_compute.instances() if i["name"].startswith("gone-")))
    fake_compute.stockout[ZONE] = 10**6
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    stuck_file = cluster_yaml(stuck, fake_compute)
    stuck_file.write_text(stuck_file.read_text().replace("name: tx", "name: stuck"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gcp_module, "CREATE_TIMEOUT_S", 0.3)
        assert cli("create", "-c", str(stuck_file), "--yes").code != 0  # gave up: its group tries on
    # not tpuft's: a template without its labels, in the same project
    from google.cloud import compute_v1

    from tpuft.providers.gcp.api import rest_client

    theirs = compute_v1.InstanceTemplate(
        name="theirs",
        properties=compute_v1.InstanceProperties(
            machine_type="tpu7x-standard-4t",
            disks=[
                compute_v1.AttachedDisk(
                    boot=True, initialize_params=compute_v1.AttachedDiskInitializeParams(source_image="x")
                )
            ],
        ),
    )
    fake_compute.operation_polls = 0  # done when answered
    rest_client(compute_v1.InstanceTemplatesClient, fake_compute.endpoint, "test").insert_unary(
        project="tpuft-test", instance_template_resource=theirs
    )
    assert "theirs" in fake_compute.resources()["instanceTemplates"]

    listed = cli("gc", "-c", str(fresh), "--json")
    assert listed.code == 0, listed.err
    found = {leak["name"]: leak for leak in json.loads(listed.out)["leaks"]}
    assert set(found) == {"gone", "idle", "stuck"}, found
    assert found["gone"]["state"] == "TERMINATED" and found["gone"]["pricing"] == "spot"
    assert found["idle"]["age_of"] == "idle" and found["idle"]["age_s"] == pytest.approx(3 * 3600, abs=120)
    assert found["idle"]["price_per_hour"] is None  # TPU7x spot: no public price, said unknown
    assert found["stuck"]["state"] == "CREATING" and "still creating its hosts" in found["stuck"]["reason"]
    assert found["stuck"]["pricing"] == "on-demand" and found["stuck"]["price_per_hour"] == 96.0

    deleted = cli("gc", "-c", str(fresh), "--yes")
    assert deleted.code == 0, deleted.err
    left = fake_compute.resources()
    assert left["instanceTemplates"] == ["fresh-tpuft", "theirs"] and left["resourcePolicies"] == [
        "fresh-tpuft"
    ]
    assert left["instanceGroupManagers"] == ["fresh"]
    assert all(name.startswith("fresh-") for name in left["instances"]) and len(left["instances"]) == 2


def test_a_simulated_maintenance_on_a_host_is_in_the_clusters_details(
    cli, tmp_path: Path, fake_compute: FakeComputeServer
) -> None:  # type: ignore[no-untyped-def]
    """What the --recover watcher reads to checkpoint and stop before a window (tpuft.ops.maintenance), from
    the instance's ``resourceStatus.upcomingMaintenance``: here announced by the drill's own call."""
    from tpuft.config.loader import load_cluster
    from tpuft.providers import get_provider

    cluster = cluster_yaml(tmp_path, fake_compute)
    assert cli("create", "-c", str(cluster), "--yes").code == 0
    provider = get_provider(load_cluster(cluster).value)
    host = provider.nodes.host_name("tx", 1)
    provider.nodes.simulate_maintenance(host)
    details = json.loads(cli("status", "-c", str(cluster), "--json").out)["details"]
    assert details[f"maintenance {host}"].startswith("UNSCHEDULED PENDING ")
    assert fake_compute.maintenance_events == [host] and "maintenance" not in details


@pytest.mark.parametrize(
    ("recipe", "refused"),
    [
        ("quickstart", "torch_xla 2.9"),
        ("keras_quickstart", "TensorFlow has no TPU7x support"),
        ("t5x_quickstart", ""),
    ],
)
def test_a_backend_whose_framework_cannot_drive_tpu7x_is_refused_at_its_kind_on_tpus_only(
    cli, tmp_path: Path, fake_compute: FakeComputeServer, recipe: str, refused: str
) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_compute)
    planned = cli("up", recipe, "-c", str(cluster), "--dry-run")
    if refused:
        assert planned.code == 2 and refused in planned.err, planned.err
        assert (
            f"{recipe}.yaml:11: backend.kind: backend" in planned.err
            and "backends that can: t5x" in planned.err
        )
    else:
        assert planned.code == 0, planned.err
        assert "2 worker(s) x 8 TPU device(s) = 16 devices" in planned.out  # two TensorCores per TPU7x chip
    on_cpu = cluster.read_text() + "  worker_device: cpu\n"  # the rigs' hosts: the generation is only a name
    cluster.write_text(on_cpu)
    assert cli("up", recipe, "-c", str(cluster), "--dry-run").code == 0
    assert fake_compute.requests == []
