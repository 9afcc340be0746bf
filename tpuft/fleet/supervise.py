"""What every fleet shares: teeing worker output, fail-fast supervision, and Ctrl-C/SIGTERM clean-up.

A fleet starts one handle per worker (a local process group, or a remote one over SSH); this module watches
them. The first worker to exit non-zero gets every other one stopped (SIGTERM to its process group, SIGKILL
after a grace period); Ctrl-C or SIGTERM to tpuft stops them all, and a second Ctrl-C cannot cut that clean-up
short.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from tpuft.core.waiting import waiting
from tpuft.fleet.base import FleetResult, LineSink, WorkerResult

TAIL_LINES = 30
POLL_SECONDS = 0.05
STOP_BOUND_S = 10.0
"""How long stopping the workers' commands may take: the fleets' 5 s SIGTERM grace, then SIGKILL and its
answer."""


class Handle(Protocol):
    index: int
    stopped_by_us: bool

    def poll(self) -> int | None:
        """The exit code once the worker's command has ended, else None."""
        ...

    def stop(self) -> None:
        """Ask the worker's whole process group to end (SIGTERM); no-op once it has ended."""
        ...

    def escalate(self) -> None:
        """SIGKILL a group that ignored SIGTERM for longer than the grace period."""
        ...

    def finish(self) -> None:
        """Wait (bounded) for the end, kill what is left, and drain the output."""
        ...

    def result(self) -> WorkerResult: ...


class Output:
    """One worker's output: each line goes to its log file, the tail buffer and the caller's sink. (A run's
    worker logs, which ``tpuft logs`` interleaves in time order, are stamped on the worker by its
    supervisor.)"""

    def __init__(self, index: int, log_path: Path | None, on_line: LineSink | None) -> None:
        self.index = index
        self.log_path = log_path
        self.on_line = on_line
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._log: BinaryIO | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "ab")

    def feed(self, raw: bytes) -> None:
        if self._log is not None:
            self._log.write(raw if raw.endswith(b"\n") else raw + b"\n")
            self._log.flush()
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        self.tail.append(line)
        if self.on_line is not None:
            self.on_line(self.index, line)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def run_supervised(start: Callable[[list[Handle], threading.Event], None], fail_fast: bool) -> FleetResult:
    """``start`` appends a handle per worker as it launches them (so a Ctrl-C during start-up stops those
    too). Handles set the event when their worker's command may have ended, so the supervisor reacts at
    once."""
    handles: list[Handle] = []
    changed = threading.Event()
    restore = _raise_on_sigterm()
    try:
        with _starting() as interrupted:
            try:
                start(handles, changed)
            except (
                Exception
            ):  # a later worker could not be started: the earlier ones must not run on, unwatched
                _stop_all(handles)
                raise
        if interrupted:  # Ctrl-C while starting: now that every started worker is on record, all are stopped
            raise KeyboardInterrupt
        return _supervise(handles, fail_fast, changed)
    except KeyboardInterrupt:
        _stop_all(handles)
        return FleetResult(results=[h.result() for h in handles], interrupted=True)
    finally:
        restore()


def _stop_all(handles: list[Handle]) -> None:
    running = [str(h.index) for h in handles if h.poll() is None]
    what = f"the command on worker(s) {', '.join(running)} to end (SIGTERM now, SIGKILL after a 5 s grace)"
    with _interrupts_ignored(), waiting(what, STOP_BOUND_S):
        for handle in handles:
            handle.stop()
        for handle in handles:
            handle.finish()


def _supervise(handles: list[Handle], fail_fast: bool, changed: threading.Event) -> FleetResult:
    first_failure: int | None = None
    while True:
        pending = [h for h in handles if h.poll() is None]
        if fail_fast and first_failure is None:
            for handle in handles:
                code = handle.poll()
                if code is not None and code != 0 and not handle.stopped_by_us:
                    first_failure = handle.index
                    break
            if first_failure is not None:
                for handle in pending:
                    handle.stop()
        if not pending:
            break
        for handle in pending:
            handle.escalate()
        changed.wait(POLL_SECONDS)
        changed.clear()
    for handle in handles:
        handle.finish()
    return FleetResult(results=[h.result() for h in handles], first_failure=first_failure)


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


_start_gate = threading.Lock()
_starting_threads: set[int] = set()
_deferred_interrupts: set[int] = set()


@contextlib.contextmanager
def _starting() -> Iterator[list[int]]:
    """While a fleet starts its workers, an interrupt (Ctrl-C, SIGTERM, or the agent's
    :func:`interrupt_thread`) is held back until ``start`` returns: landing between a process's creation and
    its handle's record, it would leave that worker running, unwatched (seen on a loaded machine). Starting is
    quick, so the wait is short. Yields a list that is non-empty when an interrupt was held back."""
    held: list[int] = []
    me = threading.get_ident()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {
            sig: signal.signal(sig, lambda signum, frame: held.append(signum))
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
    with _start_gate:
        _starting_threads.add(me)
    try:
        yield held
    finally:
        with _start_gate:
            _starting_threads.discard(me)
            if me in _deferred_interrupts:
                _deferred_interrupts.discard(me)
                held.append(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def interrupt_thread(thread_id: int, inject: Callable[[], None]) -> None:
    """Interrupt the fleet run of another thread (the agent's requests): ``inject`` raises in it now, unless
    it is starting its workers, in which case the interrupt is held back until they are all on record
    (:func:`_starting`)."""
    with _start_gate:
        if thread_id in _starting_threads:
            _deferred_interrupts.add(thread_id)
        else:
            inject()


def _raise_on_sigterm() -> Callable[[], object]:
    """While workers run, treat SIGTERM like Ctrl-C so that killing tpuft never orphans worker processes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)
