"""``tpuft gc`` against the fake TPU API (tests/rigs/fake_tpu.py, with the real google-cloud-tpu client) and
the GCS emulator (the runs that tell an idle node from a busy one): two zones, nodes in every state, queued
resources, an unlabelled node that must be left alone. Nothing here reaches Google."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.providers.gcp.tuning as gcp_tuning
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.storage import open_storage

PROJECT = "tpuft-test"
HOME_ZONE, OTHER_ZONE = "us-central2-b", "us-east1-d"
BUCKET = "gc-runs"
OURS = {"created-by": "tpuft"}
HOURS = 3600.0


@pytest.fixture
def fake_tpu(monkeypatch: pytest.MonkeyPatch, gcs: GcsEmulator) -> Iterator[FakeTpuServer]:
    monkeypatch.setattr(gcp_tuning, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(gcp_tuning, "RETRY_BASE_S", 0.01)
    with FakeTpuServer(operation_polls=1) as server:
        yield server


def _post(
    server: FakeTpuServer, zone: str, collection: str, resource_id: str, body: dict[str, object]
) -> None:
    id_field = {"nodes": "nodeId", "queuedResources": "queuedResourceId"}[collection]
    url = f"{server.endpoint}/v2/projects/{PROJECT}/locations/{zone}/{collection}?{id_field}={resource_id}"
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def _node(
    server: FakeTpuServer,
    zone: str,
    name: str,
    labels: dict[str, str],
    *,
    spot: bool = False,
    accelerator: str = "v4-8",
) -> None:
    body: dict[str, object] = {
        "acceleratorType": accelerator,
        "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": labels,
    }
    if spot:
        body["schedulingConfig"] = {"spot": True}
    _post(server, zone, "nodes", name, body)


def _queued(server: FakeTpuServer, zone: str, name: str) -> None:
    node = {"acceleratorType": "v5litepod-8", "runtimeVersion": "v2-alpha-tpuv5-lite", "labels": OURS}
    _post(
        server,
        zone,
        "queuedResources",
        name,
        {
            "tpu": {
                "nodeSpec": [{"parent": f"projects/{PROJECT}/locations/{zone}", "nodeId": name, "node": node}]
            },
            "spot": {},
        },
    )


def _run(
    run_id: str, cluster: str, status: str, started: float, ended: float | None, beat: float | None
) -> None:
    run = open_storage(open_storage(f"gs://{BUCKET}").run_dir(run_id))
    info: dict[str, object] = {
        "run_id": run_id,
        "cluster": cluster,
        "status": status,
        "started": started,
        "workers": 1,
        "attempt": 1,
        "attempts": [{"attempt": 1, "started": started}],
    }
    if ended is not None:
        info["ended"] = ended
    run.write_text("run.json", json.dumps(info))
    if beat is not None:
        run.write_text("heartbeat/worker-0.json", json.dumps({"step": 5, "status": "running", "time": beat}))


@pytest.fixture
def project(fake_tpu: FakeTpuServer, gcs: GcsEmulator, tmp_path: Path) -> Path:
    """Two zones of leftovers and keepers; returns the cluster file (home zone; the other one comes by
    --zone)."""
    if gcs.client().lookup_bucket(BUCKET) is None:
        gcs.client().create_bucket(BUCKET)
    now = time.time()
    _node(fake_tpu, HOME_ZONE, "spot-gone", OURS, spot=True)  # PREEMPTED: a leak
    # TERMINATED, in the --zone zone: a leak
    _node(fake_tpu, OTHER_ZONE, "old-term", OURS, accelerator="v4-16")
    _node(fake_tpu, HOME_ZONE, "theirs", {"team": "vision"})  # not tpuft's: never touched, even PREEMPTED
    _node(fake_tpu, HOME_ZONE, "idle", OURS)  # READY, last run ended 5 h ago: a leak
    _node(fake_tpu, HOME_ZONE, "busy", OURS)  # READY, its run is live: kept
    _node(fake_tpu, HOME_ZONE, "fresh", OURS)  # READY, made 10 min ago, no run: kept
    _queued(fake_tpu, HOME_ZONE, "qr-failed")
    _queued(fake_tpu, OTHER_ZONE, "qr-ok")  # ACTIVE, used an hour ago: kept
    fake_tpu.settle()
    fake_tpu.preempt("spot-gone")
    fake_tpu.preempt("theirs")
    with fake_tpu._lock:  # the rig has no TERMINATED control: the service's end state for a node it stopped
        fake_tpu._nodes[f"projects/{PROJECT}/locations/{OTHER_ZONE}/nodes/old-term"]["state"] = "TERMINATED"
    fake_tpu.fail_queued("qr-failed", "There is no more capacity in the zone")
    for name in ("spot-gone", "old-term", "theirs", "idle", "busy", "qr-failed", "qr-ok"):
        fake_tpu.backdate(name, 30 * HOURS)
    fake_tpu.backdate("fresh", 600)
    _run("quick-20261120-100000-0001", "idle", "finished", now - 8 * HOURS, now - 5 * HOURS, now - 5 * HOURS)
    _run("quick-20261125-100000-0002", "busy", "running", now - 20 * HOURS, None, now - 30)
    _run("quick-20261125-110000-0003", "qr-ok", "finished", now - 3 * HOURS, now - 1 * HOURS, None)
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        f"name: tp\nprovider: gcp\naccelerator: v4-8\nbucket: gs://{BUCKET}\n"
        f"gcp:\n  project: {PROJECT}\n  zone: {HOME_ZONE}\n  tpu_api_endpoint: {fake_tpu.endpoint}\n"
    )
    return cluster


def test_gc_lists_only_tpuft_leftovers_then_deletes_them(cli, project: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    listed = cli("gc", "-c", str(project), "--zone", OTHER_ZONE, "--json")
    assert listed.code == 0, listed.err
    found = {leak["name"]: leak for leak in json.loads(listed.out)["leaks"]}
    assert set(found) == {"spot-gone", "old-term", "idle", "qr-failed"}  # not theirs, busy, fresh, qr-ok
    assert found["spot-gone"]["state"] == "PREEMPTED" and found["spot-gone"]["pricing"] == "spot"
    assert found["spot-gone"]["price_per_hour"] == pytest.approx(4 * 0.966)
    assert (
        found["spot-gone"]["age_s"] == pytest.approx(30 * HOURS, abs=120)
        and found["spot-gone"]["age_of"] == "created"
    )
    assert found["old-term"]["zone"] == OTHER_ZONE and found["old-term"]["price_per_hour"] == pytest.approx(
        8 * 3.22
    )
    assert found["idle"]["age_of"] == "idle" and found["idle"]["age_s"] == pytest.approx(5 * HOURS, abs=120)
    assert "quick-20261120-100000-0001 ended" in found["idle"]["reason"]
    assert (
        found["qr-failed"]["kind"] == "queued resource" and "no more capacity" in found["qr-failed"]["reason"]
    )
    assert found["qr-failed"]["pricing"] == "spot" and found["qr-failed"]["accelerator"] == "v5litepod-8"
    assert fake_tpu.calls("DeleteNode") == [] and fake_tpu.calls("DeleteQueuedResource") == []

    table = cli("gc", "-c", str(project), "--idle", "6h")  # the idle node is 5 h idle: not yet, at 6 h
    assert table.code == 0 and "spot-gone" in table.out and "pass --yes" in table.out
    assert "READY" not in table.out and "qr-failed" in table.out

    deleted = cli("gc", "-c", str(project), "--zone", OTHER_ZONE, "--yes")
    assert deleted.code == 0, deleted.err
    for kind, name, zone in (
        ("node", "spot-gone", HOME_ZONE),
        ("node", "old-term", OTHER_ZONE),
        ("node", "idle", HOME_ZONE),
        ("queued resource", "qr-failed", HOME_ZONE),
    ):
        assert f"deleted {kind} {name} in {zone}" in deleted.out
    assert (
        fake_tpu.node("spot-gone") is None
        and fake_tpu.node("idle") is None
        and fake_tpu.node("old-term") is None
    )
    assert fake_tpu.queued_resource("qr-failed") is None
    assert [c.query.get("force") for c in fake_tpu.calls("DeleteQueuedResource")] == ["true"]
    for kept in ("theirs", "busy", "fresh", "qr-ok"):
        assert fake_tpu.node(kept) is not None, kept
    assert fake_tpu.node("theirs")["state"] == "PREEMPTED"


def test_api_errors_name_the_call_and_zone(cli, project: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    fake_tpu.deny("ListQueuedResources")
    result = cli("gc", "-c", str(project), "--zone", OTHER_ZONE)
    assert result.code == 1 and "Traceback" not in result.err
    assert (
        f"listing queued resources in project {PROJECT}, zone {HOME_ZONE} failed: permission denied"
        in result.err
    )


def test_bad_input_is_a_usage_error(cli, tmp_path: Path, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    local = cli("gc", "-c", str(cluster_file))
    assert local.code == 2 and "names none" in local.err
    assert cli("gc", "-c", str(cluster_file), "--idle", "soon").code == 2
