"""The local fleet: each worker is a process (group) on this machine, with its folder as HOME.

Every worker runs in its own session (``start_new_session``), so stopping it stops everything it started. The
controller's own venv variables are not passed on: a worker must find its backend venv the way a TPU host
would.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tpuft.core.errors import TpuftError
from tpuft.core.records import Worker
from tpuft.fleet.base import EnvFor, FleetResult, LineSink, WorkerResult, check_env, select_workers
from tpuft.fleet.supervise import Handle, Output, run_supervised

STOP_GRACE_SECONDS = 5.0
_CONTROLLER_ONLY_ENV = ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "__PYVENV_LAUNCHER__")


class LocalFleet:
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

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
        chosen = select_workers(self.workers, workers)

        def start(handles: list[Handle], changed: threading.Event) -> None:
            for worker in chosen:
                worker_env = self._base_env(worker)
                if env is not None:
                    worker_env.update(check_env(env(worker), worker.index))
                log_path = log_dir / f"worker-{worker.index}.log" if log_dir is not None else None
                cwd = worker.home if cwd_home and worker.home is not None else None
                output = Output(worker.index, log_path, on_line)
                _Process(worker, list(argv), worker_env, cwd, output, changed, handles.append)

        return run_supervised(start, fail_fast)

    def put(self, source: Path, dest: str, *, workers: Sequence[int] | None = None) -> None:
        for worker in select_workers(self.workers, workers):
            base = worker.home if worker.home is not None else Path.home()
            target = Path(dest) if Path(dest).is_absolute() else base / dest
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy2(source, target)


class _Process:
    """One worker process group, its reader thread and its log."""

    def __init__(
        self,
        worker: Worker,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | None,
        output: Output,
        changed: threading.Event,
        register: Callable[[_Process], None],
    ) -> None:
        """``register`` (the supervisor's list of handles) hears of the process the moment it exists: a Ctrl-C
        landing while its reader thread starts (a while, on a loaded machine) must still stop it with the
        others."""
        self.index = worker.index
        self.changed = changed
        self.output = output
        self.started = time.monotonic()
        self.ended: float | None = None
        self.stopped_by_us = False
        self.stop_requested_at: float | None = None
        self.reader: threading.Thread | None = None
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:  # what a remote shell would report as exit 126/127
            output.close()
            raise TpuftError(
                f"worker {worker.index}: cannot start {argv[0]}: {exc.strerror or exc}"
            ) from None
        register(self)
        reader = threading.Thread(target=self._pump, daemon=True)
        reader.start()
        self.reader = reader  # only once started: a thread cut off before it started cannot be joined

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.output.feed(raw)
        self.proc.wait()
        self.changed.set()

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
            _kill_group(self.proc.pid, signal.SIGKILL)  # stragglers it left behind
        return code

    def stop(self) -> None:
        if self.proc.poll() is not None:
            self.poll()
            return
        self.stopped_by_us = True
        self.stop_requested_at = time.monotonic()
        _kill_group(self.proc.pid, signal.SIGTERM)

    def escalate(self) -> None:
        if (
            self.stop_requested_at is not None
            and time.monotonic() - self.stop_requested_at > STOP_GRACE_SECONDS
        ):
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
        self.output.close()

    def result(self) -> WorkerResult:
        end = self.ended if self.ended is not None else time.monotonic()
        return WorkerResult(
            index=self.index,
            exit_code=None if self.stopped_by_us else self.proc.returncode,
            seconds=end - self.started,
            tail=list(self.output.tail),
            log_path=self.output.log_path,
            pid=self.proc.pid,
        )


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
