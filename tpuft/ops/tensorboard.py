"""tensorboard: serve a run's TensorBoard events on this machine, for a local run dir or a ``gs://`` one.

TensorBoard runs as a child process (``python -m tensorboard.main``) so that the CLI imports none of it. A
bucket run's ``tb/`` is mirrored into the run's local mirror (``tpuft.readers.runs.Run.mirror``; only new or
changed files move, see ``storage.download_tree``) and re-synced every 30 s on a daemon thread while
TensorBoard runs. The mirror replaces a grown event file by renaming a complete copy over it. TensorBoard
without TensorFlow re-opens files by name and sees that anyway, but with TensorFlow installed (a T5X backend
venv's TensorBoard) it keeps reading the old, unlinked file, so it is started with
``--detect_file_replacement``. That flag works in its Python loader only, hence ``--load_fast=false`` (T5X and
tpuft logs are small; the Rust data server would buy nothing and add a second process to stop).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError, UsageError
from tpuft.core.paths import tpuft_home, venv_cache
from tpuft.core.ports import free_port
from tpuft.run import rundir

SYNC_SECONDS = 30.0
"""How often a bucket run's ``tb/`` is mirrored again while TensorBoard runs."""
READY_TIMEOUT_SECONDS = 60.0
"""How long TensorBoard may take to answer ``/data/runs`` (its first import and the first load of the
logdir)."""
STDERR_TAIL_LINES = 20
INSTALL_HINT = (
    "Install it where tpuft runs: pip install 'tensorboard>=2.15' (a dependency of tpuft; an "
    "install with --no-deps skips it)"
)


@dataclass(eq=False)
class TensorBoardHandle:
    """A running TensorBoard. ``stop()`` (or leaving ``with``) ends it and the bucket sync."""

    url: str
    """``http://host:port/``; ``0.0.0.0`` / ``::`` binds are shown as the loopback address."""
    process: subprocess.Popen[bytes]
    logdir: Path
    """What TensorBoard reads: the run's ``tb/``, or its local mirror for a ``gs://`` run."""
    source: str
    """The run as given: a local path or the ``gs://`` run URL."""
    log_path: Path
    """TensorBoard's own stdout and stderr."""
    syncs: int = 0
    """Completed re-syncs of a bucket run's mirror (the first download before start not counted)."""
    sync_error: str | None = None
    """The last re-sync's failure, cleared by the next success; the sync keeps trying."""
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the sync thread and TensorBoard (SIGTERM, then SIGKILL after ``timeout`` s). Safe to call
        twice."""
        self._stop.set()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def __enter__(self) -> TensorBoardHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_tensorboard(
    run: Path | str,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    sync_interval_s: float = SYNC_SECONDS,
    ready_timeout_s: float = READY_TIMEOUT_SECONDS,
) -> TensorBoardHandle:
    """Start TensorBoard on ``run``'s events (``port`` 0: a free one) and return once it answers HTTP.

    Raises :class:`UsageError` when the run has no ``tb/`` or no ``tensorboard`` can be found, and
    :class:`TpuftError` (with the tail of its output) when TensorBoard exits or does not answer in time."""
    from tpuft.readers.runs import Run

    command = tensorboard_command()
    reference = Run.from_url(run)
    remote = reference.remote
    store: Any = None
    if remote:
        logdir = reference.mirror / rundir.TB_DIR  # the run's one local mirror, shared with monitor and train
        store = reference.storage
        store.download_tree(rundir.TB_DIR, logdir)
    else:
        logdir = local_logdir(reference.mirror)
    chosen = port or free_port(host)
    log_path = tpuft_home() / "cache" / "tb" / f"tensorboard-{chosen}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    flags = ["--logdir", str(logdir), "--host", host, "--port", str(chosen), "--load_fast=false"]
    if remote:
        flags.append("--detect_file_replacement=true")
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*command, *flags], stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
    handle = TensorBoardHandle(_url(host, chosen), process, logdir, str(run), log_path)
    try:
        _wait_ready(handle, ready_timeout_s)
    except BaseException:
        handle.stop(timeout=5)
        raise
    if store is not None:
        handle._thread = threading.Thread(
            target=_sync_loop, args=(handle, store, sync_interval_s), name="tpuft-tb-sync", daemon=True
        )
        handle._thread.start()
    return handle


def local_logdir(run_dir: Path) -> Path:
    """A local run dir -> its ``tb/`` (a ``tb/`` folder itself is accepted too)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run dir")
    events = run_dir / rundir.TB_DIR
    if events.is_dir():
        return events
    if run_dir.name == rundir.TB_DIR:
        return run_dir
    raise UsageError(
        f"{run_dir} has no TensorBoard events ({events} does not exist)",
        hint="The run has not logged a step yet, or it was started without TensorBoard in its backend venv.",
    )


def tensorboard_command() -> list[str]:
    """This Python's TensorBoard when it has one; else the newest cached backend venv's; else a UsageError."""
    if importlib.util.find_spec("tensorboard") is not None:
        return [sys.executable, "-m", "tensorboard.main"]
    found = [p for p in venv_cache().glob("*/bin/tensorboard") if p.is_file() and os.access(p, os.X_OK)]
    if found:
        return [str(max(found, key=lambda p: (p.stat().st_mtime, p.as_posix())))]
    raise UsageError(
        f"TensorBoard is not installed in {sys.executable}'s environment nor in a backend venv",
        hint=INSTALL_HINT,
    )


def _url(host: str, port: int) -> str:
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def _wait_ready(handle: TensorBoardHandle, timeout_s: float) -> None:
    """Poll ``/data/runs`` until it answers 200; fail early if TensorBoard exits."""
    deadline = time.monotonic() + timeout_s
    probe = handle.url + "data/runs"
    while True:
        code = handle.process.poll()
        if code is not None:
            raise TpuftError(
                f"TensorBoard exited with code {code} before serving {handle.url}",
                hint=_tail(handle.log_path),
            )
        try:
            with urllib.request.urlopen(probe, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TpuftError(
                f"TensorBoard did not answer {probe} within {timeout_s:.0f} s", hint=_tail(handle.log_path)
            )
        time.sleep(0.25)


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        text = path.read_bytes()[-16384:].decode("utf-8", errors="replace")
    except OSError:
        return f"(no output: {path} is unreadable)"
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return (
        f"TensorBoard's last output ({path}):\n" + "\n".join("  " + line for line in tail)
        if tail
        else "(TensorBoard printed nothing)"
    )


def _sync_loop(handle: TensorBoardHandle, store: Any, interval_s: float) -> None:
    """Mirror the bucket's ``tb/`` every ``interval_s`` until stopped or TensorBoard exits; failures are kept
    on the handle and retried next round (a network blip must not end the view)."""
    while not handle._stop.wait(interval_s):
        if handle.process.poll() is not None:
            return
        try:
            store.download_tree(rundir.TB_DIR, handle.logdir)
        except Exception as exc:  # noqa: BLE001 - reported on the handle, retried next round
            handle.sync_error = f"{type(exc).__name__}: {exc}"
        else:
            handle.syncs += 1
            handle.sync_error = None
