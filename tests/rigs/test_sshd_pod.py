"""The sshd rig's pod-scale mode (several workers per sshd, told apart by the address reached) and the SSH
fleet at that scale in miniature: every worker its own HOME behind a shared sshd, pinned keys shared per sshd,
and a worker that does not answer named while the others connect and run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.rigs.sshd_pod import SshdPod, sshd_available, worker_address
from tpuft.core.records import Worker
from tpuft.fleet.ssh import SshConnectError, SshFleet, SshSettings

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with SshdPod(
        tmp_path_factory.mktemp("shared-sshd"), workers=8, first_address=140, addresses_per_sshd=4
    ) as running:
        yield running


def pinned(pod: SshdPod, path: Path) -> Path:
    """The pod's host keys as tpuft pins them from the TPU API (one known_hosts line per worker address)."""
    path.write_text("".join(f"[{address}]:{pod.port} {key}\n" for address, key in pod.host_keys.items()))
    return path


def fleet_for(pod: SshdPod, addresses: list[str], known_hosts: Path, **overrides: object) -> SshFleet:
    workers = [Worker(index=i, address=a) for i, a in enumerate(addresses)]
    settings = SshSettings(
        user=pod.user, key_file=pod.client_key, port=pod.port, known_hosts=known_hosts, **overrides
    )  # type: ignore[arg-type]
    return SshFleet(workers, settings)


def test_addresses_go_on_past_one_block() -> None:
    assert [worker_address(i) for i in (0, 239, 240, 241, 489, 490)] == [
        "127.0.1.10",
        "127.0.1.249",
        "127.0.2.2",
        "127.0.2.3",
        "127.0.2.251",
        "127.0.3.2",
    ]
    assert len({worker_address(i) for i in range(1024)}) == 1024


def test_workers_behind_one_sshd_are_separate_hosts(pod: SshdPod, tmp_path: Path) -> None:
    assert pod.sshd_count == 2 and len(pod.processes) == 2
    keys = pod.host_keys
    assert len(set(keys.values())) == 2  # one host key per sshd, shared by its four addresses
    assert keys[pod.addresses[0]] == keys[pod.addresses[3]] != keys[pod.addresses[4]]
    config = (pod.root / "sshd-1.conf").read_text()
    assert config.count("ListenAddress") == 4 and "MaxStartups 40:30:400" in config  # 4 x sshd's default
    lines: list[tuple[int, str]] = []
    fleet = fleet_for(pod, pod.addresses, pinned(pod, tmp_path / "known_hosts"))
    try:
        result = fleet.run(
            ["bash", "-c", 'echo "$HOME"'], on_line=lambda index, line: lines.append((index, line))
        )
    finally:
        fleet.close()
    assert result.ok
    assert sorted(lines) == [(i, str(pod.home(i))) for i in range(8)]


def test_a_worker_that_does_not_answer_is_named_while_the_others_connect(
    pod: SshdPod, tmp_path: Path
) -> None:
    dead = ["127.0.1.250", "127.0.1.251"]  # nothing listens there: every try is refused at once
    addresses = [*pod.addresses[:3], dead[0], *pod.addresses[3:6], dead[1]]
    fleet = fleet_for(
        pod,
        addresses,
        pinned(pod, tmp_path / "known_hosts"),
        connect_attempts=3,
        retry_delay_s=0.3,
        connect_timeout_s=2,
        max_parallel_connects=4,
    )
    started = time.monotonic()
    try:
        with pytest.raises(SshConnectError) as caught:
            fleet.run(["true"])
        elapsed = time.monotonic() - started
        message = caught.value.message
        assert message.startswith("2 of 8 workers cannot be reached over SSH:")
        assert f"worker 3 ({dead[0]}:{pod.port}): cannot connect over SSH after 3 attempts" in message
        assert f"worker 7 ({dead[1]}:{pod.port}): cannot connect over SSH after 3 attempts" in message
        assert elapsed < 10
        # the others did not wait on them: each is connected, and runs a command on its open connection
        result = fleet.run(["true"], workers=[0, 1, 2, 4, 5, 6])
        assert result.ok and len(result.results) == 6
    finally:
        fleet.close()


def test_handshakes_an_sshd_drops_before_its_banner_are_retried_soon(tmp_path: Path) -> None:
    """An sshd that takes 2 handshakes at once (MaxStartups 2:100:2) drops the others before its banner, as a
    pod's sshd does past its limit: the fleet retries those after a fraction of a second, not its 30 s retry
    delay."""
    with SshdPod(
        tmp_path / "pod", workers=8, first_address=150, addresses_per_sshd=8, max_startups="2:100:2"
    ) as pod:
        fleet = fleet_for(
            pod,
            pod.addresses,
            pinned(pod, tmp_path / "known_hosts"),
            connect_attempts=10,
            retry_delay_s=30,
            connect_timeout_s=5,
            max_parallel_connects=8,
        )
        started = time.monotonic()
        try:
            assert fleet.run(["true"]).ok
        finally:
            fleet.close()
        assert time.monotonic() - started < 10


DESCRIPTOR_CHILD = r"""
import resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_NOFILE, (24, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import tpuft.fleet.ssh as ssh
if sys.argv[1] == "unraised":  # the negative control: what a fleet met before it raised the limit itself
    ssh.ensure_descriptors = lambda workers: None
from tpuft.core.records import Worker
spec = sys.argv[2:]
fleet = ssh.SshFleet([Worker(i, a) for i, a in enumerate(spec[0].split(","))],
                     ssh.SshSettings(user=spec[1], key_file=Path(spec[2]), port=int(spec[3]), known_hosts=Path(spec[4]),
                                     connect_attempts=1))
print("ok" if fleet.run(["true"]).ok else "failed")
"""  # noqa: E501 (a script run in another interpreter)


def test_a_fleet_raises_its_own_descriptor_limit_when_the_workers_need_it(tmp_path: Path) -> None:
    """24 workers from a process whose soft limit is 24 open files (a shell's 1,024 against a 1,024-host pod,
    in small): the fleet raises it to the hard limit and connects them all; without that, "Too many open
    files"."""
    import subprocess
    import sys

    with SshdPod(tmp_path / "pod", workers=24, first_address=160, addresses_per_sshd=12) as pod:
        spec = [
            ",".join(pod.addresses),
            pod.user,
            str(pod.client_key),
            str(pod.port),
            str(pinned(pod, tmp_path / "kh")),
        ]
        # getpass would read /etc/passwd: one more file than the limit allows
        env = {
            **os.environ,
            "USER": pod.user,
        }
        runs = {
            mode: subprocess.run(
                [sys.executable, "-c", DESCRIPTOR_CHILD, mode, *spec],
                capture_output=True,
                text=True,
                cwd=Path(__file__).resolve().parents[2],
                env=env,
            )
            for mode in ("raised", "unraised")
        }
    assert runs["raised"].returncode == 0 and runs["raised"].stdout.strip() == "ok", runs["raised"].stderr[
        -2000:
    ]
    assert runs["unraised"].returncode != 0 and "Too many open files" in runs["unraised"].stderr
