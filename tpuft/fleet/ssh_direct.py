"""A worker connection without Fabric, for the common case where the user's ``~/.ssh/config`` says nothing about
the worker (no ``Host`` block sets its HostName, User, Port, IdentityFile, ConnectTimeout, ProxyJump or
ProxyCommand): then Fabric would only hand paramiko the cluster file's settings, and importing it (and invoke, which
paramiko's config module imports on its own too, for ``Match exec``: unittest.mock, asyncio, a YAML parser) cost a
cold ``tpuft exec`` about 50 ms of its 200. Anything the file does say for the worker still goes through Fabric
(:mod:`tpuft.fleet.ssh`), as before; so does a ``Match exec`` line (invoke runs it).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

FABRIC_KEYS = frozenset({"port", "user", "identityfile", "connecttimeout", "proxyjump", "proxycommand"})
"""What Fabric reads from a Host block for a connection (HostName too). Other keys (ServerAliveInterval, ...) are
read by neither way."""

_import_lock = threading.Lock()


def import_paramiko() -> Any:
    """paramiko, imported without invoke when nothing has imported invoke yet (``sys.modules[name] = None`` makes
    paramiko's ``try: import invoke`` fail the way a missing package does); :func:`enable_match_exec` brings it back
    for the one feature that needs it."""
    with _import_lock:
        if "paramiko" not in sys.modules and "invoke" not in sys.modules:
            sys.modules["invoke"] = None  # type: ignore[assignment]
            try:
                import paramiko  # noqa: F401
            finally:
                del sys.modules["invoke"]
        import paramiko

        return paramiko


def enable_match_exec() -> None:
    """Give paramiko's config module the invoke it went without (Fabric imports it anyway)."""
    import invoke
    import paramiko.config

    with _import_lock:
        paramiko.config.invoke = invoke
        paramiko.config.invoke_import_error = None


def lookup(parsed: Any, address: str) -> dict[str, Any]:
    """``parsed.lookup(address)``, with invoke brought in first if the file has a ``Match exec`` to run."""
    try:
        return dict(parsed.lookup(address))
    except ImportError:
        enable_match_exec()
        return dict(parsed.lookup(address))


def needs_fabric(says: dict[str, Any], address: str) -> bool:
    return says.get("hostname", address) != address or not FABRIC_KEYS.isdisjoint(says)


class DirectConnection:
    """What :class:`tpuft.fleet.ssh.SshFleet` uses of a ``fabric.Connection`` (host, user, port, ``connect_kwargs``,
    ``open``, ``client``, ``close``), for a worker its ssh_config says nothing about: Fabric would connect it with
    exactly these values (the cluster file's)."""

    gateway = None

    def __init__(self, host: str, user: str, port: int, connect_timeout: float, ssh_config: dict[str, Any]) -> None:
        paramiko = import_paramiko()
        self.host = host
        self.user = user
        self.port = port
        self.connect_timeout = connect_timeout
        self.ssh_config = ssh_config
        self.connect_kwargs: dict[str, Any] = {}
        self.client = paramiko.SSHClient()

    @property
    def is_connected(self) -> bool:
        transport = self.client.get_transport()
        return bool(transport is not None and transport.is_active())

    def open(self) -> None:
        self.client.connect(
            **self.connect_kwargs, hostname=self.host, port=self.port, username=self.user, timeout=self.connect_timeout
        )

    def close(self) -> None:
        self.client.close()
