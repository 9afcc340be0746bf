"""The local fleet: each worker is a process (group) on this machine, with its folder as HOME.

Every worker runs in its own session (``start_new_session``), so stopping it stops everything it started. The
controller's own venv variables are not passed on: a worker must find its backend venv the way a TPU host would.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tpuft.fleet.base import EnvFor, FleetResult, LineSink, WorkerResult
from tpuft.providers.base import Worker

TAIL_LINES = 30
STOP_GRACE_SECONDS = 5.0
_CONTROLLER_ONLY_ENV = ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "__PYVENV_LAUNCHER__")


class LocalFleet:
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    def _select(self, indices: Sequence[int] | None) -> list[Worker]:
        if indices is None:
            return list(self.workers)
        by_index = {w.index: w for w in self.workers}
        return [by_index[i] for i in indices]

    def _base_env(self, worker: Worker) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _CONTROLLER_ONLY_ENV}
        path_parts = env.get("PATH", "").split(os.pathsep)
        venv = os.environ.get("VIRTUAL_ENV")
        if venv:  # drop the controller venv's bin dir too
            path_parts = [p for p in path_parts if not p.startswith(venv)]
        env["PATH"] = os.pathsep.join(path_parts)
        if worker.home is not None:
            env["HOME"] = str(worker.home)
        if worker.cpus:
            env["TPUFT_CPUS"] = ",".join(map(str, worker.cpus))
        return env

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
        chosen = self._select(workers)
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        running: list[_Running] = []
        restore = _raise_on_sigterm()
        try:
            for worker in chosen:
                worker_env = self._base_env(worker)
                if env is not None:
                    worker_env.update(env(worker))
                log_path = log_dir / f"worker-{worker.index}.log" if log_dir is not None else None
                running.append(
                    _Running.start(worker, list(argv), worker_env, log_path, on_line, cwd_home=cwd_home)
                )
            return _supervise(running, fail_fast)
        except KeyboardInterrupt:
            with _interrupts_ignored():  # a second Ctrl-C must not cut the clean-up short
                for item in running:
                    item.stop()
                for item in running:
                    item.finish()
            return FleetResult(results=[item.result() for item in running], interrupted=True)
        finally:
            restore()

    def put(self, source: Path, dest: str, *, workers: Sequence[int] | None = None) -> None:
        for worker in self._select(workers):
            base = worker.home if worker.home is not None else Path.home()
            target = Path(dest) if Path(dest).is_absolute() else base / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target)


class _Running:
    """One worker process, its reader thread and its log file."""

    def __init__(self, worker: Worker, proc: subprocess.Popen[bytes], log_path: Path | None) -> None:
        self.worker = worker
        self.proc = proc
        self.log_path = log_path
        self.started = time.monotonic()
        self.ended: float | None = None
        self.stopped_by_us = False
        self.stop_requested_at: float | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.reader: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        worker: Worker,
        argv: list[str],
        env: dict[str, str],
        log_path: Path | None,
        on_line: LineSink | None,
        *,
        cwd_home: bool,
    ) -> _Running:
        cwd = worker.home if cwd_home and worker.home is not None else None
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        item = cls(worker, proc, log_path)
        item.reader = threading.Thread(target=item._pump, args=(on_line,), daemon=True)
        item.reader.start()
        return item

    def _pump(self, on_line: LineSink | None) -> None:
        assert self.proc.stdout is not None
        log = open(self.log_path, "ab") if self.log_path is not None else None  # noqa: SIM115
        try:
            for raw in iter(self.proc.stdout.readline, b""):
                if log is not None:
                    log.write(raw)
                    log.flush()
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.tail.append(line)
                if on_line is not None:
                    on_line(self.worker.index, line)
        finally:
            if log is not None:
                log.close()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
            _kill_group(self.proc.pid, signal.SIGKILL)  # stragglers it left behind
        return code

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after a grace period."""
        if self.proc.poll() is not None:
            self.poll()
            return
        self.stopped_by_us = True
        self.stop_requested_at = time.monotonic()
        _kill_group(self.proc.pid, signal.SIGTERM)

    def escalate(self) -> None:
        """SIGKILL a group that ignored SIGTERM for longer than the grace period."""
        if self.stop_requested_at is not None and time.monotonic() - self.stop_requested_at > STOP_GRACE_SECONDS:
            _kill_group(self.proc.pid, signal.SIGKILL)

    def finish(self) -> None:
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.poll()
        if self.reader is not None:
            self.reader.join(timeout=5)

    def result(self) -> WorkerResult:
        code = self.proc.returncode
        end = self.ended if self.ended is not None else time.monotonic()
        return WorkerResult(
            index=self.worker.index,
            exit_code=None if self.stopped_by_us else code,
            seconds=end - self.started,
            tail=list(self.tail),
            log_path=self.log_path,
            pid=self.proc.pid,
        )


def _supervise(running: list[_Running], fail_fast: bool) -> FleetResult:
    first_failure: int | None = None
    while True:
        pending = [item for item in running if item.poll() is None]
        if fail_fast and first_failure is None:
            for item in running:
                code = item.proc.returncode
                if code is not None and code != 0 and not item.stopped_by_us:
                    first_failure = item.worker.index
                    break
            if first_failure is not None:
                for item in pending:
                    item.stop()
        if not pending:
            break
        for item in pending:
            item.escalate()
        time.sleep(0.05)
    for item in running:
        item.finish()
    return FleetResult(results=[item.result() for item in running], first_failure=first_failure)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def _interrupts_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_on_sigterm():  # type: ignore[no-untyped-def]
    """While workers run, treat SIGTERM like Ctrl-C so that killing tpuft never orphans worker processes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
