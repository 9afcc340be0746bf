"""Pinning the workers' SSH host keys from the Cloud TPU API (guest attributes), against the fake TPU v2 API
with the real google-cloud-tpu client and real sshd servers with one host key per worker. Nothing here reaches
Google.

What is checked: ``prepare`` pins every worker's published key for the address and port the fleet uses; an
unchanged node costs no further API call; a recreated node (new ``id``, same or new addresses) is re-pinned
from the API; keys that never appear are refused with a clear error; and a worker whose key is not the pinned
one is refused by ``tpuft exec`` before anything runs on it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tpuft.providers.gcp.tuning as gcp_module
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.providers.gcp import GcpError, GcpProvider

needs_sshd = pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")
KEY0 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey0published0by0the0guest0agent0000"
KEY1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey1published0by0the0guest0agent0000"


@pytest.fixture
def tpu(monkeypatch: pytest.MonkeyPatch, gcs: GcsEmulator) -> Iterator[FakeTpuServer]:
    monkeypatch.setattr(gcp_module, "POLL_SECONDS", 0.01)
    monkeypatch.setattr(gcp_module, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr(gcp_module, "HOSTKEY_WAIT_S", 0.5)
    for key, value in gcs.env().items():  # `create` makes the bucket: in the emulator
        monkeypatch.setenv(key, value)
    with FakeTpuServer(operation_polls=1) as server:
        yield server


def cluster_file(
    tmp_path: Path,
    tpu: FakeTpuServer,
    pod: SshdPod | None = None,
    *,
    extra_gcp: str = "",
    accelerator: str = "v4-16",
) -> Path:
    ssh = ""
    if pod is not None:
        ssh = (
            f"ssh:\n  user: {pod.user}\n  key_file: {pod.client_key}\n  port: {pod.port}\n"
            "  connect_attempts: 1\n  retry_delay_s: 0\n"
        )
    else:
        ssh = f"ssh:\n  user: alice\n  key_file: {tmp_path / 'keys' / 'id'}\n"
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        f"name: hk\nprovider: gcp\naccelerator: {accelerator}\n"
        "gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: "
        f"{tpu.endpoint}\n{extra_gcp}{ssh}"
    )
    return path


def provider_for(path: Path) -> GcpProvider:
    from tpuft.config import load_cluster

    return GcpProvider(load_cluster(path).value)


def pinned(provider: GcpProvider) -> list[str]:
    return [line for line in provider.known_hosts_path.read_text().splitlines() if not line.startswith("#")]


def recreate_out_of_band(provider: GcpProvider) -> None:
    """Delete and create the node behind tpuft's back (another machine, the console): the local memory still
    holds the old node's pins, and only the API can tell that the node is a new one."""
    from google.api_core.future.polling import DEFAULT_POLLING

    fast = DEFAULT_POLLING.with_delay(initial=0.01, maximum=0.05).with_timeout(10)
    client = provider.client()
    client.delete_node(name=provider.node_path("hk")).result(polling=fast)
    client.create_node(parent=provider.parent, node_id="hk", node=provider.node_spec()).result(polling=fast)


@needs_sshd
def test_prepare_pins_every_worker_once_per_node_and_again_after_recreation(
    tmp_path: Path, tpu: FakeTpuServer
) -> None:
    with (
        SshdPod(tmp_path / "pod", workers=2, first_address=70) as pod,
        SshdPod(tmp_path / "pod-b", workers=2, first_address=80, port=pod.port) as other,
    ):
        tpu.worker_addresses = pod.addresses
        tpu.host_keys.update(pod.host_keys)
        tpu.host_keys.update(other.host_keys)
        provider = provider_for(cluster_file(tmp_path, tpu, pod))
        assert provider.ssh_settings().known_hosts == provider.known_hosts_path
        cluster, _ = provider.create()
        provider.prepare(cluster)
        assert pinned(provider) == [
            f"[{a}]:{pod.port} {pod.host_public_key(i)}" for i, a in enumerate(pod.addresses)
        ]
        (call,) = tpu.calls("GetGuestAttributes")
        assert call.path.endswith("/nodes/hk:getGuestAttributes")
        assert call.body == {"queryPath": "hostkeys/", "workerIds": ["0", "1"]}
        fleet = provider.fleet(cluster)  # the pins match what every worker presents
        try:
            assert fleet.run(["true"]).ok
        finally:
            fleet.close()

        warm = provider_for(cluster_file(tmp_path, tpu, pod))  # a later command: a new process, the same node
        warm.prepare(warm.cached() or warm.get())
        warm.prepare(warm.get())  # `tpuft status` and every get() refresh the memory: still the same node
        assert len(tpu.calls("GetGuestAttributes")) == 1

        old_id = tpu.node("hk")["id"]
        pod.swap_host_key(0)  # the recreated VM boots with new host keys, and its guest agent publishes them
        tpu.host_keys.update(pod.host_keys)
        recreate_out_of_band(provider)
        assert tpu.node("hk")["id"] != old_id
        fresh = provider.get()
        assert [w.address for w in fresh.workers] == pod.addresses  # same addresses: only the id tells
        provider.prepare(fresh)
        assert len(tpu.calls("GetGuestAttributes")) == 2
        assert pinned(provider)[0] == f"[{pod.addresses[0]}]:{pod.port} {pod.host_public_key(0)}"

        assert provider.delete() and not provider.known_hosts_path.exists()
        tpu.worker_addresses = other.addresses  # recreated elsewhere
        cluster, _ = provider.create()
        provider.prepare(cluster)
        assert len(tpu.calls("GetGuestAttributes")) == 3
        assert pinned(provider) == [
            f"[{a}]:{pod.port} {other.host_public_key(i)}" for i, a in enumerate(other.addresses)
        ]
        assert not any(a in line for a in pod.addresses for line in pinned(provider))


def test_keys_published_late_are_waited_for_and_matched_by_worker(
    tmp_path: Path, tpu: FakeTpuServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 0 publishes late, and the API leaves it out of the answer meanwhile: worker 1's key must not be
    taken for worker 0's (the answer names no workers), and the wait ends as soon as both are there."""
    monkeypatch.setattr(gcp_module, "HOSTKEY_WAIT_S", 10.0)
    tpu.omit_unpublished = True
    tpu.host_keys["127.0.1.11"] = KEY1
    provider = provider_for(cluster_file(tmp_path, tpu))
    cluster, _ = provider.create()
    timer = threading.Timer(0.3, lambda: tpu.host_keys.__setitem__("127.0.1.10", KEY0))
    timer.start()
    try:
        assert provider.fetch_host_keys(cluster) == [[KEY0], [KEY1]]
    finally:
        timer.cancel()
    asked = [c.body.get("workerIds") for c in tpu.calls("GetGuestAttributes")]
    assert asked[:3] == [["0", "1"], ["0"], ["1"]] and asked[-1] == ["0"] and len(asked) > 4
    provider.prepare(cluster)
    assert pinned(provider) == [f"127.0.1.10 {KEY0}", f"127.0.1.11 {KEY1}"]  # port 22: plain addresses


def test_keys_that_never_appear_are_refused_naming_node_and_worker(
    tmp_path: Path, tpu: FakeTpuServer
) -> None:
    tpu.host_keys["127.0.1.10"] = KEY0 + "\nssh-rsa not*base64"  # garbage is dropped, never written
    provider = provider_for(cluster_file(tmp_path, tpu))
    cluster, _ = provider.create()
    with pytest.raises(GcpError) as refused:
        provider.prepare(cluster)
    message = str(refused.value)
    assert "worker 1 (127.0.1.11) of TPU node hk has not published its SSH host keys" in message
    assert "retry" in (refused.value.hint or "") and "tpuft delete --yes && tpuft create" in (
        refused.value.hint or ""
    )
    assert not provider.known_hosts_path.exists() and len(tpu.calls("GetGuestAttributes")) >= 2

    tpu.host_keys["127.0.1.11"] = KEY1
    provider.prepare(cluster)
    assert [line.split(" ", 1)[1] for line in pinned(provider)] == [KEY0, KEY1]


def test_multislice_workers_are_pinned_slice_by_slice_in_order(tmp_path: Path, tpu: FakeTpuServer) -> None:
    extra = "  queued: true\n  spot: true\n  slices: 2\n"
    provider = provider_for(cluster_file(tmp_path, tpu, extra_gcp=extra))
    addresses = [f"127.0.1.{10 + i}" for i in range(4)]
    keys = {a: f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIslice{i}worker" for i, a in enumerate(addresses)}
    tpu.host_keys.update(keys)
    cluster, _ = provider.create()
    assert [w.address for w in cluster.workers] == addresses  # 2 slices x 2 hosts
    provider.prepare(cluster)
    assert pinned(provider) == [f"{a} {keys[a]}" for a in addresses]
    calls: list[Any] = tpu.calls("GetGuestAttributes")
    assert [c.path.rsplit("/", 1)[1] for c in calls] == ["hk-0:getGuestAttributes", "hk-1:getGuestAttributes"]
    provider.prepare(provider.get())
    assert len(tpu.calls("GetGuestAttributes")) == 2

    # Each worker knows its slice, the remembered cluster too; each slice's node and state is in the details.
    assert [w.slice for w in cluster.workers] == [0, 0, 1, 1] and cluster.layout.name(
        3
    ) == "slice 1 host 1 (worker 3)"
    cached = provider.cached()
    assert cached is not None and cached.workers == cluster.workers
    assert {k: v for k, v in cluster.details.items() if k.startswith("slice")} == {
        "slice 0": "hk-0 READY",
        "slice 1": "hk-1 READY",
    }
    tpu.preempt("hk-1")  # one slice lost: the cluster is not READY, and says which slice
    lost = provider.get()
    assert lost.state == "READY,PREEMPTED" and lost.details["slice 1"] == "hk-1 PREEMPTED"
    assert lost.details["queued_resource"] == "SUSPENDING" and [w.slice for w in lost.workers] == [0, 0, 1, 1]
    tpu.suspend_queued("hk")
    gone = provider.get()
    assert gone.details["slice 0"] == "hk-0 NOT_FOUND" and gone.state == "SUSPENDED"
    assert provider.delete() and tpu.queued_resource("hk") is None


@needs_sshd
def test_exec_refuses_a_worker_whose_host_key_is_not_the_pinned_one(
    cli, tmp_path: Path, tpu: FakeTpuServer
) -> None:  # type: ignore[no-untyped-def]
    """Needs the SSH fleet to honour ``SshSettings.known_hosts`` (paramiko's RejectPolicy,
    tpuft/fleet/ssh.py)."""
    with SshdPod(tmp_path / "pod", workers=2, first_address=90) as pod:
        tpu.worker_addresses = pod.addresses
        tpu.host_keys.update(pod.host_keys)
        cluster = cluster_file(tmp_path, tpu, pod)
        assert cli("create", "-c", str(cluster), "--yes").code == 0
        assert cli("exec", "-c", str(cluster), "--", "true").code == 0
        pod.swap_host_key(1)  # a man in the middle, or a host that changed behind the API's back

        result = cli("exec", "-c", str(cluster), "--", "touch ran-$TPUFT_WORKER_ID")
        assert result.code != 0
        assert "worker 1" in result.err and pod.addresses[1] in result.err, result.err
        assert not (pod.home(1) / "ran-1").exists()

        tpu.host_keys[pod.addresses[1]] = pod.host_public_key(1)  # the API now vouches for the new key ...
        provider_for(cluster).known_hosts_path.unlink()  # ... and the README's remedy: re-pin from the API
        retried = cli("exec", "-c", str(cluster), "--", "touch ran-$TPUFT_WORKER_ID")
        assert retried.code == 0, retried.err
        assert (pod.home(1) / "ran-1").exists()
