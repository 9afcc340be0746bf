"""A command on a worker over SSH: the shell line (process-group marker, the environment on stdin, the quoted
argv), the file copy's tar stream, and the running process that fail-fast and Ctrl-C stop as a whole group.

See :mod:`tpuft.fleet.ssh` for why the environment travels on stdin and the group is killed through a second
channel. The connections themselves are the fleet's: a process asks it for a session (``RemoteShell``).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tpuft.core.records import Worker
from tpuft.fleet.base import WorkerResult, check_env
from tpuft.fleet.supervise import Output

PGID_MARKER = "__TPUFT_PGID__"
STOP_GRACE_SECONDS = 5.0


class RemoteShell(Protocol):
    """What a remote process needs of the fleet: a fresh session on the worker's connection, and a short
    command (to signal its process group)."""

    def session(self, worker: Worker) -> Any: ...

    def exec_simple(self, worker: Worker, command: str, stdin: bytes | None = None) -> tuple[int, bytes]: ...


def remote_command(argv: Sequence[str], env: dict[str, str], *, cwd_home: bool = True) -> str:
    """The shell line sent to a worker: report the process-group id, go home, read the environment from stdin
    (see
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
    """``export K='V'`` lines for the remote shell's ``eval`` (names checked, values quoted, so nothing is
    read as shell); None when there is nothing to send."""
    check_env(env)
    if not env:
        return None
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()).encode()


def tar_payload(source: Path) -> bytes:
    import io
    import tarfile  # here, not at the top: a cold exec has no use for it (and its imports)

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if source.is_dir():
            for child in sorted(source.iterdir()):
                archive.add(child, arcname=child.name)
        else:
            archive.add(source, arcname=source.name)
    return buffer.getvalue()


class RemoteProcess:
    """One worker's command on its channel; stopping it kills the remote process group."""

    def __init__(
        self,
        fleet: RemoteShell,
        worker: Worker,
        command: str,
        output: Output,
        changed: threading.Event,
        stdin: bytes | None = None,
    ) -> None:
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
        self.channel = fleet.session(worker)
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
