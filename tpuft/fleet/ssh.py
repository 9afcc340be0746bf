"""The SSH fleet: run a command on every TPU-VM worker over SSH (Fabric over paramiko), like ``gcloud ... ssh
--worker=all``.

Each worker's connection is a ``fabric.Connection``, so the user's ~/.ssh/config applies as ssh would apply
it: a ``Host`` block's ``User``, ``Port``, ``IdentityFile``, ``HostName``, ``ProxyJump`` (through one shared
bastion connection) and ``ProxyCommand``. What the cluster file sets explicitly (``SshSettings.explicit``)
wins over it; the cluster file's defaults lose to it. A worker the file says nothing about is connected
without Fabric, with the same values (:mod:`tpuft.fleet.ssh_direct`: Fabric and invoke cost a cold exec a
quarter of its time). Only the connection set-up goes through Fabric: commands run on raw paramiko
channels (``connection.client.get_transport().open_session()``), because the PGID marker, streaming and remote
kill below need the channel itself, which Fabric's ``run`` hides.

One connection per worker, opened in parallel (bounded) and kept for the fleet's life, so ``put`` then ``run``
then ``run`` again costs one handshake per worker. Connecting retries like gcloud does (a fresh VM's sshd may
not be up yet), and keep-alives stop idle NAT paths from dropping a long training run.

Each remote command starts in a fresh session (sshd calls setsid for every session), so the remote shell's pid
is the process-group id of everything the command starts. The command first prints that pid on a marker line;
stopping a worker (fail-fast, Ctrl-C) then kills the remote process group through a second channel: SIGTERM,
then SIGKILL after a grace period. Closing the connection alone would not stop a remote ``python`` that
ignores SIGHUP.

Environment variables (the cluster file's ``worker_env``, tokens such as ``HF_TOKEN`` among them) travel on
the channel's stdin, never in the command line: a remote command line is visible to every user of the worker
in ``ps``. The command only says ``eval "$(cat)"``; the quoted ``export K=V`` lines follow on stdin, which is
then closed. Stock sshd does not accept arbitrary ``SetEnv`` names, so this is the channel that works
everywhere. ``$(cat)`` rather than bash's ``read -d ''``: the remote line runs in the user's login shell,
which need not be bash; ``cat`` gets no arguments, ``eval`` and ``export`` are builtins, so no value ever
becomes a process's argv.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError
from tpuft.core.records import Worker
from tpuft.core.waiting import waiting
from tpuft.fleet.base import EnvFor, FleetResult, LineSink, select_workers
from tpuft.fleet.pacing import HandshakeGate, ensure_descriptors, quiet_handshake_tracebacks, retry_delay
from tpuft.fleet.ssh_config import (
    SshConnectError,
    SshSettings,
    fingerprint,
    known_hosts_name,
    nodelay_socket,
    prepare_bastion,
    proxy_command_class,
    set_nodelay,
    worker_ssh_config_class,
)
from tpuft.fleet.ssh_direct import DirectConnection, enable_match_exec, import_paramiko, lookup, needs_fabric
from tpuft.fleet.ssh_progress import Retries, unreachable
from tpuft.fleet.ssh_remote import RemoteProcess, env_payload, remote_command, tar_payload
from tpuft.fleet.supervise import Handle, Output, run_supervised

__all__ = ["SshConnectError", "SshFleet", "SshSettings", "known_hosts_name"]


class SshFleet:
    def __init__(self, workers: list[Worker], settings: SshSettings) -> None:
        self.workers = workers
        self.settings = settings
        self._clients: dict[int, Any] = {}
        self._connections: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._key_files: dict[int, Path] = {}
        self._fabric_config: Any = None
        self._parsed: Any = None
        self._pins: Any = None
        self._gateways: dict[str, tuple[Any, threading.Lock]] = {}
        self._pacer = HandshakeGate()
        self._called_off = threading.Event()
        """Set by :meth:`close` for the connection attempts under way then: a watcher that learned the node is
        gone must not wait out ``connect_attempts`` x ``retry_delay_s`` of tries to it first."""

    # -- connections ---------------------------------------------------------------------------------------
    def _load_key(self, key_file: Path) -> Any:
        """The private key at ``key_file``, read once per fleet (64 workers share one parse)."""
        import paramiko

        path = str(key_file.expanduser())
        with self._lock:
            if path in self._keys:
                return self._keys[path]
        errors = []
        for kind in (paramiko.Ed25519Key, paramiko.RSAKey, paramiko.ECDSAKey):
            try:
                key = kind.from_private_key_file(path)
                break
            except (paramiko.SSHException, ValueError) as exc:
                errors.append(str(exc))
            except FileNotFoundError:
                raise SshConnectError(f"SSH key {path} does not exist") from None
        else:
            raise SshConnectError(f"cannot read SSH key {path}: {'; '.join(errors)}")
        with self._lock:
            self._keys[path] = key
        return key

    def _config(self) -> Any:
        """One Fabric config per fleet: the ssh_config file parsed once. Its fallbacks are ssh's own (local
        user name, port 22), which is what a ProxyJump host gets; workers get the cluster file's (see
        ``_connection``). ``lazy`` and an explicit SSHConfig object keep Fabric from reading anything else
        (/etc/fabric.yaml, ~/.fabric.yaml, /etc/ssh/ssh_config): one documented source."""
        import fabric

        enable_match_exec()
        parsed = self._ssh_config()
        with self._lock:
            if self._fabric_config is None:
                settings = self.settings
                self._fabric_config = fabric.Config(
                    ssh_config=parsed,
                    lazy=True,
                    overrides={
                        "timeouts": {"connect": settings.connect_timeout_s},
                        "load_ssh_configs": False,
                    },
                )
            return self._fabric_config

    def _ssh_config(self) -> Any:
        """The ssh_config file, parsed once per fleet (without Fabric: see :mod:`tpuft.fleet.ssh_direct`)."""
        paramiko = import_paramiko()
        with self._lock:
            if self._parsed is None:
                settings = self.settings
                parsed = worker_ssh_config_class()()
                if settings.ssh_config is not None:
                    path = settings.ssh_config.expanduser()
                    try:
                        parsed = worker_ssh_config_class().from_path(str(path))
                    except FileNotFoundError:
                        pass
                    except (OSError, ValueError, paramiko.SSHException) as exc:
                        raise SshConnectError(
                            f"cannot read the SSH client config {path}: {exc}",
                            hint="Fix the file, or set ssh.ssh_config: null in the cluster file to ignore "
                            "it.",
                        ) from None
                explicit = {
                    name: getattr(settings, name) for name in ("port", "user") if name in settings.explicit
                }
                parsed.worker_tokens = ({w.address for w in self.workers}, explicit)
                self._parsed = parsed
            return self._parsed

    def _pinned(self) -> Any:
        """The cluster's pinned known_hosts, read once per fleet; a missing file pins nothing (every worker is
        then refused as unknown, never accepted)."""
        import paramiko

        with self._lock:
            if self._pins is None:
                pins = paramiko.HostKeys()
                assert self.settings.known_hosts is not None
                try:
                    pins.load(str(self.settings.known_hosts.expanduser()))
                except FileNotFoundError:
                    pass
                self._pins = pins
            return self._pins

    def _client(self, worker: Worker, retries: Retries | None = None) -> Any:
        with self._lock:
            client = self._clients.get(worker.index)
        if client is not None and client.get_transport() is not None and client.get_transport().is_active():
            return client
        client = self._connect(worker, retries)
        with self._lock:
            self._clients[worker.index] = client
        return client

    def _connection(self, worker: Worker) -> Any:
        """A Fabric connection to ``worker`` (not yet open): ssh_config's ``Host`` block for its address
        applies, except what the cluster file set explicitly; our own key, host-key policy and a shared
        bastion. A worker the file says nothing about gets a plain paramiko connection with the same values
        (:mod:`.ssh_direct`)."""
        paramiko = import_paramiko()
        settings = self.settings
        says = lookup(self._ssh_config(), worker.address)
        if not needs_fabric(says, worker.address):
            connection: Any = DirectConnection(
                worker.address, settings.user, settings.port, settings.connect_timeout_s, says
            )
        else:
            connection = self._fabric_connection(worker)
        key_file = settings.key_file
        if (
            "key_file" not in settings.explicit
        ):  # the Host block's IdentityFile: the first that exists, as ssh skips
            found = [Path(name).expanduser() for name in connection.ssh_config.get("identityfile") or []]
            key_file = next((path for path in found if path.is_file()), found[0] if found else key_file)
        with self._lock:
            self._key_files[worker.index] = key_file
        # replaces Fabric's merged key_filename list: one key, no agent, no guessing
        connection.connect_kwargs = {
            "pkey": self._load_key(key_file),
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": settings.connect_timeout_s,
            "auth_timeout": settings.connect_timeout_s,
        }
        client = connection.client
        if settings.known_hosts is not None:  # only the keys the TPU API published for this node
            name = known_hosts_name(connection.host, int(connection.port))
            pinned = self._pinned()
            for lookup_name in (known_hosts_name(worker.address, settings.port), worker.address, name):
                found_keys = pinned.lookup(lookup_name)
                if found_keys:  # pinned by the worker's address, checked under the name paramiko will look up
                    for kind in found_keys.keys():
                        client.get_host_keys().add(name, kind, found_keys[kind])
                    break
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        if connection.gateway is not None and not isinstance(
            connection.gateway, str
        ):  # a ProxyJump Connection
            connection.gateway = self._shared_gateway(connection)
        elif isinstance(connection.gateway, str):  # ProxyCommand, its %p/%r expanded as for this connection
            command = connection.gateway = says.get("proxycommand", connection.gateway)
            connection.open_gateway = lambda: proxy_command_class()(command)  # not paramiko's: see there
        return connection

    def _fabric_connection(self, worker: Worker) -> Any:
        """What a Host block says for the worker applies through Fabric, as ssh would apply it."""
        import fabric

        settings = self.settings
        config = self._config()
        # A Connection writes into its config (``inline_ssh_env``), and invoke rebuilds the whole config on a
        # write: shared between threads, another worker's connection would read it half-built. Each gets its
        # own clone (0.5 ms), made one at a time.
        with self._build_lock:
            # what ~/.ssh/config says for this worker (the clone below has a plain paramiko SSHConfig: this
            # one expands %p and %r as the connection will use them)
            says = config.base_ssh_config.lookup(worker.address)
            connection = fabric.Connection(
                worker.address,
                user=settings.user if "user" in settings.explicit or "user" not in says else None,
                port=settings.port if "port" in settings.explicit or "port" not in says else None,
                config=config.clone(),
            )
        return connection

    def _shared_gateway(self, connection: Any) -> Any:
        """One bastion connection for every worker behind the same ``ProxyJump`` (ssh opens one per worker;
        one handshake instead of 64), its host key checked as ssh would (see :func:`prepare_bastion`)."""
        jump = str(connection.ssh_config.get("proxyjump"))
        with self._lock:
            shared = self._gateways.get(jump)
            if shared is None:
                hop = connection.gateway
                while hop is not None and not isinstance(hop, str):
                    prepare_bastion(hop)
                    hop = hop.gateway
                shared = self._gateways[jump] = (connection.gateway, threading.Lock())
        return shared[0]

    def _open_gateway(self, worker: Worker, connection: Any) -> None:
        """Open the shared bastion once (under its lock: Fabric's ``open`` is not safe to race); a bastion
        that is not who ~/.ssh/known_hosts says is refused, never retried."""
        import paramiko

        entry = self._gateways.get(str(connection.ssh_config.get("proxyjump")))
        if entry is None:
            return
        gateway, lock = entry
        with lock:
            if gateway.is_connected:
                return
            try:
                gateway.open()
            except paramiko.BadHostKeyException as exc:
                raise SshConnectError(
                    f"the ProxyJump host {gateway.host}:{gateway.port} (on the way to "
                    f"worker {worker.index}, {worker.address}) presented a {exc.key.get_name()} host "
                    f"key {fingerprint(exc.key)}, not the one in your known_hosts "
                    f"({fingerprint(exc.expected_key)}): refused, nothing was sent through it",
                    hint="If the bastion was rebuilt, check its new key out of band, then: ssh-keygen -R "
                    f"{known_hosts_name(gateway.host, int(gateway.port))} and ssh {gateway.host} once.",
                ) from None
            except paramiko.AuthenticationException as exc:
                raise SshConnectError(
                    f"the ProxyJump host {gateway.user}@{gateway.host}:{gateway.port} refused the login: "
                    f"{exc}",
                    hint="Check its User and IdentityFile in your ~/.ssh/config (ssh -J works with the same "
                    "file).",
                ) from None
            except paramiko.SSHException as exc:
                if "not found in known_hosts" not in str(exc):
                    raise
                raise SshConnectError(
                    f"the ProxyJump host {gateway.host}:{gateway.port} is not in your known_hosts: "
                    "refused, as ssh does in batch mode",
                    hint=f"Connect once with ssh {gateway.host} and check the key it shows, or set "
                    "StrictHostKeyChecking accept-new for it in ~/.ssh/config.",
                ) from None
            transport = gateway.client.get_transport()
            if transport is not None:
                transport.set_keepalive(self.settings.keepalive_s)
                set_nodelay(transport.sock)  # every worker's handshake goes through it

    def _connect(self, worker: Worker, retries: Retries | None = None) -> Any:
        paramiko = import_paramiko()

        settings = self.settings
        last: Exception | None = None
        where = f"{worker.address}:{settings.port}"
        with self._lock:
            called_off = self._called_off
        for attempt in range(1, settings.connect_attempts + 1):
            if called_off.is_set():
                raise SshConnectError(
                    f"worker {worker.index} ({where}): connecting was called off (the connections "
                    f"were closed) after {attempt - 1} attempt(s): {last}"
                )
            connection = self._connection(worker)
            where = f"{connection.host}:{connection.port}"
            try:
                self._open_gateway(worker, connection)
                with self._pacer.handshake(where):
                    if (
                        not connection.gateway
                    ):  # our own socket, so that it says TCP_NODELAY (see set_nodelay)
                        connection.connect_kwargs["sock"] = nodelay_socket(
                            connection.host,
                            int(connection.port),
                            connection.connect_timeout or settings.connect_timeout_s,
                        )
                    connection.open()
                client = connection.client
                transport = client.get_transport()
                assert transport is not None
                transport.set_keepalive(settings.keepalive_s)
                with self._lock:
                    self._connections[worker.index] = connection
                if retries is not None:
                    retries.connected(worker.index)
                return client
            except paramiko.BadHostKeyException as exc:
                connection.close()
                raise SshConnectError(
                    f"worker {worker.index} ({worker.address}, reached at {where}) presented "
                    f"a {exc.key.get_name()} host key {fingerprint(exc.key)}, not the one pinned from the "
                    f"TPU API ({exc.expected_key.get_name()} {fingerprint(exc.expected_key)}) "
                    f"in {settings.known_hosts}: refused, nothing was sent to it",
                    hint="The node was recreated or someone else answers on this address: run `tpuft status` "
                    "to "
                    "refresh the keys from the API; if the node is the same, delete and recreate it.",
                ) from None
            except paramiko.AuthenticationException as exc:
                connection.close()
                raise SshConnectError(
                    f"worker {worker.index} ({connection.user}@{where}): SSH key "
                    f"{self._key_files.get(worker.index)} was refused: {exc}"
                ) from None
            except (OSError, paramiko.SSHException) as exc:
                connection.close()
                if settings.known_hosts is not None and "not found in known_hosts" in str(exc):
                    raise SshConnectError(
                        f"worker {worker.index} ({worker.address}, reached at {where}) has no host "
                        f"key pinned in {settings.known_hosts}: refused, nothing was sent to it",
                        hint="Refresh the keys from the TPU API: tpuft status (a node that has not published "
                        "them "
                        "yet: wait a minute and retry); if the node is the same, delete and recreate it.",
                    ) from None
                last = exc
                if attempt < settings.connect_attempts:
                    if retries is not None:
                        why = (str(exc).splitlines() or [type(exc).__name__])[0][:100]
                        retries.failed(
                            worker.index, f"attempt {attempt} of {settings.connect_attempts}: {why}"
                        )
                    called_off.wait(retry_delay(exc, attempt, settings.retry_delay_s))
        raise SshConnectError(
            f"worker {worker.index} ({where}): cannot connect over SSH after "
            f"{settings.connect_attempts} attempts: {last}"
        )

    def connect_all(self, workers: Sequence[Worker]) -> None:
        """Handshake with every worker in parallel, paced (:mod:`tpuft.fleet.pacing`: bounded in all and per
        server, refusals retried soon). A worker that cannot be reached holds nobody: the others connect
        meanwhile, and once every worker has had its tries, one error names each that failed. Past a couple of
        seconds the handshakes say on stderr whom they wait for (a fresh VM's sshd may take a minute)."""
        settings = self.settings
        with self._lock:  # connected already (a caller that connects first, then runs): nothing to wait for
            workers = [worker for worker in workers if not _live(self._clients.get(worker.index))]
        if not workers:
            return
        ensure_descriptors(len(self.workers))
        quiet_handshake_tracebacks()
        bound = settings.connect_attempts * (settings.connect_timeout_s + settings.retry_delay_s)
        what = f"SSH on {len(workers)} workers to answer"
        if len(workers) == 1:
            what = f"SSH on worker {workers[0].index} ({workers[0].address}:{settings.port}) to answer"
        failures: dict[int, SshConnectError] = {}

        def connect(worker: Worker) -> None:
            try:
                self._client(worker, retries)
            except SshConnectError as exc:
                failures[worker.index] = exc

        with waiting(what, bound) as wait:
            retries = Retries(wait, len(workers))
            if len(workers) == 1:  # in this thread: a pool's hand-off costs a lone cold exec ~30 ms
                connect(workers[0])
            else:
                with ThreadPoolExecutor(
                    max_workers=min(len(workers), settings.max_parallel_connects)
                ) as pool:
                    list(pool.map(connect, workers))
        if failures:
            raise unreachable(failures, len(workers))

    def close(self) -> None:
        """Close every connection, and call off the attempts to connect under way (later ones start
        afresh)."""
        with self._lock:
            called_off, self._called_off = self._called_off, threading.Event()
            clients, self._clients = list(self._clients.values()), {}
            self._connections = {}
            gateways, self._gateways = [gateway for gateway, _ in self._gateways.values()], {}
        called_off.set()
        for client in clients:
            client.close()
        for gateway in gateways:
            gateway.close()

    # -- run -----------------------------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        env: EnvFor | None = None,
        workers: Sequence[int] | None = None,
        log_dir: Path | None = None,
        on_line: LineSink | None = None,
        fail_fast: bool = True,
        cwd_home: bool = True,
    ) -> FleetResult:
        chosen = select_workers(self.workers, workers)
        self.connect_all(chosen)

        def start(handles: list[Handle], changed: threading.Event) -> None:
            import paramiko

            for worker in chosen:
                worker_env = env(worker) if env is not None else {}
                command = remote_command(argv, worker_env, cwd_home=cwd_home)
                log_path = log_dir / f"worker-{worker.index}.log" if log_dir is not None else None
                output = Output(worker.index, log_path, on_line)
                try:
                    handles.append(
                        RemoteProcess(self, worker, command, output, changed, env_payload(worker_env))
                    )
                except (OSError, EOFError, paramiko.SSHException) as exc:  # the channel died as it was opened
                    raise SshConnectError(
                        f"worker {worker.index} ({worker.address}): the connection closed while "
                        f"starting the command: {exc or type(exc).__name__}"
                    ) from None

        return run_supervised(start, fail_fast)

    def session(self, worker: Worker) -> Any:
        """A new channel on the worker's connection (connecting first if need be): one per command. A
        connection that goes away meanwhile (its VM gone, or :meth:`close` from another thread: a recovery
        watcher that has its answer) is a connection error like any other, so that the callers' handling of
        one applies."""
        import paramiko

        transport = self._client(worker).get_transport()
        try:
            if transport is None:
                raise EOFError("the connection was closed")
            return transport.open_session()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SshConnectError(
                f"worker {worker.index} ({worker.address}): cannot open a channel: "
                f"{exc or type(exc).__name__}"
            ) from None

    def exec_simple(self, worker: Worker, command: str, stdin: bytes | None = None) -> tuple[int, bytes]:
        """Run a short command and return (exit code, combined output); for put and for killing process
        groups."""
        channel = self.session(worker)
        try:
            channel.set_combine_stderr(True)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            chunks = []
            while True:
                data = channel.recv(65536)
                if not data:
                    break
                chunks.append(data)
            return channel.recv_exit_status(), b"".join(chunks)
        finally:
            channel.close()

    # -- put -----------------------------------------------------------------------------------------------
    def put(self, source: Path, dest: str, *, workers: Sequence[int] | None = None) -> None:
        """Copy a file or a folder to every chosen worker in parallel, as one tar stream per worker."""
        chosen = select_workers(self.workers, workers)
        payload = tar_payload(source)
        quoted = shlex.quote(dest)
        if source.is_dir():
            command = f"mkdir -p {quoted} && tar -x -m -C {quoted} -f -"
        else:
            parent = shlex.quote(str(Path(dest).parent))
            command = f"mkdir -p {parent} && tar -x -m -O -f - > {quoted}"

        def one(worker: Worker) -> None:
            code, output = self.exec_simple(worker, command, payload)
            if code != 0:
                text = output.decode("utf-8", "replace").strip()
                raise TpuftError(
                    f"copying {source} to worker {worker.index}:{dest} failed (exit {code}): {text}"
                )

        self.connect_all(chosen)
        with ThreadPoolExecutor(
            max_workers=min(len(chosen), self.settings.max_parallel_connects) or 1
        ) as pool:
            list(pool.map(one, chosen))


def _live(client: Any) -> bool:
    transport = client.get_transport() if client is not None else None
    return transport is not None and transport.is_active()
