"""A per-cluster connection agent: a small background process that keeps SSH connections to every worker open
and runs ``tpuft exec`` commands on them, so a repeated command pays neither Python's imports nor a handshake
per worker (OpenSSH's ControlMaster/ControlPersist, for the whole pod at once).

Started detached by a cold ``tpuft exec`` (:func:`tpuft.ops.agent_client.ensure_agent`) as
``python -m tpuft.ops.agent --config FILE``. It serves a Unix socket in ``$TPUFT_HOME/agents`` (0700) named by
the cluster's identity (:mod:`tpuft.ops.agent_client`), answers only its own user (``SO_PEERCRED``), and ends
itself: after ``$TPUFT_AGENT_IDLE_S`` seconds without a request (default 300), when the cluster file, the
remembered workers or node, the ssh client config, the pinned host keys or its socket change, when a worker
cannot be reached, or when asked (``stop``). It holds keys only in memory, as the fleet does, and writes only
its pointer (paths and hashes) and a log of its own events (never a command).

A request runs on the public :class:`~tpuft.fleet.ssh.SshFleet` API (``run``/``close``) exactly as the cold
path runs it: same argv, same environment (the cluster file's ``worker_env`` too, through
:func:`tpuft.ops.common.worker_env`, on the channel's stdin), fail-fast. Connections are pooled per fleet: a
request takes an idle fleet or makes a new one, so concurrent requests never share one fleet. Ctrl-C on the
client (or its death) interrupts the request's ``run`` the way Ctrl-C interrupts it in the foreground: the
fleet stops the remote process groups.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuft.fleet.spec import exec_env
from tpuft.ops import agent_client as wire
from tpuft.ops.common import worker_env

MAX_IDLE_FLEETS = 2
"""Connection sets kept between requests (more are made for concurrent requests, then closed)."""
CHECK_SECONDS = 1.0


def log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} agent {os.getpid()}: {message}\n")
    sys.stderr.flush()


def settings_fingerprint(settings: Any) -> str:
    """The SSH settings (user, key path, port, timeouts, pinned hosts) as a hash: part of the agent's name."""
    return hashlib.sha256(repr(settings).encode()).hexdigest()[:16]


class Agent:
    def __init__(
        self,
        config_path: str,
        folder: Path,
        identity: wire.Identity,
        provider: Any,
        cluster: Any,
        config: Any,
    ) -> None:
        self.config_path = config_path
        self.config = config
        """The cluster file as loaded at start; a changed file changes the identity, which ends this agent."""
        self.folder = folder
        self.identity = identity
        self.provider = provider
        self.cluster = cluster
        self.idle_s = wire.idle_seconds()
        self.pointer: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.idle_fleets: list[Any] = []
        self.fleets_made = 0
        self.requests = 0
        self.active = 0
        self.last_activity = time.monotonic()
        self.stopping = threading.Event()
        self.socket_inode: int | None = None

    # -- fleets ---------------------------------------------------------------------------------------------
    def new_fleet(self) -> Any:
        from tpuft.fleet.ssh import SshFleet

        fleet = self.provider.fleet(self.cluster)
        if not isinstance(fleet, SshFleet):
            raise RuntimeError(f"provider {self.provider.name} has no SSH fleet")
        with self.lock:
            self.fleets_made += 1
        return fleet

    def take_fleet(self) -> Any:
        with self.lock:
            if self.idle_fleets:
                return self.idle_fleets.pop()
        return self.new_fleet()

    def give_back(self, fleet: Any) -> None:
        with self.lock:
            if len(self.idle_fleets) < MAX_IDLE_FLEETS and not self.stopping.is_set():
                self.idle_fleets.append(fleet)
                return
        fleet.close()

    def warm_up(self) -> None:
        """Connect to every worker now, so the first client request finds live connections."""
        fleet = self.new_fleet()
        result = fleet.run(["true"], env=None, on_line=None)
        if not result.ok:
            fleet.close()
            raise RuntimeError("`true` failed on a worker while connecting")
        self.give_back(fleet)

    # -- still the right agent? -----------------------------------------------------------------------------
    def still_current(self) -> bool:
        if wire.file_key(self.config_path) != self.identity.key:
            return False
        try:
            with open(self.pointer["record"], encoding="utf-8") as handle:
                record = json.load(handle)
            if (
                record.get("state") != "READY"
                or wire.agent_id_of(self.identity.key, self.pointer, record) != self.identity.agent
            ):
                return (
                    False  # other workers, another node, other SSH settings, an edited ssh config or new pins
                )
        except (OSError, ValueError, KeyError):
            return False
        try:
            return os.lstat(self.identity.socket_path).st_ino == self.socket_inode
        except OSError:
            return False

    # -- serving --------------------------------------------------------------------------------------------
    def serve(self, server: socket.socket) -> None:
        server.settimeout(CHECK_SECONDS)
        while not self.stopping.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                with self.lock:
                    idle = self.active == 0 and time.monotonic() - self.last_activity > self.idle_s
                if idle:
                    log(f"idle for {self.idle_s:g} s: ending")
                    break
                if not self.still_current():
                    log(
                        "the cluster file, the workers, the node, the ssh config, the pins or the socket "
                        "changed: ending"
                    )
                    break
                continue
            if not _same_user(conn):
                conn.close()
                continue
            with self.lock:
                self.active += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        channel = wire.Channel(conn)
        try:
            message = channel.receive(wire.READY_TIMEOUT_S)
            if not message or message.get("v") != wire.PROTOCOL:
                return
            op = message.get("op")
            if op == "ping":
                with self.lock:
                    channel.send(
                        {
                            "pid": os.getpid(),
                            "id": self.identity.agent,
                            "fleets_made": self.fleets_made,
                            "requests": self.requests,
                            "workers": len(self.identity.workers),
                        }
                    )
            elif op == "stop":
                self.stopping.set()
                channel.send({"stopping": True})
            elif op == "exec":
                self.exec(channel, message)
        except (OSError, ValueError):
            pass
        finally:
            channel.close()
            with self.lock:
                self.active -= 1
                self.last_activity = time.monotonic()

    def exec(self, channel: wire.Channel, message: dict[str, Any]) -> None:
        argv, chosen = message.get("argv"), message.get("workers")
        count = len(self.identity.workers)
        valid = (
            message.get("id") == self.identity.agent
            and isinstance(argv, list)
            and argv
            and all(isinstance(a, str) for a in argv)
            and (
                chosen is None
                or (isinstance(chosen, list) and all(isinstance(i, int) and 0 <= i < count for i in chosen))
            )
        )
        if not valid or not self.still_current():
            channel.send({"fallback": "stale or malformed request"})
            if valid:
                self.stopping.set()
            return
        channel.send({"ready": True})
        go = channel.receive(wire.READY_TIMEOUT_S)
        if not go or not go.get("go"):
            return
        with self.lock:
            self.requests += 1
        Request(self, channel, argv, chosen).run()


class Request:
    """One ``exec``: the fleet runs in this thread; a watcher thread turns the client's Ctrl-C (or its going
    away) into a KeyboardInterrupt here, which the fleet handles as in the foreground (it stops the remote
    groups)."""

    def __init__(
        self, agent: Agent, channel: wire.Channel, argv: list[str], chosen: list[int] | None
    ) -> None:
        self.agent = agent
        self.channel = channel
        self.argv = argv
        self.chosen = chosen
        self.send_lock = threading.Lock()
        self.state_lock = threading.Lock()
        self.running = False
        self.interrupted = False
        self.printed = False
        self.thread_id = threading.get_ident()

    def send(self, message: dict[str, Any]) -> None:
        with self.send_lock:
            try:
                self.channel.send(message)
            except OSError:
                self.interrupt()  # the client is gone: nobody would see the rest, and nobody could stop it

    def on_line(self, index: int, line: str) -> None:
        self.printed = True
        self.send({"o": [index, line]})

    def interrupt(self) -> None:
        from tpuft.fleet.supervise import interrupt_thread

        with self.state_lock:
            if self.running and not self.interrupted:
                self.interrupted = True
                interrupt_thread(
                    self.thread_id,
                    lambda: ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.thread_id), ctypes.py_object(KeyboardInterrupt)
                    ),
                )

    def watch(self) -> None:
        while True:
            try:
                message = self.channel.receive(None)
            except (OSError, ValueError):
                message = None
            if message is None or message.get("op") == "interrupt":
                self.interrupt()
                return

    def env_for(self) -> Callable[[Any], dict[str, str]]:
        """Each worker's environment, as the cold path builds it (:func:`tpuft.ops.cluster.exec_command`),
        from the same remembered workers (their slices included)."""
        layout = self.agent.cluster.layout
        return lambda worker: worker_env(self.agent.config, exec_env(worker.index, layout))

    def run(self) -> None:
        from tpuft.fleet.ssh import SshConnectError

        fleet = self.agent.take_fleet()
        healthy = True
        with self.state_lock:
            self.running = True
        threading.Thread(target=self.watch, daemon=True).start()
        try:
            try:
                result = fleet.run(self.argv, env=self.env_for(), workers=self.chosen, on_line=self.on_line)
            finally:
                with self.state_lock:
                    self.running = False
                    if self.interrupted:  # delivered or not yet: make sure it never lands outside this block
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)
        except KeyboardInterrupt:
            healthy = False
            self.send({"early_interrupt": True})
            return
        except SshConnectError as exc:
            healthy = False
            log(f"a worker cannot be reached ({exc.message}); handing back and ending")
            self.agent.stopping.set()
            self.send({"fallback": "connect"} if not self.printed else {"error": exc.message})
            return
        except Exception as exc:  # noqa: BLE001 - whatever it is, the client must hear it (or run the command itself)
            healthy = False
            log(f"request failed: {type(exc).__name__}: {exc}")
            self.send(
                {"fallback": "error"} if not self.printed else {"error": f"{type(exc).__name__}: {exc}"}
            )
            return
        finally:
            if healthy:
                self.agent.give_back(fleet)
            else:
                fleet.close()
        self.send(
            {
                "done": {
                    "results": [
                        {
                            "index": r.index,
                            "exit_code": r.exit_code,
                            "seconds": r.seconds,
                            "tail": list(r.tail),
                            "pid": r.pid,
                        }
                        for r in result.results
                    ],
                    "first_failure": result.first_failure,
                    "interrupted": result.interrupted,
                }
            }
        )


def _same_user(conn: socket.socket) -> bool:
    """Only our own user may use our connections (the 0700 folder says so too; this checks the peer
    itself)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid == os.getuid()
    except OSError:
        return False


def start(config_path: str) -> int:
    """Become the agent of ``config_path`` (exit 0 without serving whenever it cannot or need not be one)."""
    if not wire.enabled():
        return 0
    folder = wire.agents_dir()
    key = wire.file_key(config_path)
    if folder is None or key is None:
        return 0
    from tpuft.config import load_cluster
    from tpuft.providers import get_provider

    config = load_cluster(Path(config_path)).value
    provider = get_provider(config)
    if not (hasattr(provider, "ssh_settings") and hasattr(provider, "cached")):
        log(f"provider {config.provider} does not use SSH: no agent")
        return 0
    settings = provider.ssh_settings()
    pointer = {
        "config": config_path,
        "record": str(provider.state_dir() / "cluster.json"),
        "settings": settings_fingerprint(settings),
        "files": [str(path) for path in (settings.ssh_config, settings.known_hosts) if path is not None],
        "cache_seconds": float(getattr(provider, "CACHE_SECONDS", 600.0)),
    }
    wire.write_pointer(folder, key, pointer)
    identity = wire.identity_for(folder, key, pointer)
    cluster = provider.cached()
    if identity is None or cluster is None:
        log("the cluster is not remembered as READY: no agent")
        return 0
    from tpuft.providers.gcp.cache import worker_rows

    if worker_rows(cluster.workers) != identity.workers:
        log("the remembered workers changed while starting: no agent")
        return 0
    lock_fd = os.open(folder / f"{identity.agent}.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another agent of this identity is alive (or starting)
    agent = Agent(config_path, folder, identity, provider, cluster, config)
    agent.pointer = pointer
    # end cleanly: socket, connections
    signal.signal(signal.SIGTERM, lambda signum, frame: agent.stopping.set())
    try:
        agent.warm_up()
    except Exception as exc:  # noqa: BLE001 - no agent then; the cold path works as always
        log(f"cannot connect to the workers: {exc}")
        return 0
    path = identity.socket_path
    path.unlink(missing_ok=True)  # a stale socket of a dead agent (we hold the lock: no live one uses it)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, fd = wire.socket_address(path)
    old_umask = os.umask(0o177)
    try:
        server.bind(address)
    finally:
        os.umask(old_umask)
        if fd is not None:
            os.close(fd)
    server.listen(64)
    agent.socket_inode = os.lstat(path).st_ino
    log(f"serving {len(identity.workers)} worker(s) of {config_path} on {path.name}")
    try:
        agent.serve(server)
    finally:
        try:
            if os.lstat(path).st_ino == agent.socket_inode:
                path.unlink()
        except OSError:
            pass
        server.close()
        agent.stopping.set()
        with agent.lock:
            fleets, agent.idle_fleets = agent.idle_fleets, []
        for fleet in fleets:
            fleet.close()
        os.close(lock_fd)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tpuft.ops.agent", description="tpuft's per-cluster SSH agent"
    )
    parser.add_argument("--config", required=True, help="the cluster file (absolute path)")
    args = parser.parse_args(argv)
    try:
        code = start(os.path.abspath(args.config))
    except Exception as exc:  # noqa: BLE001 - the log is the only place anyone will look
        log(f"failed: {type(exc).__name__}: {exc}")
        code = 1
    sys.stdout.flush()
    os._exit(code)  # paramiko's transport threads must not keep a finished agent alive


if __name__ == "__main__":
    main()
