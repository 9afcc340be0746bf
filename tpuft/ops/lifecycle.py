"""A run's life on the pod, from the controller: claim the workers, start their supervisors, attach, stop, and
find the runs that are alive.

The trainers live under worker-side supervisors (tpuft/worker/supervisor/process.py), so nothing here has to
stay running: ``attach`` is only a reader (a ``follow`` per worker, over the fleet; Ctrl-C ends the followers,
not the run), ``stop`` asks in the run dir (``attempts/<n>/stop.json``, which a worker sees even when this
machine cannot reach it) and, to be quick, signals each supervisor over the fleet too. run.json keeps what it
takes to reach a run's supervisors again from any machine (``launch``: the hosts, the venv's python, the
package folder).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.errors import TpuftError, UsageError
from tpuft.core.records import Worker
from tpuft.core.waiting import waiting
from tpuft.fleet.base import LineSink, last_json_object
from tpuft.host import supervisor_cli
from tpuft.host.state import is_alive
from tpuft.host.supervisor_cli import BUSY_EXIT, FROM_LINE_MARKER, NO_RUN_EXIT
from tpuft.ops.common import Session, on_worker, open_session
from tpuft.ops.ondemand import CheckpointDone, request_checkpoint, wait_checkpoint  # the contract's names

# run.json's slices: the one reading that logs and monitor use too
from tpuft.readers.monitor import (
    run_layout,
)
from tpuft.readers.runs import Run, list_runs
from tpuft.run import rundir
from tpuft.run.startup import not_up, waiting_line

SUPERVISOR = ("-m", supervisor_cli.MODULE)
ALIVE_WITHIN_SECONDS = 60.0
"""A supervisor refreshes its record every 15 s: one silent for a minute is gone (with its VM, or killed)."""
STARTUP_REPORT_SECONDS = 30.0
"""While some launched trainers are not up (no first step), the live view says who, this often."""
REATTACH_DELAYS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 30.0, 30.0, 30.0, 30.0)
"""Back-off between re-attaching to a worker whose follower's connection dropped (a laptop waking up, a
VPN)."""


@dataclass(frozen=True)
class Launch:
    """How to reach a run's supervisors: kept in run.json, so ``attach``/``stop``/``resume`` work from any
    machine."""

    hosts: tuple[int, ...]
    """The cluster's worker indices that run the trainer (the backend's launch plan); rank = position."""
    python: str
    """The backend venv's python on the workers."""
    package: str
    """The tpuft package folder, under each worker's HOME."""

    def as_json(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "python": self.python, "package": self.package}

    @classmethod
    def of(cls, run: Run, info: dict[str, Any]) -> Launch:
        data = info.get("launch")
        if not isinstance(data, dict):
            raise UsageError(
                f"run {run.id} was started by a tpuft without worker supervisors: it cannot be attached to, "
                "stopped or resumed by this one"
            )
        return cls(tuple(int(h) for h in data["hosts"]), str(data["python"]), str(data["package"]))


def supervisor_env(
    session: Session, run: Run, launch: Launch, worker: Worker, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """What every supervisor subcommand needs to find its run on a worker."""
    return {
        "TPUFT_RUN_ID": run.id,
        "TPUFT_RUN_DIR": run.url,
        "TPUFT_WORKER_ID": str(launch.hosts.index(worker.index)),
        "TPUFT_NUM_WORKERS": str(len(launch.hosts)),
        "PYTHONPATH": on_worker(session, worker.index, launch.package),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


def _tool_env(session: Session, launch: Launch) -> Callable[[Worker], dict[str, str]]:
    """For ``check``/``stop``: no run id in the environment (``check`` cleans processes by the run id they
    carry)."""
    return lambda worker: {
        "PYTHONPATH": on_worker(session, worker.index, launch.package),
        "PYTHONUNBUFFERED": "1",
    }


# ----------------------------------------------------------------------------------------------------------
# Claiming the workers


def claim_workers(session: Session, launch: Launch, *, free_tpu: bool) -> list[str]:
    """Refuse a busy cluster (naming the live run and how to stop it); clean what dead runs left behind.
    Returns what was cleaned, one line per worker and thing."""
    busy: dict[int, dict[str, Any]] = {}
    cleaned: list[str] = []
    lines: dict[int, list[str]] = {}

    def collect(index: int, line: str) -> None:
        lines.setdefault(index, []).append(line)

    argv = [launch.python, *SUPERVISOR, "check", *(["--free-tpu"] if free_tpu else [])]
    result = session.fleet.run(
        argv, env=_tool_env(session, launch), workers=launch.hosts, on_line=collect, fail_fast=False
    )
    for r in result.results:
        report = last_json_object(lines.get(r.index, []))
        if r.exit_code not in (0, BUSY_EXIT) or report is None:
            tail = "\n".join("  " + line for line in r.tail[-10:])
            raise TpuftError(
                f"checking worker {r.index} for a running run failed (exit code {r.exit_code}):\n{tail}"
            )
        if report.get("busy"):
            busy[r.index] = report
        cleaned += [f"worker {r.index}: {line}" for line in report.get("cleaned", [])]
    if busy:
        run_ids = sorted({str(b["busy"]) for b in busy.values()})
        workers = ", ".join(str(i) for i in sorted(busy))
        raise UsageError(
            f"the cluster is busy: run {', '.join(run_ids)} is training on worker(s) {workers}",
            hint=f"Watch it: tpuft attach {run_ids[0]}   Stop it: tpuft stop {run_ids[0]}",
        )
    return cleaned


# ----------------------------------------------------------------------------------------------------------
# Starting


def start_supervisors(
    session: Session,
    run: Run,
    launch: Launch,
    env: dict[str, str],
    *,
    attempt: int,
    hang_timeout: float,
    argv: tuple[str, ...],
    free_tpu: bool,
    on_line: LineSink | None = None,
    startup_timeout: float = 1800.0,
) -> None:
    """One detached supervisor per launched worker; returns once every trainer runs. A worker that cannot
    start (claimed by a racing run, a broken venv) gets the others stopped and the attempt recorded as
    failed."""
    command = [
        launch.python,
        *SUPERVISOR,
        "start",
        "--argv",
        json.dumps(list(argv)),
        "--attempt",
        str(attempt),
        "--hang-timeout",
        str(hang_timeout),
        "--startup-timeout",
        str(startup_timeout),
        *(["--free-tpu"] if free_tpu else []),
    ]
    result = session.fleet.run(
        command,
        env=lambda w: supervisor_env(session, run, launch, w, env),
        workers=launch.hosts,
        on_line=on_line,
        fail_fast=False,
    )
    if result.ok:
        return
    bad = [r for r in result.results if not r.ok]
    request_stop(run, attempt, "a worker's supervisor could not start")
    signal_supervisors(session, run, launch)
    first = bad[0]
    busy = first.exit_code == BUSY_EXIT
    what = (
        "is busy with another run (it started a moment ago)"
        if busy
        else f"could not start (exit code {first.exit_code})"
    )
    tail = "\n".join("  " + line for line in first.tail[-15:])
    raise TpuftError(f"worker {first.index} {what}; the workers that had started were stopped\n{tail}")


# ----------------------------------------------------------------------------------------------------------
# Attaching


@dataclass
class AttachOutcome:
    ended: bool
    """Every worker's supervisor has ended (the run finished, failed or was stopped)."""
    interrupted: bool = False
    """Ctrl-C or SIGTERM: the followers were ended, the run goes on."""
    hung_up: bool = False
    """The terminal went away (SIGHUP): detached like Ctrl-C, whatever ``--stop-on-interrupt`` says."""
    lost: tuple[int, ...] = ()
    """Workers that could not be reached again after their connection dropped."""
    gone: str | None = None
    """The provider's reason why the workers are gone (``node PREEMPTED``, ...), from the ``watch`` of
    ``attach``."""


def attach(
    session: Session,
    run: Run,
    launch: Launch,
    on_line: LineSink | None,
    *,
    tail: int | None = None,
    since: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    watch: Callable[[], str | None] | None = None,
    watch_every: float = 30.0,
    on_notice: Callable[[str], None] | None = None,
) -> AttachOutcome:
    """Stream every worker's log of the run (``[wN]`` lines through ``on_line``) until the run ends there. A
    dropped connection re-attaches from the next line, with back-off; Ctrl-C (and SIGHUP) only ends the
    followers.

    ``watch`` (the recovery watcher's question to the provider: why are the workers gone, or None) is asked
    every ``watch_every`` seconds and before each re-attach: a preempted VM's connections may hang rather than
    drop, and re-attaching to a node that is gone would only wait out SSH's retries. An answer ends the attach
    (``gone``).

    ``on_notice`` hears, every ~30 s, which trainers are not up yet while the attempt starts
    (:func:`_reporting_startup`)."""
    next_line: dict[int, int] = {}
    lock = threading.Lock()
    with _watching(session, watch, watch_every) as gone, _reporting_startup(run, launch, on_notice):
        outcome = _attach(session, run, launch, on_line, next_line, lock, tail, since, sleep, watch, gone)
    if gone and not outcome.interrupted:
        return AttachOutcome(ended=False, lost=outcome.lost or tuple(launch.hosts), gone=gone[0])
    return outcome


@contextmanager
def _watching(session: Session, watch: Callable[[], str | None] | None, every: float) -> Iterator[list[str]]:
    """Ask ``watch`` in the background; on an answer, close the fleet's connections so the followers end
    now."""
    gone: list[str] = []
    if watch is None:
        yield gone
        return
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            problem = _ask(watch)
            if problem:
                gone.append(problem)
                close = getattr(session.fleet, "close", None)
                if close is not None:
                    close()
                return

    thread = threading.Thread(target=loop, name="tpuft-watch", daemon=True)
    thread.start()
    try:
        yield gone
    finally:
        done.set()
        thread.join(timeout=5)


@contextmanager
def _reporting_startup(run: Run, launch: Launch, on_notice: Callable[[str], None] | None) -> Iterator[None]:
    """Start-up as one unit: until every launched trainer is up, say every ~30 s which are not and how much of
    ``train.startup_timeout`` is left (a multislice runtime waits silently for its last host); then stop
    asking."""
    info = run.info()
    if on_notice is None or not info:
        yield
        return
    every = float(os.environ.get("TPUFT_STARTUP_REPORT_SECONDS", STARTUP_REPORT_SECONDS))
    attempt = int(info.get("attempt", 1))
    started = float(((info.get("attempts") or [{}])[-1]).get("started") or time.time())
    timeout = float(info.get("startup_timeout") or 1800.0)
    layout = run_layout(info)
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            try:
                missing = not_up(run.storage, attempt, len(launch.hosts), started - 5.0)
            except Exception:  # noqa: BLE001 - the bucket unreachable for a moment: ask again next time
                continue
            if not missing or _attempt_over(run):
                return
            on_notice(waiting_line(layout, missing, started + timeout - time.time(), timeout))

    thread = threading.Thread(target=loop, name="tpuft-startup", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def _ask(watch: Callable[[], str | None]) -> str | None:
    """A failed question (the API unreachable for a moment) is no answer: the run may be fine."""
    try:
        return watch()
    except Exception:  # noqa: BLE001 - the next question will tell
        return None


def _attach(
    session: Session,
    run: Run,
    launch: Launch,
    on_line: LineSink | None,
    next_line: dict[int, int],
    lock: threading.Lock,
    tail: int | None,
    since: str | None,
    sleep: Callable[[float], None],
    watch: Callable[[], str | None] | None,
    gone: list[str],
) -> AttachOutcome:
    def sink(index: int, line: str) -> None:
        if line.startswith(FROM_LINE_MARKER):
            with lock:
                next_line[index] = int(line.split()[1])
            return
        with lock:
            next_line[index] = next_line.get(index, 0) + 1
        if on_line is not None:
            on_line(index, line)

    def env(worker: Worker) -> dict[str, str]:
        return supervisor_env(session, run, launch, worker)

    pending = list(launch.hosts)
    retries = 0
    first = True
    # While attached, a closed terminal (SIGHUP) ends the followers like Ctrl-C does, and is told apart from
    # it.
    with _signals_seen((signal.SIGHUP,), interrupt=True) as hangup:
        while pending:
            if gone:  # the watcher's answer came while waiting to re-attach: connecting again would only wait
                return AttachOutcome(ended=False, lost=tuple(pending))
            # One fleet run per distinct argument list: the first round has one; a re-attach continues each
            # worker from the line after the last one it delivered.
            groups: dict[tuple[str, ...], list[int]] = {}
            for index in pending:
                if first:
                    args = (["--tail", str(tail)] if tail is not None else []) + (
                        ["--since", since] if since else []
                    )
                else:
                    args = ["--from-line", str(next_line.get(index, 0))]
                groups.setdefault(tuple(args), []).append(index)
            dropped: list[int] = []
            try:
                results = _follow_groups(session, launch, groups, env, sink)
            except KeyboardInterrupt:  # a signal between two fleet runs
                return AttachOutcome(ended=False, interrupted=True, hung_up=hangup.hung_up)
            except TpuftError:  # no connection after the fleet's own retries (sshd down, or the VM gone)
                if watch is None:
                    raise
                results = []
                dropped = list(pending)
            except Exception:  # see below
                if not gone:
                    raise
                # The watch has its answer and closed the connections under the followers on purpose: whatever
                # the SSH library raised as they closed is that closing, not a failure of the run or of this
                # watcher.
                return AttachOutcome(ended=False, lost=tuple(pending))
            for result in results:
                if result.interrupted:
                    return AttachOutcome(ended=False, interrupted=True, hung_up=hangup.hung_up)
                dropped += [r.index for r in result.results if r.exit_code not in (0, NO_RUN_EXIT)]
            first = False
            if not dropped:
                return AttachOutcome(ended=True)
            if gone:
                return AttachOutcome(ended=False, lost=tuple(dropped))
            if retries >= len(REATTACH_DELAYS) or _attempt_over(run):
                return AttachOutcome(ended=_attempt_over(run), lost=tuple(dropped))
            if watch is not None and (problem := _ask(watch)):
                gone.append(problem)
                return AttachOutcome(ended=False, lost=tuple(dropped))
            try:
                with waiting(
                    f"the next try to re-attach to worker(s) {', '.join(map(str, dropped))} of run {run.id} "
                    f"({retries + 1} of {len(REATTACH_DELAYS)})",
                    REATTACH_DELAYS[retries],
                ):
                    sleep(REATTACH_DELAYS[retries])
            except KeyboardInterrupt:
                return AttachOutcome(ended=False, interrupted=True, hung_up=hangup.hung_up)
            retries += 1
            pending = dropped
    return AttachOutcome(ended=True)


def _follow_groups(
    session: Session, launch: Launch, groups: dict[tuple[str, ...], list[int]], env: Any, sink: LineSink
) -> list[Any]:
    """Run the followers, a group at a time (workers that had read different amounts are rare: one by one)."""
    results: list[Any] = []
    for args, workers in groups.items():
        result = session.fleet.run(
            [launch.python, *SUPERVISOR, "follow", *args],
            env=env,
            workers=workers,
            on_line=sink,
            fail_fast=False,
        )
        results.append(result)
        if result.interrupted:
            break
    return results


class SignalsSeen:
    fired = False
    hung_up = False
    """One of them was SIGHUP (a closed terminal): always a detach, whatever ``--stop-on-interrupt`` says."""


@contextmanager
def _signals_seen(signals: tuple[signal.Signals, ...], *, interrupt: bool) -> Iterator[SignalsSeen]:
    """Note ``signals`` while the block runs; with ``interrupt`` each also raises KeyboardInterrupt (which
    ends the fleet's followers), else it is only remembered for the caller to act on afterwards."""
    seen = SignalsSeen()
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum: int, frame: object) -> None:
        seen.fired = True
        seen.hung_up = seen.hung_up or signum == signal.SIGHUP
        if interrupt:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield seen
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def deferred_interrupts() -> contextlib.AbstractContextManager[SignalsSeen]:
    """Ctrl-C and SIGHUP while the supervisors start are remembered, not raised: a ``start`` cut off half-way
    could leave a worker claimed by a supervisor that nobody knows of. The caller acts on them once every
    worker runs."""
    return _signals_seen((signal.SIGINT, signal.SIGHUP), interrupt=False)


def _attempt_over(run: Run) -> bool:
    return finalize(run) is not None


# ----------------------------------------------------------------------------------------------------------
# Ending: outcome, stop


def finalize(run: Run) -> dict[str, Any] | None:
    """run.json with the current attempt's outcome once every worker's record is final (None before)."""
    return rundir.finalize_run(run.storage)


def wait_for_outcome(
    run: Run, timeout: float = 60.0, sleep: Callable[[float], None] = time.sleep
) -> dict[str, Any]:
    """run.json once the attempt has an outcome; after ``timeout``, whatever run.json says (a worker whose
    supervisor died without a last word leaves the attempt open: ``runs`` shows it as stale, ``resume`` can
    take over)."""
    what = f"the supervisors of run {run.id} to record how the attempt ended"
    with waiting(what, timeout) as wait:
        while True:
            info = finalize(run)
            if info is not None and info.get("status") != "running":
                return info
            if wait.expired():
                return run.info()
            sleep(0.25)


def request_stop(run: Run, attempt: int, reason: str) -> None:
    run.storage.write_text(rundir.stop_request(attempt), json.dumps({"reason": reason, "time": time.time()}))


def signal_supervisors(session: Session, run: Run, launch: Launch, on_line: LineSink | None = None) -> None:
    """SIGTERM each worker's supervisor of ``run`` over the fleet and wait for it to end (the run dir's stop
    request does the same, a little later, for a worker this machine cannot reach)."""
    argv = [launch.python, *SUPERVISOR, "stop", "--run", run.id]
    session.fleet.run(
        argv, env=_tool_env(session, launch), workers=launch.hosts, on_line=on_line, fail_fast=False
    )


@dataclass
class StopResult:
    run_id: str
    status: str
    already_ended: bool
    trainers: dict[int, int]
    """worker -> pid of the trainer that was stopped (from the supervisors' records)."""


def stop(
    config: ClusterConfig, run: Run, *, reason: str = "stopped with tpuft stop", timeout: float = 60.0
) -> StopResult:
    info = run.info()
    if not info:
        raise UsageError(f"run {run.id} has no run.json: nothing to stop")
    attempt = int(info.get("attempt", 1))
    if info.get("status") != "running":
        return StopResult(run.id, str(info.get("status")), True, {})
    request_stop(run, attempt, reason)
    launch = Launch.of(run, info)
    try:
        session = open_session(config)
    except TpuftError:
        session = (
            None  # the cluster is gone or not READY: the stop request waits in the run dir for its workers
        )
    if session is not None:
        signal_supervisors(session, run, launch)
    final = wait_for_outcome(run, timeout)
    records = rundir.attempt_records(run.storage, attempt)
    trainers = {w: int(r["trainer_pid"]) for w, r in records.items() if r.get("trainer_pid")}
    return StopResult(run.id, str(final.get("status")), False, trainers)


def stop_with_checkpoint(
    run: Run,
    *,
    timeout: float,
    reason: str = "stopped with tpuft stop --checkpoint",
    at_step: int | None = None,
) -> tuple[CheckpointDone, StopResult]:
    """``tpuft stop --checkpoint``: the trainers save at a step boundary and are stopped right after it by
    their supervisors (no SIGTERM first, so no step is lost: a resume starts at exactly that checkpoint)."""
    request_id = request_checkpoint(run, reason=reason, stop=True, at_step=at_step)
    done = wait_checkpoint(run, request_id, timeout)
    final = wait_for_outcome(run, timeout=60.0)
    attempt = int(final.get("attempt", 1))
    records = rundir.attempt_records(run.storage, attempt)
    trainers = {w: int(r["trainer_pid"]) for w, r in records.items() if r.get("trainer_pid")}
    return done, StopResult(run.id, str(final.get("status")), False, trainers)


# ----------------------------------------------------------------------------------------------------------
# Which runs are alive


def run_is_alive(run: Run, now: float | None = None) -> bool:
    """A run whose run.json says running and one of whose supervisors wrote its record in the last minute and
    has not ended (on this machine, a local run's supervisor pid is checked too)."""
    info = run.info()
    if info.get("status") != "running":
        return False
    now = time.time() if now is None else now
    for record in rundir.attempt_records(run.storage, int(info.get("attempt", 1))).values():
        if record.get("status") in rundir.TERMINAL and record.get("final"):
            continue
        if now - float(record.get("alive") or 0.0) > ALIVE_WITHIN_SECONDS:
            continue
        if not run.remote and not _local_pid_alive(record):
            continue
        return True
    return False


def _local_pid_alive(record: dict[str, Any]) -> bool:
    import socket

    if record.get("host") != socket.gethostname():
        return True  # another machine's process: the record's age is all there is to go by
    return is_alive(record.get("supervisor_pid"))


def alive_runs(config: ClusterConfig) -> list[Run]:
    return [
        run for run in list_runs(config) if run.info().get("cluster") == config.name and run_is_alive(run)
    ]
