"""The SSH fleet: run a command on every TPU-VM worker over SSH (paramiko), like ``gcloud ... ssh --worker=all``.

One connection per worker, opened in parallel (bounded) and kept for the fleet's life, so ``put`` then ``run`` then
``run`` again costs one handshake per worker. Connecting retries like gcloud does (a fresh VM's sshd may not be up
yet), and keep-alives stop idle NAT paths from dropping a long training run.

Each remote command starts in a fresh session (sshd calls setsid for every session), so the remote shell's pid is
the process-group id of everything the command starts. The command first prints that pid on a marker line; stopping
a worker (fail-fast, Ctrl-C) then kills the remote process group through a second channel: SIGTERM, then SIGKILL
after a grace period. Closing the connection alone would not stop a remote ``python`` that ignores SIGHUP.

Environment variables (the cluster file's ``worker_env``, tokens such as ``HF_TOKEN`` among them) travel on the
channel's stdin, never in the command line: a remote command line is visible to every user of the worker in ``ps``.
The command only says ``eval "$(cat)"``; the quoted ``export K=V`` lines follow on stdin, which is then closed. Stock
sshd does not accept arbitrary ``SetEnv`` names, so this is the channel that works everywhere.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.errors import TpuftError
from tpuft.fleet.base import EnvFor, FleetResult, LineSink, WorkerResult, check_env, select_workers
from tpuft.fleet.supervise import Handle, Output, run_supervised
from tpuft.records import Worker

PGID_MARKER = "__TPUFT_PGID__"
STOP_GRACE_SECONDS = 5.0


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
    """The cluster's pinned host keys (from the TPU API's guest attributes); None: no pinning (tests, benchmarks)."""


class SshConnectError(TpuftError):
    pass


class SshFleet:
    def __init__(self, workers: list[Worker], settings: SshSettings) -> None:
        self.workers = workers
        self.settings = settings
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._key: Any = None

    # -- connections ---------------------------------------------------------------------------------------
    def _load_key(self) -> Any:
        import paramiko

        if self._key is None:
            path = str(self.settings.key_file.expanduser())
            errors = []
            for kind in (paramiko.Ed25519Key, paramiko.RSAKey, paramiko.ECDSAKey):
                try:
                    self._key = kind.from_private_key_file(path)
                    break
                except (paramiko.SSHException, ValueError) as exc:
                    errors.append(str(exc))
                except FileNotFoundError:
                    raise SshConnectError(f"SSH key {path} does not exist") from None
            else:
                raise SshConnectError(f"cannot read SSH key {path}: {'; '.join(errors)}")
        return self._key

    def _client(self, worker: Worker) -> Any:
        with self._lock:
            client = self._clients.get(worker.index)
        if client is not None and client.get_transport() is not None and client.get_transport().is_active():
            return client
        client = self._connect(worker)
        with self._lock:
            self._clients[worker.index] = client
        return client

    def _connect(self, worker: Worker) -> Any:
        import paramiko

        settings = self.settings
        last: Exception | None = None
        for attempt in range(1, settings.connect_attempts + 1):
            client = paramiko.SSHClient()
            if settings.known_hosts is not None:  # only the keys the TPU API published for this node
                client.load_host_keys(str(settings.known_hosts))
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
            else:
                client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
            try:
                client.connect(
                    worker.address,
                    port=settings.port,
                    username=settings.user,
                    pkey=self._load_key(),
                    look_for_keys=False,
                    allow_agent=False,
                    timeout=settings.connect_timeout_s,
                    banner_timeout=settings.connect_timeout_s,
                    auth_timeout=settings.connect_timeout_s,
                )
                transport = client.get_transport()
                assert transport is not None
                transport.set_keepalive(settings.keepalive_s)
                return client
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise SshConnectError(
                    f"worker {worker.index} ({worker.address}:{settings.port}) presented a {exc.key.get_name()} host key "
                    f"{_fingerprint(exc.key)}, not the one pinned from the TPU API ({_fingerprint(exc.expected_key)}) in "
                    f"{settings.known_hosts}: refused, nothing was sent to it",
                    hint="If the node was recreated, `tpuft status` re-reads its keys from the API; if the node is the "
                    "same, something else answers on this address: do not connect, delete and recreate the node.",
                ) from None
            except paramiko.AuthenticationException as exc:
                client.close()
                raise SshConnectError(
                    f"worker {worker.index} ({settings.user}@{worker.address}:{settings.port}): SSH key "
                    f"{settings.key_file} was refused: {exc}"
                ) from None
            except (OSError, paramiko.SSHException) as exc:
                client.close()
                if settings.known_hosts is not None and "not found in known_hosts" in str(exc):
                    raise SshConnectError(
                        f"worker {worker.index} ({worker.address}:{settings.port}) has no host key pinned in "
                        f"{settings.known_hosts}: refused, nothing was sent to it",
                        hint="Re-read the node's keys from the TPU API: tpuft status (a node that has not published "
                        "them yet: wait a minute and retry)",
                    ) from None
                last = exc
                if attempt < settings.connect_attempts:
                    time.sleep(settings.retry_delay_s)
        raise SshConnectError(
            f"worker {worker.index} ({worker.address}:{settings.port}): cannot connect over SSH after "
            f"{settings.connect_attempts} attempts: {last}"
        )

    def connect_all(self, workers: Sequence[Worker]) -> None:
        """Handshake with every worker in parallel (bounded); raises for the first that cannot be reached."""
        with ThreadPoolExecutor(max_workers=min(len(workers), self.settings.max_parallel_connects) or 1) as pool:
            list(pool.map(self._client, workers))

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

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
        log_timestamps: bool = False,
    ) -> FleetResult:
        chosen = select_workers(self.workers, workers)
        self.connect_all(chosen)

        def start(handles: list[Handle], changed: threading.Event) -> None:
            for worker in chosen:
                worker_env = env(worker) if env is not None else {}
                command = remote_command(argv, worker_env, cwd_home=cwd_home)
                log_path = log_dir / f"worker-{worker.index}.log" if log_dir is not None else None
                output = Output(worker.index, log_path, on_line, timestamps=log_timestamps)
                handles.append(_RemoteProcess(self, worker, command, output, changed, env_payload(worker_env)))

        return run_supervised(start, fail_fast)

    def exec_simple(self, worker: Worker, command: str, stdin: bytes | None = None) -> tuple[int, bytes]:
        """Run a short command and return (exit code, combined output); for put and for killing process groups."""
        channel = self._client(worker).get_transport().open_session()
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
        payload = _tar(source)
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
                raise TpuftError(f"copying {source} to worker {worker.index}:{dest} failed (exit {code}): {text}")

        self.connect_all(chosen)
        with ThreadPoolExecutor(max_workers=min(len(chosen), self.settings.max_parallel_connects) or 1) as pool:
            list(pool.map(one, chosen))


def _fingerprint(key: Any) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` prints it, so a user can compare with what the VM's console says."""
    import base64
    import hashlib

    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def remote_command(argv: Sequence[str], env: dict[str, str], *, cwd_home: bool = True) -> str:
    """The shell line sent to a worker: report the process-group id, go home, read the environment from stdin (see
    :func:`env_payload`), then exec the quoted argv. No value of ``env`` is in it: only its presence."""
    check_env(env)
    parts = [f"echo {PGID_MARKER} $$"]
    if cwd_home:
        parts.append('cd "$HOME"')
    if env:
        parts.append('eval "$(cat)"')  # builtins only: the values never become any process's argv
    parts.append(f"exec {shlex.join(argv)}")
    return " && ".join(parts)


def env_payload(env: dict[str, str]) -> bytes | None:
    """``export K='V'`` lines for the remote shell's ``eval`` (names checked, values quoted, so nothing is read as
    shell); None when there is nothing to send."""
    check_env(env)
    if not env:
        return None
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()).encode()


def _tar(source: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if source.is_dir():
            for child in sorted(source.iterdir()):
                archive.add(child, arcname=child.name)
        else:
            archive.add(source, arcname=source.name)
    return buffer.getvalue()


class _RemoteProcess:
    """One worker's command on its channel; stopping it kills the remote process group."""

    def __init__(self, fleet: SshFleet, worker: Worker, command: str, output: Output, changed: threading.Event,
                 stdin: bytes | None = None) -> None:
        self.fleet = fleet
        self.changed = changed
        self.worker = worker
        self.index = worker.index
        self.output = output
        self.started = time.monotonic()
        self.ended: float | None = None
        self.exit_code: int | None = None
        self.pgid: int | None = None
        self.pgid_seen = threading.Event()
        self.stopped_by_us = False
        self.stop_requested_at: float | None = None
        self.killed = False
        self.channel = fleet._client(worker).get_transport().open_session()
        self.channel.set_combine_stderr(True)
        self.channel.exec_command(command)
        if stdin is not None:
            self.channel.sendall(stdin)
        self.channel.shutdown_write()
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        stream = self.channel.makefile("rb")
        try:
            for raw in stream:
                if self.pgid is None and raw.startswith(PGID_MARKER.encode()):
                    try:
                        self.pgid = int(raw.split()[1])
                    except (IndexError, ValueError):
                        pass
                    self.pgid_seen.set()
                    continue
                self.output.feed(raw)
        except OSError:
            pass
        finally:
            self.pgid_seen.set()
            code = self.channel.recv_exit_status()
            self.exit_code = code if code >= 0 else 255
            self.ended = time.monotonic()
            self.changed.set()

    def poll(self) -> int | None:
        return self.exit_code if self.ended is not None else None

    def _signal_group(self, signal_name: str) -> None:
        self.pgid_seen.wait(timeout=STOP_GRACE_SECONDS)
        if self.pgid is None:
            return
        try:
            self.fleet.exec_simple(self.worker, f"kill -{signal_name} -- -{self.pgid} 2>/dev/null; true")
        except Exception:  # noqa: BLE001 - the worker may already be unreachable; nothing more to do
            pass

    def stop(self) -> None:
        if self.poll() is not None or self.stopped_by_us:
            return
        self.stopped_by_us = True
        self.stop_requested_at = time.monotonic()
        threading.Thread(target=self._signal_group, args=("TERM",), daemon=True).start()

    def escalate(self) -> None:
        if (
            not self.killed
            and self.stop_requested_at is not None
            and time.monotonic() - self.stop_requested_at > STOP_GRACE_SECONDS
        ):
            self.killed = True
            threading.Thread(target=self._signal_group, args=("KILL",), daemon=True).start()

    def finish(self) -> None:
        deadline = time.monotonic() + 2 * STOP_GRACE_SECONDS
        while self.poll() is None and time.monotonic() < deadline:
            if self.stopped_by_us:
                self.escalate()
            time.sleep(0.05)
        if self.poll() is None:
            self._signal_group("KILL")
            self.channel.close()
        self.reader.join(timeout=5)
        self.output.close()

    def result(self) -> WorkerResult:
        end = self.ended if self.ended is not None else time.monotonic()
        return WorkerResult(
            index=self.index,
            exit_code=None if self.stopped_by_us else self.exit_code,
            seconds=end - self.started,
            tail=list(self.output.tail),
            log_path=self.output.log_path,
            pid=self.pgid,
        )
