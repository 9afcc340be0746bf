"""A worker connection without Fabric, for the common case where the user's ``~/.ssh/config`` says nothing
about the worker (no ``Host`` block sets its HostName, User, Port, IdentityFile, ConnectTimeout, ProxyJump or
ProxyCommand): then Fabric would only hand paramiko the cluster file's settings, and importing it (and invoke,
which paramiko's config module imports on its own too, for ``Match exec``: unittest.mock, asyncio, a YAML
parser) cost a cold ``tpuft exec`` about 50 ms of its 200. Anything the file does say for the worker still
goes through Fabric (:mod:`tpuft.fleet.ssh`), as before; so does a ``Match exec`` line (invoke runs it).
"""

from __future__ import annotations

import glob
import os
import sys
import threading
import types
from typing import Any

FABRIC_KEYS = frozenset({"port", "user", "identityfile", "connecttimeout", "proxyjump", "proxycommand"})
"""What Fabric reads from a Host block for a connection (HostName too). Other keys (ServerAliveInterval, ...)
are read by neither way."""

_import_lock = threading.Lock()


def import_paramiko() -> Any:
    """paramiko, imported without two things it does not need here, each only if nothing has imported it yet:
    invoke (``sys.modules[name] = None`` makes paramiko's ``try: import invoke`` fail the way a missing
    package does;
    :func:`enable_match_exec` brings it back for the one feature that needs it), and ``importlib.metadata``,
    which paramiko's ``__init__`` imports to read its own version for the SSH banner (email, zipfile, csv and
    a scan of site-packages: 15-20 ms of CPU); :class:`_PackageVersions` answers from paramiko's
    ``.dist-info`` folder name instead, and hands anything else to the real module."""
    with _import_lock:
        if "paramiko" not in sys.modules:
            hidden: dict[str, Any] = {}
            if "invoke" not in sys.modules:
                hidden["invoke"] = None
            if "importlib.metadata" not in sys.modules:
                hidden["importlib.metadata"] = _PackageVersions("importlib.metadata")
            sys.modules.update(hidden)
            try:
                import paramiko
            finally:
                for name, stand_in in hidden.items():
                    if sys.modules.get(name) is stand_in:
                        del sys.modules[name]
                import importlib

                if isinstance(getattr(importlib, "metadata", None), _PackageVersions):
                    del importlib.metadata
        import paramiko

        return paramiko


class _PackageVersions(types.ModuleType):
    """Stands in for ``importlib.metadata`` while paramiko is imported: ``version("paramiko")`` from the name
    of its ``paramiko-X.Y.Z.dist-info`` folder beside the package; anything else from the real module."""

    def version(self, name: str) -> str:
        if name == "paramiko":
            for entry in sys.path:
                found = sorted(glob.glob(os.path.join(entry or ".", "paramiko-*.dist-info")))
                if len(found) == 1:
                    return os.path.basename(found[0])[len("paramiko-") : -len(".dist-info")]
        return str(_real_metadata().version(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_metadata(), name)


def _real_metadata() -> Any:
    import importlib

    if isinstance(sys.modules.get("importlib.metadata"), _PackageVersions):
        del sys.modules["importlib.metadata"]
    return importlib.import_module("importlib.metadata")


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
    """What :class:`tpuft.fleet.ssh.SshFleet` uses of a ``fabric.Connection`` (host, user, port,
    ``connect_kwargs``, ``open``, ``client``, ``close``), for a worker its ssh_config says nothing about:
    Fabric would connect it with exactly these values (the cluster file's)."""

    gateway = None

    def __init__(
        self, host: str, user: str, port: int, connect_timeout: float, ssh_config: dict[str, Any]
    ) -> None:
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
            **self.connect_kwargs,
            hostname=self.host,
            port=self.port,
            username=self.user,
            timeout=self.connect_timeout,
        )

    def close(self) -> None:
        self.client.close()
