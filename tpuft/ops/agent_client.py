"""The warm path of ``tpuft exec``: hand the command to this cluster's connection agent
(:mod:`tpuft.ops.agent`) instead of starting an SSH fleet, like OpenSSH's ControlMaster. Never needed for
correctness: every ``None`` below means "no usable agent, run the normal way", and the caller does.

Why this module is light: it runs before Typer, pydantic and paramiko are imported (``tpuft exec`` in a loop
pays Python's start-up and nothing else). It finds the agent without loading the cluster file:

* ``file key``: a hash of the cluster file's absolute path, its bytes, and the environment that can change
  what it means (``TPUFT_*``, the login name, HOME). The agent writes ``agents/<file key>.json`` (the
  *pointer*: where the provider remembers the cluster, a fingerprint of the SSH settings, how long the memory
  is trusted).
* ``agent id``: a hash of the file key, the remembered workers and node ids, the settings fingerprint and the
  contents of the ssh client config and the pinned known_hosts. It names the socket, so a recreated node
  (other addresses, or the same ones under a new node id), other SSH settings, an edited ``~/.ssh/config`` or
  refreshed host keys never reach an agent holding old connections.
* The remembered cluster must be READY and fresh, as the cold path's ``open_session(cached=True)`` requires;
  the worker spec is parsed by the same function; anything unexpected falls back to the cold path, which then
  reports the problem in its own words.

Everything lives in ``$TPUFT_HOME/agents`` (0700, ours, checked), holds no secret, and ``TPUFT_NO_AGENT=1``
turns the whole thing off.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.core.errors import Interrupted, TpuftError, UsageError
from tpuft.core.paths import tpuft_home
from tpuft.core.records import SliceLayout
from tpuft.fleet.base import FleetResult, WorkerResult
from tpuft.fleet.spec import command_argv, parse_worker_list

OFF_ENV = "TPUFT_NO_AGENT"
IDLE_ENV = "TPUFT_AGENT_IDLE_S"
DEFAULT_IDLE_S = 300.0
"""An agent (and an ``ssh`` ControlMaster) ends after this long without a request."""
PROTOCOL = 1
READY_TIMEOUT_S = 5.0
"""How long a client waits for an agent to accept a request before running the command itself."""
INTERRUPT_GRACE_S = 30.0
"""After Ctrl-C, how long a client waits for the agent to report the stopped workers."""
_USER_ENV = ("LOGNAME", "USER", "LNAME", "USERNAME", "HOME")
"""What ``getpass.getuser()`` and ``~`` read: part of what a cluster file means."""
_MAX_SOCKET_PATH = 100


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip().lower() in ("", "0", "false", "no")


def idle_seconds() -> float:
    try:
        return max(0.1, float(os.environ.get(IDLE_ENV, "") or DEFAULT_IDLE_S))
    except ValueError:
        return DEFAULT_IDLE_S


def agents_dir(create: bool = True) -> Path | None:
    """``$TPUFT_HOME/agents``, a 0700 folder that is ours (None if it is not and cannot be made so: no
    agent)."""
    folder = tpuft_home() / "agents"
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None
        if info.st_mode & 0o077:
            os.chmod(folder, 0o700)
        return folder
    except OSError:
        return None


def resolve_cluster_path(explicit: str | None) -> str | None:
    """Which cluster file a command reads, as :func:`tpuft.config.cluster_file` decides (``--config`` >
    ``$TPUFT_CONFIG`` > ``./tpuft.yaml``); None for the embedded default, which is local and has no agent."""
    if explicit is not None:
        return os.path.abspath(explicit)
    env = os.environ.get("TPUFT_CONFIG")
    if env:
        return os.path.abspath(env)
    here = os.path.join(os.getcwd(), "tpuft.yaml")
    return here if os.path.isfile(here) else None


def file_key(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            contents = handle.read()
    except OSError:
        return None
    digest = hashlib.sha256()
    digest.update(path.encode() + b"\0" + contents + b"\0")
    meaning = sorted(
        (k, v)
        for k, v in os.environ.items()
        if (k.startswith("TPUFT_") and not k.startswith("TPUFT_AGENT") and k != OFF_ENV) or k in _USER_ENV
    )
    digest.update(json.dumps(meaning).encode())
    return digest.hexdigest()[:24]


def agent_id(key: str, workers: Any, nodes: Any, settings: str, files: Sequence[str]) -> str:
    """``nodes``: the API's unique ids of the slices (a node recreated on the same addresses is another node);
    ``files``: files whose contents change how a worker is reached (the ssh client config, the pinned host
    keys)."""
    contents = []
    for name in files:
        try:
            with open(name, "rb") as handle:
                contents.append(hashlib.sha256(handle.read()).hexdigest())
        except OSError:
            contents.append("")
    return hashlib.sha256(
        json.dumps([PROTOCOL, key, workers, nodes, settings, contents]).encode()
    ).hexdigest()[:16]


def agent_id_of(key: str, pointer: dict[str, Any], record: dict[str, Any]) -> str:
    """The agent id for a remembered cluster record, whatever its age (the agent checks it is still the
    one)."""
    files = pointer.get("files") or []
    return agent_id(
        key, record["workers"], record.get("nodes") or [], str(pointer["settings"]), [str(f) for f in files]
    )


@dataclass(frozen=True)
class Identity:
    """Who the agent of a cluster file is right now (None from :func:`current_identity`: no agent can serve
    it)."""

    folder: Path
    key: str
    agent: str
    workers: list[list[Any]]
    """As remembered by the provider: ``[index, address, internal address(, slice)]`` per worker, in order."""
    nodes: list[list[Any]] = field(default_factory=list)
    """As remembered by the provider: ``[node id, API id, worker count]`` per slice."""

    @property
    def layout(self) -> SliceLayout | None:
        """The slices of the remembered workers, so ``--worker 1:0`` means here what it means on the cold
        path; None when the record cannot tell (then only the cold path may read a ``S:I``)."""
        slices = {row[3] for row in self.workers if len(row) > 3}
        if slices:
            count = max(slices) + 1
        else:
            count = len(self.nodes) or 1
            if count > 1 and any(
                len(node) < 3 or node[2] != len(self.workers) // count for node in self.nodes
            ):
                return None
        if len(self.workers) % count:
            return None
        return SliceLayout(count, len(self.workers) // count)

    @property
    def socket_path(self) -> Path:
        return self.folder / f"{self.agent}.sock"


def pointer_path(folder: Path, key: str) -> Path:
    return folder / f"{key}.json"


def write_pointer(folder: Path, key: str, pointer: dict[str, Any]) -> None:
    """Atomically, 0600: paths and hashes only (no secret ever goes here)."""
    target = pointer_path(folder, key)
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(pointer, handle)
    os.replace(staging, target)


def identity_for(
    folder: Path, key: str, pointer: dict[str, Any], now: float | None = None
) -> Identity | None:
    """The agent id for the remembered cluster, if it is READY and fresh enough to be used without the API."""
    try:
        with open(pointer["record"], encoding="utf-8") as handle:
            record = json.load(handle)
        if record.get("state") != "READY":
            return None
        age = (time.time() if now is None else now) - float(record.get("time", 0))
        if age > float(pointer.get("cache_seconds", 600)) or age < -60:
            return None
        workers = record["workers"]
        if not isinstance(workers, list) or not workers:
            return None
        nodes = record.get("nodes") or []
        return Identity(
            folder, key, agent_id_of(key, pointer, record), workers, nodes if isinstance(nodes, list) else []
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current_identity(config_path: str | None) -> Identity | None:
    if not enabled() or config_path is None:
        return None
    folder = agents_dir(create=False)
    key = file_key(config_path)
    if folder is None or key is None:
        return None
    try:
        with open(pointer_path(folder, key), encoding="utf-8") as handle:
            pointer = json.load(handle)
    except (OSError, ValueError):
        return None
    return identity_for(folder, key, pointer) if isinstance(pointer, dict) else None


# -- the wire: one JSON object per line, both ways ---------------------------------------------------------
def socket_address(path: Path) -> tuple[str, int | None]:
    """A path ``connect``/``bind`` accept (108 bytes at most): long ones go through ``/proc/self/fd`` of the
    folder. Returns the address and the folder's fd to close afterwards (None: nothing to close)."""
    text = str(path)
    if len(text) <= _MAX_SOCKET_PATH:
        return text, None
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd


class Channel:
    """Line-delimited JSON over a connected Unix socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None at end of stream. Raises ``socket.timeout`` / ``OSError`` /
        ``ValueError``."""
        self.sock.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        return message

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect(identity: Identity, timeout: float = READY_TIMEOUT_S) -> Channel | None:
    """A channel to the cluster's agent; None if there is none (no socket, a stale file, a dead agent)."""
    try:
        info = os.lstat(identity.socket_path)
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
            return None
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, fd = socket_address(identity.socket_path)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        return Channel(sock)
    except OSError:
        sock.close()
        return None
    finally:
        if fd is not None:
            os.close(fd)


def request(identity: Identity, message: dict[str, Any]) -> dict[str, Any] | None:
    """One question, one answer (``ping``, ``stop``); None when no agent answers."""
    channel = connect(identity)
    if channel is None:
        return None
    try:
        channel.send({"v": PROTOCOL, "id": identity.agent, **message})
        return channel.receive(READY_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    finally:
        channel.close()


# -- exec --------------------------------------------------------------------------------------------------
LineSink = Callable[[int, str], None]


def try_exec(
    config_path: str | None, command: Sequence[str], workers: str | None, on_line: LineSink
) -> FleetResult | None:
    """Run ``command`` through the cluster's agent and return what the fleet would have; None: run it the
    normal way (nothing was started). Output reaches ``on_line`` exactly as the fleet would have given it."""
    identity = current_identity(config_path)
    if identity is None:
        return None
    try:
        argv = command_argv(command)
        layout = identity.layout
        if layout is None:
            return None  # the record cannot tell the slices apart: the cold path asks the provider
        chosen = parse_worker_list(workers, layout)
    except UsageError:
        return None  # the cold path words the refusal
    channel = connect(identity)
    if channel is None:
        return None
    try:
        try:
            channel.send({"v": PROTOCOL, "op": "exec", "id": identity.agent, "argv": argv, "workers": chosen})
            answer = channel.receive(READY_TIMEOUT_S)
            if not answer or not answer.get("ready"):
                return None
            channel.send({"go": True})  # from here on the command is the agent's to run
        except (OSError, ValueError):
            return None
        return _stream(channel, on_line)
    finally:
        channel.close()


def _stream(channel: Channel, on_line: LineSink) -> FleetResult | None:
    restore = _sigterm_interrupts()
    state = _StreamState()
    try:
        while True:
            try:
                outcome = _next(channel, on_line, state)
            except KeyboardInterrupt:  # Ctrl-C (or SIGTERM): the agent stops the workers and reports them
                if state.interrupted_at is None:
                    state.interrupted_at = time.monotonic()
                    # a second Ctrl-C cannot cut the clean-up short
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    try:
                        channel.send({"op": "interrupt"})
                    except OSError:
                        pass
                continue
            if outcome is not _MORE:
                return outcome  # type: ignore[return-value]
    finally:
        restore()


@dataclass
class _StreamState:
    interrupted_at: float | None = None
    printed: bool = False


_MORE = object()


def _next(channel: Channel, on_line: LineSink, state: _StreamState) -> object:
    """Handle one message from the agent: ``_MORE``, or what ``_stream`` returns (a result, or None: run it
    cold)."""
    timeout = None
    if state.interrupted_at is not None:
        timeout = max(0.1, state.interrupted_at + INTERRUPT_GRACE_S - time.monotonic())
    try:
        message = channel.receive(timeout)
    except (OSError, ValueError):
        message = None
    if message is None:
        if state.interrupted_at is not None:
            raise Interrupted("interrupted during the command: the tpuft agent did not report the workers")
        raise TpuftError(
            "the tpuft agent went away while the command ran (its remote processes have lost their "
            "connection)",
            hint=f"Run it again; {OFF_ENV}=1 runs it without the agent.",
        )
    if "o" in message:
        index, line = message["o"]
        state.printed = True
        on_line(int(index), str(line))
    elif "done" in message:
        return _result(message["done"])
    elif "fallback" in message and not state.printed and state.interrupted_at is None:
        return None  # the agent started nothing (e.g. a worker cannot be reached): the cold path retries
    elif "early_interrupt" in message:
        raise Interrupted("interrupted while connecting to the workers: nothing was started")
    elif "error" in message:
        raise TpuftError(f"tpuft agent: {message['error']}")
    return _MORE


def _result(done: dict[str, Any]) -> FleetResult:
    results = [
        WorkerResult(
            index=int(r["index"]),
            exit_code=r["exit_code"],
            seconds=float(r["seconds"]),
            tail=list(r["tail"]),
            log_path=None,
            pid=r.get("pid"),
        )
        for r in done["results"]
    ]
    return FleetResult(
        results=results, first_failure=done.get("first_failure"), interrupted=bool(done.get("interrupted"))
    )


def _sigterm_interrupts() -> Callable[[], None]:
    """SIGTERM to a waiting client stops the remote commands, as it does on the cold path (the fleet's
    rule)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    term = signal.signal(signal.SIGTERM, handler)
    sigint = signal.getsignal(signal.SIGINT)

    def restore() -> None:
        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGINT, sigint)

    return restore


# -- starting and stopping agents --------------------------------------------------------------------------
def ping(config_path: str | None) -> dict[str, Any] | None:
    identity = current_identity(config_path)
    return request(identity, {"op": "ping"}) if identity is not None else None


def stop(config_path: str | None) -> bool:
    identity = current_identity(config_path)
    return identity is not None and request(identity, {"op": "stop"}) is not None


def ensure_agent(config_path: str | None) -> None:
    """After a cold ``exec``: start this cluster file's agent in the background unless one answers. Detached
    (its own session, no terminal, output to a log in the agents folder), so it outlives this command and
    never blocks it."""
    if not enabled() or config_path is None:
        return
    folder = agents_dir()
    key = file_key(config_path)
    if folder is None or key is None:
        return
    if ping(config_path) is not None:
        return
    import subprocess

    from tpuft.core.paths import environ_with_package

    log = folder / f"{key}.log"
    try:
        if log.exists() and log.stat().st_size > 1_000_000:
            log.unlink()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return
    env = environ_with_package()
    try:
        subprocess.Popen(
            [sys.executable, "-m", "tpuft.ops.agent", "--config", config_path],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
            env=env,
            cwd=str(folder),
        )
    except OSError:
        pass
    finally:
        os.close(fd)


# -- interactive shells: OpenSSH's own connection sharing --------------------------------------------------
def control_path(cluster_dir: Path, address: str, settings: Any) -> str | None:
    """A ControlPath for ``tpuft ssh`` to one worker: a PTY session cannot go through the agent's paramiko
    connections, so the second ``tpuft ssh`` reuses OpenSSH's own master connection instead
    (ControlMaster=auto, ControlPersist). Named per cluster (a prefix :func:`forget_control_paths` finds) and
    per address and settings, in the 0700 agents folder; None when off, or when the path would be too long for
    a socket (ssh adds a suffix)."""
    if not enabled():
        return None
    folder = agents_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(repr((address, settings)).encode()).hexdigest()[:12]
    name = f"cm-{_cluster_tag(cluster_dir)}-{digest}"
    path = str(folder / name)
    if len(path) > 104 - 20 or "%" in path:
        return None
    return path


def control_options(cluster_dir: Path, address: str, settings: Any) -> list[str]:
    path = control_path(cluster_dir, address, settings)
    if path is None:
        return []
    return [
        "-o",
        "ControlMaster=auto",
        "-o",
        f"ControlPath={path}",
        "-o",
        f"ControlPersist={int(idle_seconds()) or 1}",
    ]


def forget_control_paths(cluster_dir: Path) -> None:
    """When a cluster is deleted: no later ``tpuft ssh`` may reach a master connection to its old workers."""
    folder = agents_dir(create=False)
    if folder is None:
        return
    for path in folder.glob(f"cm-{_cluster_tag(cluster_dir)}-*"):
        try:
            path.unlink()
        except OSError:
            pass


def _cluster_tag(cluster_dir: Path) -> str:
    return hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:8]
