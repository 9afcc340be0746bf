"""The SSH fleet's own behaviour against real OpenSSH servers (the shared contract is in
test_fleet_contract.py): retries, refused keys, remote process groups killed on Ctrl-C, nothing in a name or
value read as shell."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive, default_sigint, wait_for_files
from tests.rigs.sshd_pod import SshdPod, sshd_available
from tpuft.core.records import Worker
from tpuft.fleet.ssh import SshConnectError, SshFleet, SshSettings

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs openssh-server (.ci/run installs it)")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with SshdPod(tmp_path_factory.mktemp("sshd-pod"), workers=3) as running:
        yield running


def make_fleet(pod: SshdPod, **overrides: object) -> SshFleet:
    workers = [Worker(index=i, address=a) for i, a in enumerate(pod.addresses)]
    settings = SshSettings(user=pod.user, key_file=pod.client_key, port=pod.port, **overrides)  # type: ignore[arg-type]
    return SshFleet(workers, settings)


def test_unreachable_worker_is_retried_then_named(pod: SshdPod) -> None:
    workers = [Worker(index=0, address=pod.addresses[0]), Worker(index=1, address="127.0.1.250")]
    fleet = SshFleet(
        workers,
        SshSettings(
            user=pod.user,
            key_file=pod.client_key,
            port=pod.port,
            connect_attempts=3,
            retry_delay_s=0.1,
            connect_timeout_s=2,
        ),
    )
    started = time.monotonic()
    with pytest.raises(
        SshConnectError, match=r"worker 1 \(127.0.1.250:\d+\): cannot connect over SSH after 3 attempts"
    ):
        fleet.run(["true"])
    assert time.monotonic() - started >= 0.2  # it did wait between attempts
    fleet.close()


def test_worker_connections_turn_nagle_off(pod: SshdPod) -> None:
    """Without TCP_NODELAY (paramiko's default) the handshake and each command's start wait on the server's
    delayed ACK, 40 ms a time: a cold exec to one worker spent 65-105 ms connecting instead of 20
    (docs/benchmarks.md)."""
    import socket

    fleet = make_fleet(pod)
    try:
        assert fleet.run(["true"], workers=[0]).ok
        sock = fleet.session(fleet.workers[0]).get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        fleet.close()


def test_closing_calls_off_the_connection_tries_under_way(pod: SshdPod) -> None:
    """The recovery watcher closes the fleet when the TPU API says the node is gone: a follower that was
    connecting to the dead workers then must not wait out its 10 tries x 5 s (measured before: the watcher
    acted 45 s late)."""
    import threading

    fleet = SshFleet(
        [Worker(index=0, address="127.0.1.250")],  # nothing listens there: refused at once, retried
        SshSettings(
            user=pod.user,
            key_file=pod.client_key,
            port=pod.port,
            connect_attempts=10,
            retry_delay_s=5.0,
            connect_timeout_s=2,
        ),
    )
    closer = threading.Timer(0.5, fleet.close)
    closer.start()
    started = time.monotonic()
    with pytest.raises(
        SshConnectError, match=r"worker 0 \(127.0.1.250:\d+\): connecting was called off .* after 1 attempt"
    ):
        fleet.run(["true"])
    assert time.monotonic() - started < 3.0
    # a close calls off only what is under way: a fleet closed before it connects tries with its whole budget
    quick = SshFleet(
        fleet.workers,
        SshSettings(
            user=pod.user,
            key_file=pod.client_key,
            port=pod.port,
            connect_attempts=2,
            retry_delay_s=0.3,
            connect_timeout_s=2,
        ),
    )
    quick.close()
    started = time.monotonic()
    with pytest.raises(SshConnectError, match="cannot connect over SSH after 2 attempts"):
        quick.run(["true"])
    assert time.monotonic() - started >= 0.3


def test_wrong_key_is_refused_clearly(pod: SshdPod, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    fleet = SshFleet([Worker(0, pod.addresses[0])], SshSettings(user=pod.user, key_file=other, port=pod.port))
    with pytest.raises(SshConnectError, match="was refused"):
        fleet.run(["true"])


CTRL_C_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tpuft.fleet.ssh import SshFleet, SshSettings
from tpuft.core.records import Worker
addresses = {addresses!r}
fleet = SshFleet([Worker(i, a) for i, a in enumerate(addresses)], SshSettings(user={user!r}, key_file=Path({key!r}), port={port}))
result = fleet.run(["bash", "-c", "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"])
print("interrupted" if result.interrupted else "not interrupted", flush=True)
"""  # noqa: E501 (a script run in another interpreter)


def test_ctrl_c_kills_every_remote_process(pod: SshdPod) -> None:
    for i in range(3):
        for name in ("child.pid", "shell.pid"):
            (pod.home(i) / name).unlink(missing_ok=True)
    script = CTRL_C_SCRIPT.format(
        repo=str(REPO), addresses=pod.addresses, user=pod.user, key=str(pod.client_key), port=pod.port
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    pid_files = [pod.home(i) / name for i in range(3) for name in ("child.pid", "shell.pid")]
    wait_for_files(pid_files)
    pids = [int(p.read_text()) for p in pid_files]
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert "interrupted" in out, err
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if alive(pid)] == []


INJECTIONS = ["X=1 touch {m}; Y", "X; touch {m}", "A B", "", "$(touch {m})", "X\ntouch {m}"]


@pytest.mark.parametrize("name", INJECTIONS, ids=repr)
def test_an_environment_name_never_becomes_shell(pod: SshdPod, tmp_path: Path, name: str) -> None:
    """Names are refused before any command line is built (the cluster file refuses them earlier still);
    values and argv travel quoted, so what a worker gets is the text, not a command."""
    from tpuft.core.errors import UsageError
    from tpuft.fleet.ssh_remote import remote_command

    marker = tmp_path / "owned"
    fleet = make_fleet(pod)
    try:
        with pytest.raises(UsageError, match="is not an environment variable name"):
            fleet.run(["true"], env=lambda w: {name.format(m=marker): "v"})
        with pytest.raises(UsageError):
            remote_command(["true"], {name.format(m=marker): "v"})
        value = f"$(touch {marker}); `touch {marker}`; touch {marker} # '\""
        result = fleet.run(
            ["bash", "-c", 'printf %s "$V" > v.txt', f"; touch {marker}"], env=lambda w: {"V": value}
        )
        assert result.ok and (pod.home(0) / "v.txt").read_text() == value
    finally:
        fleet.close()
    assert not marker.exists()


def test_environment_values_never_reach_a_command_line(pod: SshdPod) -> None:
    """Secrets (an HF token in worker_env) travel on the channel's stdin: while the remote command runs, no
    process on the machine (client, sshd, the pod's ForceCommand wrapper and its ``bash -c
    "$SSH_ORIGINAL_COMMAND"``, the worker's shell, the command) has the value in its argv, by ``ps -eo args``
    or /proc/*/cmdline; the command's environment has it."""
    import secrets
    import threading

    marker = f"tpuft-secret-{secrets.token_hex(8)}"
    fleet = make_fleet(pod)
    seen_in_argv: list[str] = []
    saw_the_command: list[bool] = []
    running = threading.Event()

    def scan() -> None:
        while not running.wait(0.05):
            listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            if marker in listing:
                seen_in_argv.append("ps")
            if "sleep 3; printenv TPUFT_TEST_SECRET" in listing:
                saw_the_command.append(True)  # the scan ran while the remote commands did
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        if marker.encode() in (entry / "cmdline").read_bytes():
                            seen_in_argv.append(entry.name)
                    except OSError:
                        continue

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    lines: list[str] = []
    try:
        result = fleet.run(
            ["bash", "-c", "sleep 3; printenv TPUFT_TEST_SECRET"],
            env=lambda w: {"TPUFT_TEST_SECRET": marker},
            on_line=lambda i, line: lines.append(line),
        )
    finally:
        running.set()
        scanner.join()
        fleet.close()
    assert result.ok and lines.count(marker) == pod.workers
    assert seen_in_argv == [] and saw_the_command
