"""A pod of real OpenSSH servers on loopback, one per worker, for testing the SSH fleet without a cloud.

Worker i listens on 127.0.1.(10+i) (Linux routes all of 127.0.0.0/8 to loopback; past 127.0.1.249 the
addresses go on in 127.0.2.x, 127.0.3.x, ...). Each sshd runs with a private config whose ``ForceCommand``
goes through a wrapper that gives the worker its own HOME (so workers look like separate hosts that share this
machine's Python and disk) and then runs the client's command with bash. Keys are made fresh per pod: one
ed25519 host key per sshd (so pinning one host's key is tested against the others'), one client key (ed25519)
that is the only authorized key.

By default there is one sshd per worker, as the tests want (one host key each). A pod of hundreds of workers
(the fan-out benchmark's 1,024) runs ``addresses_per_sshd`` workers per sshd instead: one sshd listens on up
to 16 addresses (OpenSSH's compile-time MAX_LISTEN_SOCKS; a 17th ListenAddress is refused), its wrapper tells
them apart by the server address in ``$SSH_CONNECTION`` to give each its own HOME, and they share that sshd's
host key (fine for a benchmark: the API publishes it for each of them). A TPU VM runs one sshd per host with
the default ``MaxStartups 10:30:100`` (at most 10 unauthenticated connections before it starts dropping some),
so such an sshd gets that default times its addresses: per address the limit a real host would have, not an
unlimited one. ``host_keys`` is what the fake TPU API publishes as the workers' guest attributes
(``tpu.host_keys.update(pod.host_keys)``); ``swap_host_key(i)`` gives worker i a new key, as a re-imaged host
or a man in the middle would, and restarts its sshd on the same address and port.

Needs ``openssh-server`` (``.ci/run`` installs it) and root, or at least the right to bind the port.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def sshd_available() -> bool:
    return Path(SSHD).exists() and shutil.which("ssh-keygen") is not None


MAX_LISTEN_ADDRESSES = 16
"""ListenAddress lines one OpenSSH sshd takes (MAX_LISTEN_SOCKS in sshd.c; 9.2 here)."""


def worker_address(index: int, first: int = 10) -> str:
    """127.0.1.(first + index) up to .249, then 250 addresses per /24: 127.0.2.2..251, 127.0.3.2..251, ..."""
    number = first + index
    if number < 250:
        return f"127.0.1.{number}"
    return f"127.0.{1 + number // 250}.{2 + number % 250}"


def _free_port(addresses: list[str]) -> int:
    """A port that is free on every address (the pod shares one port like real hosts share 22)."""
    from tpuft.core.ports import free_port, port_is_free

    for _ in range(50):
        port = free_port(addresses[0])
        if all(port_is_free(address, port) for address in addresses[1:]):
            return port
    raise RuntimeError("no port free on every worker address")


WRAPPER = """#!/bin/bash
# ForceCommand wrapper: this worker's private HOME, then the client's command (or a login shell).
{home}
mkdir -p "$HOME" && cd "$HOME" || exit 1
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec bash -l; fi
exec bash -c "$SSH_ORIGINAL_COMMAND"
"""

CONFIG = """{listen}HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
ForceCommand {wrapper}
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
{limits}ClientAliveInterval 30
LogLevel ERROR
"""

TEST_LIMITS = "MaxStartups 1000:30:1000\nMaxSessions 1000\n"
"""One sshd per worker (the tests): limits that never get in a test's way."""


@dataclass
class SshdPod:
    """N sshd processes; ``start()`` waits until every one accepts connections, ``stop()`` kills them all."""

    root: Path
    workers: int
    port: int = 0
    first_address: int = 10
    """Worker i listens on 127.0.1.(first_address + i): a second pod on other addresses plays a recreated
    node."""
    user: str = field(default_factory=lambda: os.environ.get("USER") or "root")
    stock_login: bool = True
    """True (the default): a session's shell skips the login user's ~/.bashrc (sshd sets SHLVL=1, and bash
    sources ~/.bashrc for sshd only at level 1), as on a stock TPU VM image, whose ~/.bashrc returns at once
    for a non-interactive shell. This machine's root runs pyenv's init there: about 0.1 CPU-second per session
    (the quick ssh tests ran 20% faster without it) and, when two sessions rehash at once, a stray "pyenv:
    cannot rehash" line in a worker's output (a flaky CI failure). False keeps the machine's login as it
    is."""
    addresses_per_sshd: int = 1
    """Workers served by one sshd (1 to 16, see the module's docstring): 1 for the tests, 16 for pods of
    hundreds."""
    max_startups: str | None = None
    """sshd's ``MaxStartups`` for every sshd of the pod (e.g. ``2:100:2``: a third handshake at once is
    dropped before the banner), to test how a fleet copes with a server turning handshakes away; None: as
    described above."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """One listener per sshd (``sshd_count``), in the order of the workers they serve."""

    def __post_init__(self) -> None:
        if not 1 <= self.addresses_per_sshd <= MAX_LISTEN_ADDRESSES:
            raise ValueError(
                f"addresses_per_sshd must be 1..{MAX_LISTEN_ADDRESSES} (OpenSSH's MAX_LISTEN_SOCKS)"
            )

    @property
    def addresses(self) -> list[str]:
        return [worker_address(i, self.first_address) for i in range(self.workers)]

    @property
    def sshd_count(self) -> int:
        return -(-self.workers // self.addresses_per_sshd)

    def served_by(self, sshd: int) -> range:
        """The workers sshd number ``sshd`` listens for."""
        return range(sshd * self.addresses_per_sshd, min(self.workers, (sshd + 1) * self.addresses_per_sshd))

    @property
    def client_key(self) -> Path:
        return self.root / "client_key"

    def home(self, index: int) -> Path:
        return self.root / "homes" / f"worker-{index}"

    def host_key(self, index: int) -> Path:
        """Worker ``index``'s private host key (its ``.pub`` is beside it): its sshd's."""
        return self.root / f"host_key-{index // self.addresses_per_sshd}"

    def host_public_key(self, index: int) -> str:
        """The OpenSSH public key line of worker ``index``'s host key, without the comment: ``ssh-ed25519
        AAAA...``."""
        kind, blob = Path(f"{self.host_key(index)}.pub").read_text().split()[:2]
        return f"{kind} {blob}"

    @property
    def host_keys(self) -> dict[str, str]:
        """Address -> public host key line for every worker: what ``FakeTpuServer.host_keys`` publishes. A
        copy, so a later ``swap_host_key`` does not change what the API says (that is the mismatch to be
        caught)."""
        return {address: self.host_public_key(i) for i, address in enumerate(self.addresses)}

    def start(self, timeout: float = 30.0) -> SshdPod:
        self.root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        for key in (*(self.host_key(self.served_by(n)[0]) for n in range(self.sshd_count)), self.client_key):
            if not key.exists():
                _keygen(key)
        authorized = self.root / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        self.port = self.port or _free_port(self.addresses)
        for sshd in range(self.sshd_count):
            wrapper = self.root / f"wrapper-{sshd}.sh"
            wrapper.write_text(WRAPPER.format(home=self._home_lines(sshd)))
            wrapper.chmod(0o755)
            self.processes.append(self._launch(sshd))
        self._wait_listening(timeout)
        return self

    def _home_lines(self, sshd: int) -> str:
        """The wrapper's HOME: the worker's own; several workers per sshd are told apart by the address the
        client reached (the third field of ``$SSH_CONNECTION``)."""
        served = self.served_by(sshd)
        if self.addresses_per_sshd == 1:
            return f"export HOME={self.home(served[0])}"
        cases = "".join(f"  {self.addresses[i]}) export HOME={self.home(i)} ;;\n" for i in served)
        return (
            f'set -- $SSH_CONNECTION\ncase "$3" in\n{cases}  *) echo "no worker at $3" >&2; exit 1 ;;\nesac'
        )

    def _launch(self, sshd: int) -> subprocess.Popen[bytes]:
        """Write sshd number ``sshd``'s config (its host key, its workers' addresses) and start its
        listener."""
        served = self.served_by(sshd)
        count = len(served)
        limits = (
            TEST_LIMITS if self.addresses_per_sshd == 1 else f"MaxStartups {10 * count}:30:{100 * count}\n"
        )
        if self.max_startups is not None:
            limits = f"MaxStartups {self.max_startups}\n"
        config = self.root / f"sshd-{sshd}.conf"
        config.write_text(
            CONFIG.format(
                listen="".join(f"ListenAddress {self.addresses[i]}:{self.port}\n" for i in served),
                limits=limits,
                host_key=self.host_key(served[0]),
                pid_file=self.root / f"sshd-{sshd}.pid",
                authorized_keys=self.root / "authorized_keys",
                wrapper=self.root / f"wrapper-{sshd}.sh",
            )
            + ("SetEnv SHLVL=1\n" if self.stock_login else "")
        )
        return subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL, start_new_session=True
        )

    def swap_host_key(self, index: int, timeout: float = 30.0) -> str:
        """Give worker ``index`` a new host key and restart its sshd on the same address and port (its open
        sessions end with the old listener's process group, so nothing outlives the pod). Returns the new
        public key line. With several workers per sshd, they all get the new key."""
        sshd = index // self.addresses_per_sshd
        old = self.processes[sshd]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(old.pid, sig)
                old.wait(timeout=5)
                break
            except ProcessLookupError:
                old.wait()
                break
            except subprocess.TimeoutExpired:
                continue
        for path in (self.host_key(index), Path(f"{self.host_key(index)}.pub")):
            path.unlink(missing_ok=True)
        _keygen(self.host_key(index))
        self.processes[sshd] = self._launch(sshd)
        self._wait_listening(timeout, [self.addresses[i] for i in self.served_by(sshd)])
        return self.host_public_key(index)

    def _wait_listening(self, timeout: float, addresses: list[str] | None = None) -> None:
        """Until every address has a listening socket on the port: read from /proc/net/tcp, not probed with a
        connection (1,024 probes would each make an sshd fork and count against its MaxStartups)."""
        deadline = time.monotonic() + timeout
        pending = set(addresses or self.addresses)
        while pending and time.monotonic() < deadline:
            pending -= _listening(self.port)
            for proc in self.processes:
                if proc.poll() is not None:
                    raise RuntimeError(f"sshd exited with {proc.returncode}; config in {self.root}")
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"sshd not listening on {sorted(pending)} after {timeout}s")

    def sessions(self) -> list[int]:
        """Pids of the per-connection sshd processes (children of the listeners): killing them drops every SSH
        connection, as a laptop lid or a VPN reconnect would."""
        listeners = {proc.pid for proc in self.processes}
        return [pid for pid, ppid in _parents().items() if ppid in listeners]

    def drop_sessions(self) -> int:
        dropped = self.sessions()
        for pid in dropped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(dropped)

    def stop(self) -> None:
        kill_processes_with_home_under(self.root)  # detached supervisors and trainers outlive sshd by design
        for proc in self.processes:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.processes:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()

    def ssh_argv(self, index: int, command: str) -> list[str]:
        """Plain OpenSSH client argv for worker ``index`` (what the benchmark compares tpuft with)."""
        return [
            "ssh",
            "-i",
            str(self.client_key),
            "-p",
            str(self.port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            f"{self.user}@{self.addresses[index]}",
            command,
        ]

    def __enter__(self) -> SshdPod:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listening(port: int) -> set[str]:
    """IPv4 addresses with a socket listening on ``port`` in this network namespace."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(int(address, 16).to_bytes(4, "little")))
    return found


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return found


def kill_processes_with_home_under(root: Path) -> list[int]:
    """SIGKILL every process whose HOME is under ``root`` (a test's workers: supervisors, trainers, followers
    run in sessions of their own and would outlive the test)."""
    from tpuft.worker.supervisor.process import process_environ

    prefix = str(root.resolve())
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        home = process_environ(int(entry.name)).get("HOME")
        if home and (home == prefix or home.startswith(prefix + "/")):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed
