"""The SSH fleet and the user's OpenSSH client config: ``Host`` blocks as ``ssh`` reads them (``%p``/``%r`` as
the connection will use them), ``ProxyCommand`` whose end ends the connection, ``ProxyJump`` hosts checked
like ``ssh -J`` checks them, and the options that make ``tpuft ssh`` (OpenSSH itself) reach a worker as the
fleet does.

Apart from :mod:`tpuft.fleet.ssh` because it is about the user's machine and its files, not about the workers;
the fleet's settings (``SshSettings``) live here with it, and :mod:`tpuft.fleet.ssh` re-exports them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError


@dataclass(frozen=True)
class SshSettings:
    user: str
    key_file: Path
    port: int = 22
    connect_attempts: int = 10
    """Like gcloud: a VM that has just turned READY may need a while before sshd answers."""
    retry_delay_s: float = 5.0
    connect_timeout_s: float = 20.0
    keepalive_s: int = 30
    max_parallel_connects: int = 64
    """Bounded fan-out for the handshakes (each costs sshd a fork and a key exchange)."""
    known_hosts: Path | None = None
    """The cluster's pinned host keys (from the TPU API's guest attributes); None: no pinning (tests,
    benchmarks)."""
    ssh_config: Path | None = Path("~/.ssh/config")
    """The OpenSSH client config whose ``Host`` blocks apply to the workers (``User``, ``Port``,
    ``IdentityFile``, ``HostName``, ``ProxyJump``, ``ProxyCommand``, ``ConnectTimeout``); a missing file is an
    empty one; None reads none. Only this file: like ``ssh -F FILE``, not also /etc/ssh/ssh_config."""
    explicit: tuple[str, ...] = ("key_file", "port", "user")
    """Which of ``user``, ``key_file`` and ``port`` the cluster file set. Those win over ``ssh_config``; the
    others are defaults (local user name, ~/.ssh/google_compute_engine, 22) that a matching ``Host`` block
    replaces. Code that builds settings itself (tests, benchmarks) means what it gives, hence all three by
    default. A sorted tuple, not a set: the settings' repr names the connection agent's socket and must be the
    same in every process."""


class SshConnectError(TpuftError):
    pass


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line (and paramiko's lookup) uses for a host: ``[host]:port`` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def host_block(settings: SshSettings, address: str) -> dict[str, Any]:
    """What ``settings.ssh_config`` says for ``address`` (lower-case keys, as paramiko's lookup gives them);
    {} when there is no file."""
    import paramiko

    if settings.ssh_config is None:
        return {}
    try:
        return dict(paramiko.SSHConfig.from_path(str(settings.ssh_config.expanduser())).lookup(address))
    except FileNotFoundError:
        return {}


def openssh_options(settings: SshSettings, address: str) -> list[str]:
    """Options that make OpenSSH's client (``tpuft ssh``) reach ``address`` as the fleet does: the same config
    file (``-F``; /dev/null for none or a missing one), and ``-l``/``-p``/``-i`` only for what the cluster
    file set or no Host block says, so the rest comes from the Host block as in the fleet."""
    path = settings.ssh_config.expanduser() if settings.ssh_config is not None else None
    says = host_block(settings, address)
    options = ["-F", str(path) if path is not None and path.is_file() else "/dev/null"]
    if "user" in settings.explicit or "user" not in says:
        options += ["-l", settings.user]
    if "port" in settings.explicit or "port" not in says:
        options += ["-p", str(settings.port)]
    if "key_file" in settings.explicit or "identityfile" not in says:
        options += ["-i", str(settings.key_file.expanduser())]
    return options


def worker_ssh_config_class() -> Any:
    """paramiko's SSHConfig, except that for a worker's address ``%p`` and ``%r`` (in ``ProxyCommand``, say)
    mean the port and user the connection will use: the cluster file's explicit ones win over the Host block,
    as ``ssh -p`` and ``-l`` do. paramiko expands them from the Host block alone; a bastion's lookup is left
    as it is."""
    import paramiko

    class WorkerSshConfig(paramiko.SSHConfig):  # type: ignore[misc]
        worker_tokens: tuple[set[str], dict[str, Any]] = (set(), {})

        def _tokenize(self, config: Any, target_hostname: str, key: str, value: Any) -> Any:
            workers, explicit = self.worker_tokens
            if explicit and target_hostname in workers:
                config = {**config, **explicit}
            return super()._tokenize(config, target_hostname, key, value)

    return WorkerSshConfig


def proxy_command_class() -> Any:
    """paramiko's ProxyCommand, except that the end of the command's output ends the connection. paramiko's
    ``recv`` loops while ``select`` says the pipe is readable and ``read`` returns nothing, which is what a
    pipe does once the command has exited (the bastion went away, ``ssh -W`` died): the transport's thread
    then spins a core for good and never sees the connection drop, so nothing reconnects. Here EOF returns
    what was read (``b""`` at the end), which paramiko takes, as from a socket, for a closed connection."""
    import select

    import paramiko

    class EofProxyCommand(paramiko.ProxyCommand):  # type: ignore[misc]
        def recv(self, size: int) -> bytes:
            buffer = b""
            started = time.time()
            try:
                while len(buffer) < size:
                    wait = None
                    if self.timeout is not None:
                        wait = self.timeout - (time.time() - started)
                        if wait <= 0:
                            raise TimeoutError()
                    readable, _, _ = select.select([self.process.stdout], [], [], wait)
                    if readable:
                        chunk = os.read(self.process.stdout.fileno(), size - len(buffer))
                        if not chunk:  # EOF: the command has exited
                            return buffer
                        buffer += chunk
                return buffer
            except TimeoutError:
                if buffer:
                    return buffer
                raise
            except OSError as exc:
                raise paramiko.ProxyCommandFailure(" ".join(self.cmd), exc.strerror) from None

    return EofProxyCommand


def prepare_bastion(hop: Any) -> None:
    """A ProxyJump host is a host of the user's, not a TPU worker: its key is checked the way ``ssh -J``
    would, from the known_hosts files its ``Host`` block names (default ~/.ssh/known_hosts,
    ~/.ssh/known_hosts2 and the global /etc/ssh/ssh_known_hosts), refusing an unknown one (ssh in batch mode)
    unless its ``StrictHostKeyChecking`` is ``accept-new`` or ``no``. A changed key is always refused. Its
    User, Port and IdentityFile are ssh's too."""
    import paramiko

    config = hop.ssh_config
    files = str(config.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2")).split()
    files += str(
        config.get("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2")
    ).split()
    for name in files:
        path = os.path.expanduser(name)
        if os.path.isfile(path):
            hop.client.load_system_host_keys(path)
    strict = str(config.get("stricthostkeychecking", "ask")).lower()
    lenient = strict in {"no", "off", "accept-new"}
    hop.client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if lenient else paramiko.RejectPolicy())


def set_nodelay(sock: Any) -> None:
    """Turn Nagle's algorithm off on a TCP socket (anything else, a ProxyCommand's pipe, is left alone). SSH
    is a conversation of small packets: with Nagle on, a packet sent while the previous one is unacknowledged
    waits for the peer's delayed ACK, 40 ms on Linux, and the handshake and a command's start met it once or
    twice each (paramiko, unlike OpenSSH, never sets it): a cold ``exec`` to one worker spent 65-105 ms
    connecting, 20 with it."""
    import socket

    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def nodelay_socket(host: str, port: int, timeout: float) -> Any:
    """A TCP connection to ``host:port`` for paramiko, which would open one without TCP_NODELAY (see
    :func:`set_nodelay`). Raises OSError as paramiko's own would, so the fleet retries it the same way."""
    import socket

    sock = socket.create_connection((host, port), timeout=timeout)
    set_nodelay(sock)
    return sock


def fingerprint(key: Any) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it, so a user can compare with what the VM's console
    says."""
    import base64
    import hashlib

    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
