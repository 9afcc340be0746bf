"""A pod of real OpenSSH servers on loopback, one per worker, for testing the SSH fleet without a cloud.

Worker i listens on 127.0.1.(10+i) (Linux routes all of 127.0.0.0/8 to loopback). Each sshd runs with a private
config whose ``ForceCommand`` goes through a wrapper that gives the worker its own HOME (so workers look like
separate hosts that share this machine's Python and disk) and then runs the client's command with bash. Keys are
made fresh per pod: one ed25519 host key per worker (so pinning one host's key is tested against the others'), one
client key (ed25519) that is the only authorized key. ``host_keys`` is what the fake TPU API publishes as the
workers' guest attributes (``tpu.host_keys.update(pod.host_keys)``); ``swap_host_key(i)`` gives worker i a new key,
as a re-imaged host or a man in the middle would, and restarts its sshd on the same address and port.

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


def worker_address(index: int, first: int = 10) -> str:
    return f"127.0.1.{first + index}"


def _free_port(addresses: list[str]) -> int:
    """A port that is free on every address (the pod shares one port like real hosts share 22)."""
    from tpuft.ports import free_port, port_is_free

    for _ in range(50):
        port = free_port(addresses[0])
        if all(port_is_free(address, port) for address in addresses[1:]):
            return port
    raise RuntimeError("no port free on every worker address")


WRAPPER = """#!/bin/bash
# ForceCommand wrapper: this worker's private HOME, then the client's command (or a login shell).
export HOME={home}
mkdir -p "$HOME" && cd "$HOME" || exit 1
if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec bash -l; fi
exec bash -c "$SSH_ORIGINAL_COMMAND"
"""

CONFIG = """ListenAddress {address}:{port}
HostKey {host_key}
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
MaxStartups 1000:30:1000
MaxSessions 1000
ClientAliveInterval 30
LogLevel ERROR
"""


@dataclass
class SshdPod:
    """N sshd processes; ``start()`` waits until every one accepts connections, ``stop()`` kills them all."""

    root: Path
    workers: int
    port: int = 0
    first_address: int = 10
    """Worker i listens on 127.0.1.(first_address + i): a second pod on other addresses plays a recreated node."""
    user: str = field(default_factory=lambda: os.environ.get("USER") or "root")
    stock_login: bool = True
    """True (the default): a session's shell skips the login user's ~/.bashrc (sshd sets SHLVL=1, and bash sources
    ~/.bashrc for sshd only at level 1), as on a stock TPU VM image, whose ~/.bashrc returns at once for a
    non-interactive shell. This machine's root runs pyenv's init there: about 0.1 CPU-second per session (the quick
    ssh tests ran 20% faster without it) and, when two sessions rehash at once, a stray "pyenv: cannot rehash" line
    in a worker's output (a flaky CI failure). False keeps the machine's login as it is."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [worker_address(i, self.first_address) for i in range(self.workers)]

    @property
    def client_key(self) -> Path:
        return self.root / "client_key"

    def home(self, index: int) -> Path:
        return self.root / "homes" / f"worker-{index}"

    def host_key(self, index: int) -> Path:
        """Worker ``index``'s private host key (its ``.pub`` is beside it)."""
        return self.root / f"host_key-{index}"

    def host_public_key(self, index: int) -> str:
        """The OpenSSH public key line of worker ``index``'s host key, without the comment: ``ssh-ed25519 AAAA...``."""
        kind, blob = Path(f"{self.host_key(index)}.pub").read_text().split()[:2]
        return f"{kind} {blob}"

    @property
    def host_keys(self) -> dict[str, str]:
        """Address -> public host key line for every worker: what ``FakeTpuServer.host_keys`` publishes. A copy, so a
        later ``swap_host_key`` does not change what the API says (that is the mismatch to be caught)."""
        return {address: self.host_public_key(i) for i, address in enumerate(self.addresses)}

    def start(self, timeout: float = 30.0) -> SshdPod:
        self.root.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
        for key in (*(self.host_key(i) for i in range(self.workers)), self.client_key):
            if not key.exists():
                _keygen(key)
        authorized = self.root / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        self.port = self.port or _free_port(self.addresses)
        for index in range(self.workers):
            wrapper = self.root / f"wrapper-{index}.sh"
            wrapper.write_text(WRAPPER.format(home=self.home(index)))
            wrapper.chmod(0o755)
            self.processes.append(self._launch(index))
        self._wait_listening(timeout)
        return self

    def _launch(self, index: int) -> subprocess.Popen[bytes]:
        """Write worker ``index``'s sshd config (its own host key) and start its listener."""
        config = self.root / f"sshd-{index}.conf"
        config.write_text(
            CONFIG.format(
                address=self.addresses[index],
                port=self.port,
                host_key=self.host_key(index),
                pid_file=self.root / f"sshd-{index}.pid",
                authorized_keys=self.root / "authorized_keys",
                wrapper=self.root / f"wrapper-{index}.sh",
            )
            + ("SetEnv SHLVL=1\n" if self.stock_login else "")
        )
        return subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL, start_new_session=True)

    def swap_host_key(self, index: int, timeout: float = 30.0) -> str:
        """Give worker ``index`` a new host key and restart its sshd on the same address and port (its open sessions
        end with the old listener's process group, so nothing outlives the pod). Returns the new public key line."""
        old = self.processes[index]
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
        self.processes[index] = self._launch(index)
        self._wait_listening(timeout, [self.addresses[index]])
        return self.host_public_key(index)

    def _wait_listening(self, timeout: float, addresses: list[str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        pending = set(addresses or self.addresses)
        while pending and time.monotonic() < deadline:
            for address in list(pending):
                with socket.socket() as probe:
                    probe.settimeout(0.2)
                    if probe.connect_ex((address, self.port)) == 0:
                        pending.discard(address)
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
            "ssh", "-i", str(self.client_key), "-p", str(self.port),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "BatchMode=yes", f"{self.user}@{self.addresses[index]}", command,
        ]

    def __enter__(self) -> SshdPod:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
    """SIGKILL every process whose HOME is under ``root`` (a test's workers: supervisors, trainers, followers run in
    sessions of their own and would outlive the test)."""
    from tpuft.worker.supervisor import process_environ

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
