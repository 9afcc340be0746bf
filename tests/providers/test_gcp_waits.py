"""The GCP provider's long waits speak (issue 25, "no silent waits"), against the fake TPU v2 API: ``tpuft
exec`` on a node whose workers have not published their host keys says what it waits for and the time left
within seconds (it used to wait up to 300 s in silence), and a queued resource waiting for capacity says its
state, on stderr or through the caller's progress callback, never both."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.core.waiting as waiting_module
import tpuft.providers.gcp.tuning as tuning
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.providers.gcp import GcpProvider

KEY0 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey0published0by0the0guest0agent0000"


@pytest.fixture
def tpu(monkeypatch: pytest.MonkeyPatch, gcs: GcsEmulator) -> Iterator[FakeTpuServer]:
    monkeypatch.setattr(tuning, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(tuning, "RETRY_BASE_S", 0.01)
    for key, value in gcs.env().items():  # `create` makes the bucket: in the emulator
        monkeypatch.setenv(key, value)
    with FakeTpuServer(operation_polls=1) as server:
        yield server


def cluster_file(tmp_path: Path, tpu: FakeTpuServer, extra_gcp: str = "") -> Path:
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        f"name: hk\nprovider: gcp\naccelerator: v4-16\n"
        f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {tpu.endpoint}\n{extra_gcp}"
        f"ssh:\n  user: alice\n  key_file: {tmp_path / 'keys' / 'id'}\n"
    )
    return path


def provider_for(path: Path) -> GcpProvider:
    from tpuft.config import load_cluster

    return GcpProvider(load_cluster(path).value)


def test_exec_waiting_for_unpublished_host_keys_says_so_within_seconds(
    tmp_path: Path, tpu: FakeTpuServer
) -> None:
    """The wait's own default (silent for 2 s): the line must come about 2 s after the first
    GetGuestAttributes, not at the end of the 60 s bound."""
    tpu.omit_unpublished = True
    tpu.host_keys["127.0.1.10"] = KEY0  # worker 1 never publishes
    cluster = cluster_file(tmp_path, tpu)
    provider_for(cluster).create()
    env = {**os.environ, "TPUFT_GCP_HOSTKEY_WAIT_S": "60", "TPUFT_GCP_POLL_SECONDS": "0.2"}
    env.pop("TPUFT_WAIT_SILENT_S", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "exec", "-c", str(cluster), "--", "true"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(
        target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr), daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while not tpu.calls("GetGuestAttributes") and time.monotonic() < deadline:
            time.sleep(0.02)
        asked = time.monotonic()
        assert tpu.calls("GetGuestAttributes"), "exec never asked for the host keys"
        while not lines and time.monotonic() < asked + 15:
            time.sleep(0.05)
        assert lines, "nothing on stderr 15 s into the host-key wait"
        when, line = lines[0]
        assert when - asked < 5, (
            f"the first line came {when - asked:.1f} s after the first GetGuestAttributes"
        )
        assert line.startswith(
            "waiting for the SSH host keys of TPU node hk worker(s) 0-1 (each VM's guest agent "
        ), line
        assert ": 1 of 2 published, missing: worker 1 (" in line and " s left)" in line, line
        assert proc.poll() is None, line  # still waiting: the bound is 60 s
    finally:
        proc.kill()
        proc.wait()


def test_a_queued_resource_waiting_for_capacity_says_its_state(
    tmp_path: Path, tpu: FakeTpuServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(waiting_module, "SILENT_S", 0.1)
    monkeypatch.setattr(tuning, "POLL_SECONDS", 0.1)
    tpu.queued_states = ("ACCEPTED", "WAITING_FOR_RESOURCES", "ACTIVE")
    tpu.queued_gets_per_state = 4
    provider = provider_for(cluster_file(tmp_path, tpu, "  queued: true\n  spot: true\n"))
    provider.create()  # no progress callback: stderr
    err = capsys.readouterr().err
    assert (
        "waiting for Cloud TPU capacity for queued resource hk (ACTIVE once the chips are granted): " in err
    ), err
    assert "(24 h 0 min left)" in err and "\ndone: Cloud TPU capacity for queued resource hk" in err, err
    # goodput's queue_wait: ACCEPTED, WAITING (4 gets each)
    started, waited = provider.nodes.queue_wait or (
        0.0,
        0.0,
    )
    assert 0.5 < waited < 30 and abs(started - time.time()) < 60, provider.nodes.queue_wait

    provider.delete()
    capsys.readouterr()
    told: list[str] = []
    provider.create(told.append)  # the CLI's spinner: through the callback, not on stderr as well
    assert capsys.readouterr().err == ""
    capacity = [text for text in told if "capacity" in text]
    assert [text.split(": ")[1].split(" (")[0] for text in capacity] == [
        "ACCEPTED",
        "WAITING_FOR_RESOURCES",
    ], told
