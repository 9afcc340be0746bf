"""The SSH fleet and the user's ~/.ssh/config (a test file stands in for it), pinned host keys, and a
ProxyJump bastion, against real OpenSSH servers (tests/rigs/sshd_pod.py, tests/rigs/bastion.py)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rigs.bastion import Bastion
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.core.records import Worker
from tpuft.fleet.ssh import SshConnectError, SshFleet, SshSettings

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")

WORKERS = 2


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdPod]:
    with SshdPod(tmp_path_factory.mktemp("ssh-config-pod"), workers=WORKERS) as running:
        yield running


@pytest.fixture(scope="module")
def bastion(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bastion]:
    with Bastion(tmp_path_factory.mktemp("bastion")) as running:
        yield running


def workers_of(pod: SshdPod) -> list[Worker]:
    return [Worker(index=i, address=a) for i, a in enumerate(pod.addresses)]


def lines_of(fleet: SshFleet, argv: list[str]) -> list[str]:
    lines: list[str] = []
    try:
        result = fleet.run(argv, on_line=lambda index, line: lines.append(f"{index}:{line}"))
    finally:
        fleet.close()
    assert result.ok, result
    return sorted(lines)


def pinned(pod: SshdPod, path: Path, keys: dict[int, str] | None = None) -> Path:
    """A known_hosts as the GCP provider writes it: ``[address]:port key`` per worker (``keys`` replaces
    some)."""
    keys = keys or {}
    path.write_text(
        "".join(
            f"[{a}]:{pod.port} {keys.get(i, pod.host_public_key(i))}\n" for i, a in enumerate(pod.addresses)
        )
    )
    return path


def other_public_key(tmp_path: Path) -> str:
    key = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kind, blob = Path(f"{key}.pub").read_text().split()[:2]
    return f"{kind} {blob}"


# -- ~/.ssh/config -----------------------------------------------------------------------------------------
def test_host_block_user_port_and_identity_apply_when_the_cluster_file_is_silent(
    pod: SshdPod, tmp_path: Path
) -> None:
    """Defaults (a user and key that would not work, port 22 where nothing listens) lose to the Host block."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.1.*\n  User {pod.user}\n  Port {pod.port}\n  IdentityFile {pod.client_key}\n"
    )
    settings = SshSettings(
        user="tpuft-nobody",
        key_file=tmp_path / "no-such-key",
        port=22,
        explicit=(),
        ssh_config=config,
        connect_attempts=1,
    )
    lines = lines_of(
        SshFleet(workers_of(pod), settings), ["bash", "-c", 'echo "$(id -un) ${SSH_CONNECTION##* }"']
    )
    assert lines == [f"{i}:{pod.user} {pod.port}" for i in range(WORKERS)]


def test_what_the_cluster_file_sets_wins_over_the_host_block(pod: SshdPod, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host 127.0.1.*\n  User tpuft-nobody\n  Port 1\n  IdentityFile {tmp_path / 'no-such-key'}\n"
    )
    settings = SshSettings(
        user=pod.user, key_file=pod.client_key, port=pod.port, ssh_config=config, connect_attempts=1
    )
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]
    # only the port explicit: the Host block's user and key apply, its port does not
    config.write_text(f"Host 127.0.1.*\n  User {pod.user}\n  Port 1\n  IdentityFile {pod.client_key}\n")
    settings = SshSettings(
        user="tpuft-nobody",
        key_file=tmp_path / "no-such-key",
        port=pod.port,
        explicit=("port",),
        ssh_config=config,
        connect_attempts=1,
    )
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]


def test_no_ssh_config_reads_none(pod: SshdPod, tmp_path: Path) -> None:
    settings = SshSettings(
        user="tpuft-nobody",
        key_file=pod.client_key,
        port=pod.port,
        explicit=("key_file", "port"),
        ssh_config=None,
        connect_attempts=1,
    )
    with pytest.raises(
        SshConnectError, match=r"worker 0 \(tpuft-nobody@127\.0\.1\.10:\d+\): SSH key .* was refused"
    ):
        SshFleet(workers_of(pod)[:1], settings).run(["true"])


# -- pinned host keys --------------------------------------------------------------------------------------
def test_the_pinned_real_keys_connect(pod: SshdPod, tmp_path: Path) -> None:
    settings = SshSettings(
        pod.user, pod.client_key, pod.port, known_hosts=pinned(pod, tmp_path / "known_hosts"), ssh_config=None
    )
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]


def test_another_key_is_refused_at_once_never_retried(pod: SshdPod, tmp_path: Path) -> None:
    impostor = other_public_key(tmp_path)
    known_hosts = pinned(pod, tmp_path / "known_hosts", {1: impostor})
    settings = SshSettings(
        pod.user,
        pod.client_key,
        pod.port,
        known_hosts=known_hosts,
        ssh_config=None,
        connect_attempts=5,
        retry_delay_s=10,
    )
    fleet = SshFleet(workers_of(pod), settings)
    started = time.monotonic()
    with pytest.raises(SshConnectError) as caught:
        fleet.run(["true"])
    fleet.close()
    assert time.monotonic() - started < 5  # one attempt, no 10 s wait for a retry
    error = caught.value
    message = str(error)
    assert f"worker 1 ({pod.addresses[1]}" in message
    assert pod.host_public_key(1).split()[0] in message  # the key type seen
    assert message.count("SHA256:") == 2  # seen vs pinned
    assert str(known_hosts) in message
    assert "tpuft status" in (error.hint or "") and "recreate" in (error.hint or "")


def test_a_worker_without_a_pinned_key_is_refused(pod: SshdPod, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{pod.addresses[0]}]:{pod.port} {pod.host_public_key(0)}\n")
    settings = SshSettings(
        pod.user, pod.client_key, pod.port, known_hosts=known_hosts, ssh_config=None, retry_delay_s=10
    )
    started = time.monotonic()
    with pytest.raises(SshConnectError, match=rf"worker 1 \({pod.addresses[1]}, .*no host key pinned"):
        SshFleet(workers_of(pod), settings).run(["true"])
    assert time.monotonic() - started < 5


# -- ProxyJump ---------------------------------------------------------------------------------------------
def jump_config(tmp_path: Path, bastion: Bastion, known_hosts: Path, extra: str = "") -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jump\n  HostName {bastion.address}\n  Port {bastion.port}\n  User {bastion.user}\n"
        f"  IdentityFile {bastion.client_key}\n  UserKnownHostsFile {known_hosts}\n"
        f"  GlobalKnownHostsFile /dev/null\n{extra}Host 127.0.1.1? 127.0.1.2?\n  ProxyJump jump\n"
    )
    return config


def test_proxyjump_reaches_every_worker_through_one_bastion_connection(
    pod: SshdPod, bastion: Bastion, tmp_path: Path
) -> None:
    """The workers' own keys are still the pinned ones; the bastion's is checked against the user's
    known_hosts (here the Host block's UserKnownHostsFile); its log shows one login and one forwarded channel
    per worker."""
    bastion_known = tmp_path / "bastion_known_hosts"
    bastion_known.write_text(bastion.known_hosts_line())
    settings = SshSettings(
        pod.user,
        pod.client_key,
        pod.port,
        known_hosts=pinned(pod, tmp_path / "known_hosts"),
        ssh_config=jump_config(tmp_path, bastion, bastion_known),
        connect_attempts=1,
    )
    logins, forwarded = bastion.logins(), len(bastion.forwarded())
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]
    deadline = time.monotonic() + 5  # sshd writes its log from the session processes
    while len(bastion.forwarded()) < forwarded + WORKERS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(bastion.forwarded()[forwarded:]) == [(a, pod.port) for a in pod.addresses]
    assert bastion.logins() == logins + 1


def proxycommand_config(bastion: Bastion, tmp_path: Path) -> Path:
    """An ssh_config that reaches the pod's workers through ``ProxyCommand ssh -W %h:%p`` on the bastion."""
    bastion_known = tmp_path / "bastion_known_hosts"
    bastion_known.write_text(bastion.known_hosts_line())
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host 127.0.1.1? 127.0.1.2?\n"
        f"  ProxyCommand ssh -F /dev/null -o BatchMode=yes -o UserKnownHostsFile={bastion_known} "
        f"-i {bastion.client_key} -p {bastion.port} {bastion.user}@{bastion.address} -W %h:%p\n"
    )
    return config


def test_proxycommand_reaches_the_workers_with_their_pinned_keys(
    pod: SshdPod, bastion: Bastion, tmp_path: Path
) -> None:
    """The older way through a bastion, ``ProxyCommand ssh -W %h:%p``: each worker's connection runs over that
    command's stdin/stdout, and the worker's key is still checked against the pins (a wrong pin is
    refused)."""
    config = proxycommand_config(bastion, tmp_path)
    settings = SshSettings(
        pod.user,
        pod.client_key,
        pod.port,
        known_hosts=pinned(pod, tmp_path / "known_hosts"),
        ssh_config=config,
        connect_attempts=1,
    )
    forwarded = len(bastion.forwarded())
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]
    deadline = time.monotonic() + 5
    while len(bastion.forwarded()) < forwarded + WORKERS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(bastion.forwarded()[forwarded:]) == [(a, pod.port) for a in pod.addresses]
    wrong = SshSettings(
        pod.user,
        pod.client_key,
        pod.port,
        ssh_config=config,
        connect_attempts=1,
        known_hosts=pinned(pod, tmp_path / "wrong_known_hosts", {0: other_public_key(tmp_path)}),
    )
    refused = SshFleet(workers_of(pod), wrong)
    with pytest.raises(SshConnectError, match=r"worker 0 .* presented a ssh-ed25519 host key"):
        refused.run(["true"])
    refused.close()


def test_a_proxycommand_that_exits_ends_its_connection(
    pod: SshdPod, bastion: Bastion, tmp_path: Path
) -> None:
    """The bastion goes away (here: the ``ssh -W`` processes die): each connection sees its end, as over a
    socket. paramiko's own ProxyCommand read the ended pipe in a loop, so each transport's thread spun a core
    for good and the connection never counted as dropped (a watcher would not re-attach; CI ran 30% slower
    beside such threads)."""
    config = proxycommand_config(bastion, tmp_path)
    fleet = SshFleet(
        workers_of(pod),
        SshSettings(
            pod.user,
            pod.client_key,
            pod.port,
            connect_attempts=1,
            known_hosts=pinned(pod, tmp_path / "known_hosts"),
            ssh_config=config,
        ),
    )
    try:
        fleet.connect_all(workers_of(pod))
        transports = [client.get_transport() for client in fleet._clients.values()]
        assert len(transports) == WORKERS and all(t.is_active() for t in transports)
        for transport in transports:
            transport.sock.process.kill()  # the command's end, not a close from this side
        for transport in transports:
            transport.join(timeout=10)
            assert not transport.is_alive() and not transport.is_active()
    finally:
        fleet.close()


def test_an_unknown_bastion_is_refused_like_ssh_does(pod: SshdPod, bastion: Bastion, tmp_path: Path) -> None:
    empty = tmp_path / "bastion_known_hosts"
    empty.write_text("")
    settings = SshSettings(
        pod.user, pod.client_key, pod.port, ssh_config=jump_config(tmp_path, bastion, empty), retry_delay_s=10
    )
    forwarded = len(bastion.forwarded())
    started = time.monotonic()
    with pytest.raises(
        SshConnectError, match=r"ProxyJump host 127\.0\.1\.201:\d+ is not in your known_hosts"
    ):
        SshFleet(workers_of(pod), settings).run(["true"])
    assert time.monotonic() - started < 5
    assert len(bastion.forwarded()) == forwarded  # nothing went through it
    # accept-new in its Host block: accepted (and a changed key would still be refused)
    lenient = jump_config(tmp_path, bastion, empty, "  StrictHostKeyChecking accept-new\n")
    settings = SshSettings(pod.user, pod.client_key, pod.port, ssh_config=lenient, connect_attempts=1)
    assert lines_of(SshFleet(workers_of(pod), settings), ["echo", "ok"]) == [
        f"{i}:ok" for i in range(WORKERS)
    ]


def test_a_bastion_with_another_key_is_refused(pod: SshdPod, bastion: Bastion, tmp_path: Path) -> None:
    wrong = tmp_path / "bastion_known_hosts"
    wrong.write_text(f"[{bastion.address}]:{bastion.port} {other_public_key(tmp_path)}\n")
    settings = SshSettings(
        pod.user, pod.client_key, pod.port, ssh_config=jump_config(tmp_path, bastion, wrong), retry_delay_s=10
    )
    with pytest.raises(
        SshConnectError, match=r"ProxyJump host .* presented a ssh-ed25519 host key SHA256:\S+, not the one"
    ):
        SshFleet(workers_of(pod), settings).run(["true"])


def test_tpuft_ssh_gets_the_same_precedence(tmp_path: Path) -> None:
    """`tpuft ssh` is OpenSSH: it reads the same file (-F) and is given -l/-p/-i only where the fleet would
    use them."""
    from tpuft.fleet.ssh_config import openssh_options

    config = tmp_path / "ssh_config"
    config.write_text("Host 10.0.0.*\n  User alice\n  Port 2222\n  IdentityFile ~/.ssh/alice\n")
    defaults = SshSettings(user="me", key_file=Path("/keys/gce"), port=22, explicit=(), ssh_config=config)
    assert openssh_options(defaults, "10.0.0.5") == ["-F", str(config)]
    assert openssh_options(defaults, "10.9.0.5") == [
        "-F",
        str(config),
        "-l",
        "me",
        "-p",
        "22",
        "-i",
        "/keys/gce",
    ]
    explicit = SshSettings(
        user="me", key_file=Path("/keys/gce"), port=22, explicit=("user",), ssh_config=config
    )
    assert openssh_options(explicit, "10.0.0.5") == ["-F", str(config), "-l", "me"]
    none = SshSettings(user="me", key_file=Path("/keys/gce"), port=22, explicit=(), ssh_config=None)
    assert openssh_options(none, "10.0.0.5") == ["-F", "/dev/null", "-l", "me", "-p", "22", "-i", "/keys/gce"]
