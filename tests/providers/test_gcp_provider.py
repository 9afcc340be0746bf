"""provider: gcp through the CLI, against the fake TPU v2 API (tests/rigs/fake_tpu.py) with the real
google-cloud-tpu client, and against the sshd pod for reaching the workers. Nothing here reaches Google."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.providers.gcp.tuning as gcp_module
from tests.rigs.fake_tpu import FakeTpuServer, not_now
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available


@pytest.fixture
def fake_tpu(monkeypatch: pytest.MonkeyPatch, gcs: GcsEmulator) -> Iterator[FakeTpuServer]:
    monkeypatch.setattr(gcp_module, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(gcp_module, "RETRY_BASE_S", 0.01)
    # a test that forgot to publish host keys fails fast
    monkeypatch.setattr(gcp_module, "HOSTKEY_WAIT_S", 1.0)
    for key, value in gcs.env().items():  # `create` makes the bucket: in the emulator
        monkeypatch.setenv(key, value)
    with FakeTpuServer(operation_polls=2) as server:
        yield server


def cluster_yaml(
    tmp_path: Path, server: FakeTpuServer, *, extra_gcp: str = "", accelerator: str = "v4-16", ssh: str = ""
) -> Path:
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        f"name: tp\nprovider: gcp\naccelerator: {accelerator}\n"
        "gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  "
        f"tpu_api_endpoint: {server.endpoint}\n{extra_gcp}{ssh}"
    )
    return path


def test_create_is_costed_confirmed_idempotent_and_deletable(
    cli, tmp_path: Path, fake_tpu: FakeTpuServer
) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_tpu, extra_gcp="  spot: true\n  labels: {team: nlp}\n")
    refused = cli("create", "-c", str(cluster))
    assert refused.code == 2 and "costs money: pass --yes" in refused.err
    assert "8 chips: about $25.76 per hour" in refused.out and fake_tpu.calls("CreateNode") == []

    made = cli("create", "-c", str(cluster), "--yes", "--json")
    assert made.code == 0, made.err
    info = json.loads(made.out)
    assert info["created"] is True and info["state"] == "READY"
    assert (
        info["bucket"] == "gs://tpuft-test-tpuft"
        and info["details"]["bucket"] == "gs://tpuft-test-tpuft (created)"
    )
    assert [w["address"] for w in info["workers"]] == ["127.0.1.10", "127.0.1.11"]
    node = fake_tpu.node("tp")
    assert node["acceleratorType"] == "v4-16" and node["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert node["schedulingConfig"].get("spot") is True and node["labels"] == {
        "created-by": "tpuft",
        "team": "nlp",
    }

    again = cli("create", "-c", str(cluster), "--json")  # no --yes needed: nothing new is billed
    assert again.code == 0 and json.loads(again.out)["created"] is False
    assert len(fake_tpu.calls("CreateNode")) == 1

    shown = cli("status", "-c", str(cluster))
    assert shown.code == 0 and "READY" in shown.out and "127.0.1.11" in shown.out

    gone = cli("delete", "-c", str(cluster), "--yes")
    assert gone.code == 0 and fake_tpu.node("tp") is None
    assert json.loads(cli("status", "-c", str(cluster), "--json").out)["state"] == "NOT_FOUND"


def test_other_shape_and_preempted_nodes_say_what_to_do(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    assert cli("create", "-c", str(cluster_yaml(tmp_path, fake_tpu)), "--yes").code == 0
    bigger = cluster_yaml(tmp_path, fake_tpu, accelerator="v4-32")
    result = cli("create", "-c", str(bigger), "--yes")
    assert (
        result.code == 2 and "exists in us-central2-b as v4-16, the cluster file asks for v4-32" in result.err
    )
    assert "tpuft delete" in result.err

    fake_tpu.preempt("tp")
    same = cluster_yaml(tmp_path, fake_tpu)
    result = cli("create", "-c", str(same), "--yes")
    assert (
        result.code == 2
        and "exists but is PREEMPTED" in result.err
        and "delete --yes && tpuft create" in result.err
    )
    assert json.loads(cli("status", "-c", str(same), "--json").out)["state"] == "PREEMPTED"


def test_api_errors_are_one_clear_line(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_tpu)
    fake_tpu.fail_next_create("RESOURCE_EXHAUSTED", "Quota 'TPUV4sPodPerProjectPerZone' exhausted")
    result = cli("create", "-c", str(cluster), "--yes")
    assert result.code == 1 and "Traceback" not in result.err
    assert "creating TPU node tp in project tpuft-test, zone us-central2-b failed" in result.err
    assert "the quota TPUV4sPodPerProjectPerZone of project tpuft-test" in result.err  # the text's own name
    assert "iam-admin/quotas?project=tpuft-test" in result.err
    assert "try another zone, spot, or gcp.queued: true" in result.err

    fake_tpu.deny("CreateNode")
    result = cli("create", "-c", str(cluster), "--yes")
    assert result.code == 1 and "roles/tpu.admin" in result.err


def test_transient_errors_are_retried(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_tpu)
    fake_tpu.transient_errors(3)
    result = cli("create", "-c", str(cluster), "--yes", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["state"] == "READY"


def test_rate_limited_calls_back_off_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 429 doubles the pause, each pause drawn from half to all of its step, so callers refused
    together do not come back together. (time.sleep is recorded, not slept: the pauses are the subject.)"""
    from google.api_core import exceptions as gexc

    import tpuft.providers.gcp.api as api_module
    from tpuft.providers.gcp.api import TpuApi

    monkeypatch.setattr(gcp_module, "RETRY_BASE_S", 1.0)
    pauses: list[float] = []
    monkeypatch.setattr(api_module.time, "sleep", pauses.append)
    runs: list[list[float]] = []
    for _ in range(2):
        refusals = iter([gexc.TooManyRequests("Quota exceeded for quota metric 'requests' per minute")] * 4)

        def create(refusals: Iterator[Exception] = refusals) -> str:
            error = next(refusals, None)
            if error is not None:
                raise error
            return "created"

        pauses.clear()
        api = TpuApi("p", "us-central2-b", "tp", 1, "http://127.0.0.1:9", timeout=300)
        assert api.call("creating TPU node", create) == "created"
        runs.append(list(pauses))
    for run in runs:
        assert len(run) == 4 and all(2**i * 0.5 <= pause <= 2**i for i, pause in enumerate(run)), run
    assert runs[0] != runs[1]


def test_queued_multislice_spot_and_forced_delete(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    extra = "  queued: true\n  spot: true\n  slices: 2\n  valid_until: 6h\n"
    cluster = cluster_yaml(tmp_path, fake_tpu, extra_gcp=extra, accelerator="v4-8")
    result = cli("create", "-c", str(cluster), "--yes", "--json")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    assert info["state"] == "READY" and len(info["workers"]) == 2  # 2 slices x 1 host
    assert info["details"]["queued_resource"] == "ACTIVE"
    assert fake_tpu.node("tp-0") is not None and fake_tpu.node("tp-1") is not None
    body = fake_tpu.calls("CreateQueuedResource")[0].body
    assert "spot" in body and body["queueingPolicy"]["validUntilDuration"] == "21600s"
    assert body["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "tp"}
    # each slice, its node and its workers
    status = json.loads(cli("status", "-c", str(cluster), "--json").out)
    assert [(s["node"], s["state"], s["workers"]) for s in status["slices"]] == [
        ("tp-0", "READY", ["0:0"]),
        ("tp-1", "READY", ["1:0"]),
    ]
    assert "slice 1: node tp-1 READY, workers 1:0" in cli("status", "-c", str(cluster)).out

    assert cli("delete", "-c", str(cluster), "--yes").code == 0
    assert fake_tpu.calls("DeleteQueuedResource")[0].query.get("force") == "true"
    assert fake_tpu.queued_resource("tp") is None and fake_tpu.node("tp-0") is None


def test_a_delete_waits_out_suspending_asks_again_when_refused_and_reads_back_until_gone(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, fake_tpu: FakeTpuServer
) -> None:
    """A queued resource left behind holds quota (and may be fulfilled hours later): the delete of a spot
    multislice request whose slice was just reclaimed waits for SUSPENDING to end rather than deleting it
    mid-transition, asks again after a 409, and issues the delete again when the read-back finds it still
    there."""
    extra = "  queued: true\n  spot: true\n  slices: 2\n"
    cluster = cluster_yaml(tmp_path, fake_tpu, extra_gcp=extra, accelerator="v4-8")
    assert cli("create", "-c", str(cluster), "--yes").code == 0
    fake_tpu.preempt("tp-1")  # the whole request turns SUSPENDING
    fake_tpu.suspending_gets = 3
    fake_tpu.refuse_next("DeleteQueuedResource", not_now("tp"))
    fake_tpu.deletes_do_not_take(1)
    deleted = cli("delete", "-c", str(cluster), "--yes")
    assert deleted.code == 0, deleted.err
    assert fake_tpu.queued_resource("tp") is None and fake_tpu.node("tp-0") is None
    # none while SUSPENDING (the rig refuses those with 400): the 409, the one that did not take, the real one
    assert [c.status for c in fake_tpu.calls("DeleteQueuedResource")] == [409, 200, 200]
    states = [c for c in fake_tpu.requests if c.rpc in ("GetQueuedResource", "DeleteQueuedResource")]
    assert states[0].rpc == "GetQueuedResource" and len(states) >= 3 + 3  # 3 reads of SUSPENDING first


def test_a_delete_that_never_takes_fails_naming_the_resource(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, fake_tpu: FakeTpuServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gcp_module, "DELETE_TRIES", 2)
    cluster = cluster_yaml(tmp_path, fake_tpu)
    assert cli("create", "-c", str(cluster), "--yes").code == 0
    fake_tpu.deletes_do_not_take(1)
    assert cli("delete", "-c", str(cluster), "--yes").code == 0  # read back, issued again
    assert [c.status for c in fake_tpu.calls("DeleteNode")] == [200, 200] and fake_tpu.node("tp") is None

    assert cli("create", "-c", str(cluster), "--yes").code == 0
    fake_tpu.deletes_do_not_take(5)
    stuck = cli("delete", "-c", str(cluster), "--yes")
    assert stuck.code == 1 and len(fake_tpu.calls("DeleteNode")) == 2 + 2
    assert (
        "TPU node tp is still READY after 2 delete calls in project tpuft-test, zone us-central2-b"
        in stuck.err
    )
    assert "holding quota" in stuck.err and "Traceback" not in stuck.err


def test_failed_queued_resource_shows_why(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_yaml(tmp_path, fake_tpu, extra_gcp="  queued: true\n", accelerator="v4-8")
    fake_tpu.fail_queued(None, "no v4 capacity in us-central2-b")
    result = cli("create", "-c", str(cluster), "--yes")
    assert result.code == 1
    assert "queued resource tp is FAILED: no v4 capacity in us-central2-b" in result.err
    assert "Delete it" in result.err


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_exec_reaches_every_worker_over_ssh_and_publishes_the_key(
    cli, tmp_path: Path, fake_tpu: FakeTpuServer
) -> None:  # type: ignore[no-untyped-def]
    with SshdPod(tmp_path / "pod", workers=2) as pod:
        fake_tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish
        ssh = (
            f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n  "
            "connect_attempts: 2\n  retry_delay_s: 0.1\n"
        )
        cluster = cluster_yaml(tmp_path, fake_tpu, ssh=ssh)
        assert cli("create", "-c", str(cluster), "--yes").code == 0
        result = cli(
            "exec", "-c", str(cluster), "--", "echo id=$TPUFT_WORKER_ID of $TPUFT_NUM_WORKERS home=$HOME"
        )
        assert result.code == 0, result.err
        assert f"[w0] id=0 of 2 home={pod.home(0)}" in result.out
        assert f"[w1] id=1 of 2 home={pod.home(1)}" in result.out
        public = Path(f"{pod.client_key}.pub").read_text().strip()
        assert f"{pod.user}:{public}" in fake_tpu.node("tp")["metadata"]["ssh-keys"]
        assert fake_tpu.calls("UpdateNode")[0].query.get("updateMask") == "metadata"
        assert cli("exec", "-c", str(cluster), "--worker", "1", "--", "true").code == 0
        assert len(fake_tpu.calls("UpdateNode")) == 1  # the key is there now: no second update
        failing = cli(
            "exec",
            "-c",
            str(cluster),
            "--",
            'if [ "$TPUFT_WORKER_ID" = 1 ]; then echo broken; exit 3; fi; sleep 30',
        )
        assert (
            failing.code == 3
            and "failed on worker 1 (exit code 3)" in failing.err
            and "broken" in failing.err
        )


def test_bucket_in_another_region_is_warned_about(
    cli, tmp_path: Path, fake_tpu: FakeTpuServer, gcs: GcsEmulator
) -> None:  # type: ignore[no-untyped-def]
    from tpuft.storage import open_storage

    open_storage("gs://far-away", project="tpuft-test").ensure_bucket("us-east1")
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(cluster_yaml(tmp_path, fake_tpu).read_text() + "bucket: gs://far-away\n")
    result = cli("create", "-c", str(cluster), "--yes")
    assert result.code == 0, result.err
    assert (
        "warning:" in result.out and "us-east1" in result.out.lower() and "us-central2" in result.out.lower()
    )


def test_missing_key_is_created_like_gcloud(tmp_path: Path, fake_tpu: FakeTpuServer) -> None:
    from tpuft.config import load_cluster
    from tpuft.providers import get_provider

    key = tmp_path / "keys" / "google_compute_engine"
    ssh = f"ssh:\n  user: alice\n  key_file: {key}\n"
    config = load_cluster(cluster_yaml(tmp_path, fake_tpu, ssh=ssh)).value
    fake_tpu.host_keys.update(
        dict.fromkeys(["127.0.1.10", "127.0.1.11"], "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHost")
    )
    provider = get_provider(config)
    cluster, _ = provider.create()
    provider.fleet(cluster)
    assert not key.exists()  # building a fleet changes nothing; preparing the cluster for access does
    provider.prepare(cluster)
    assert key.exists() and Path(f"{key}.pub").read_text().startswith("ssh-rsa ")
    assert "alice:ssh-rsa " in fake_tpu.node("tp")["metadata"]["ssh-keys"]


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_ssh_to_one_worker(tmp_path: Path, fake_tpu: FakeTpuServer) -> None:
    import os
    import subprocess
    import sys

    with SshdPod(tmp_path / "pod", workers=2) as pod:
        fake_tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish
        ssh = f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
        cluster = cluster_yaml(tmp_path, fake_tpu, ssh=ssh)
        env = {**os.environ, "TPUFT_GCP_POLL_SECONDS": "0.01"}  # STORAGE_EMULATOR_HOST comes from the fixture
        subprocess.run(
            [sys.executable, "-m", "tpuft", "create", "-c", str(cluster), "--yes"],
            check=True,
            env=env,
            capture_output=True,
        )
        shell = subprocess.run(
            [sys.executable, "-m", "tpuft", "ssh", "--worker", "1", "-c", str(cluster)],
            input="echo home=$HOME\n",
            text=True,
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert shell.returncode == 0, shell.stderr
        assert f"home={pod.home(1)}" in shell.stdout


@pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
def test_exec_uses_the_remembered_cluster_and_recovers_when_it_is_stale(
    cli, tmp_path: Path, fake_tpu: FakeTpuServer
) -> None:  # type: ignore[no-untyped-def]
    from tpuft.config import load_cluster
    from tpuft.providers.gcp import GcpProvider

    with SshdPod(tmp_path / "pod", workers=2) as pod:
        fake_tpu.host_keys.update(pod.host_keys)  # what the VMs' guest agents publish
        ssh = (
            f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n  "
            "connect_attempts: 1\n  retry_delay_s: 0\n"
        )
        cluster = cluster_yaml(tmp_path, fake_tpu, ssh=ssh)
        assert cli("exec", "-c", str(cluster), "--", "true").code == 2  # no cluster yet
        assert cli("create", "-c", str(cluster), "--yes").code == 0
        assert cli("exec", "-c", str(cluster), "--", "true").code == 0  # publishes the key
        before = len(fake_tpu.requests)
        assert cli("exec", "-c", str(cluster), "--", "true").code == 0
        assert len(fake_tpu.requests) == before  # answered from memory: no API round trip

        provider = GcpProvider(load_cluster(cluster).value)
        record = json.loads(provider._cache_path.read_text())
        record["workers"][1][1] = "127.0.1.250"  # as if the node had been recreated elsewhere
        provider._cache_path.write_text(json.dumps(record))
        result = cli("exec", "-c", str(cluster), "--", "echo id=$TPUFT_WORKER_ID")
        assert result.code == 0, result.err
        assert "[w1] id=1" in result.out and len(fake_tpu.requests) > before
