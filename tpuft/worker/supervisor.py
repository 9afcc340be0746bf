"""The worker-side supervisor: a run's trainer lives on the worker, not in the controller's SSH session.

``tpuft train`` starts one supervisor per launched worker (``start``) and returns to attaching (``follow``); from
then on the run does not depend on the controller, its terminal, its laptop or its connections. The supervisor:

- runs the trainer in its own process group (its own session, as the supervisor is in another), writing every output
  line, time-stamped, to ``logs/worker-<i>.log`` on the worker's disk (the run dir, or the staging copy that it
  mirrors to a ``gs://`` run dir);
- records itself in the run dir (``attempts/<n>/worker-<i>.json``: running, alive every 15 s, how the trainer ended,
  then ``final`` once its files are uploaded; a failed or hung worker also in ``attempts/<n>/failures/``, the one
  folder its peers list);
- stops its trainer (SIGTERM to the group, SIGKILL after a grace period) when another worker's record says failed or
  hung, when ``attempts/<n>/stop.json`` appears (``tpuft stop``), or when it gets SIGTERM itself;
- declares its trainer hung when its heartbeat is older than the hang timeout (three times longer, at least a minute,
  while compiling, evaluating, checkpointing or exporting), unless the beat says it is waiting for its peers in a
  collective and the process is not stopped: a waiting worker is not the culprit (it gives up only after twice the
  timeout, when no peer has reported);
- as the last one to finish, writes the run's outcome into run.json (:func:`tpuft.rundir.finalize_run`).

On the worker, ``$HOME/.tpuft/supervisor/current.json`` names the run it supervises, so that a second run is refused
while this one lives and the leftovers of a dead one (a supervisor killed with its VM, a trainer that outlived its
supervisor, a process still holding the TPU chips) are cleaned before the next one starts (``check``).

Stdlib only at import time (``follow`` and ``check`` must start fast); the storage layer is imported when needed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tpuft import rundir
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import PATIENT_PHASES

STATE_DIR = ".tpuft/supervisor"
"""Under the worker's HOME."""
BUSY_EXIT = 4
"""``check`` / ``start``: the worker is busy with another live run."""
NO_RUN_EXIT = 3
"""``follow`` / ``stop``: this worker has no such run."""
FROM_LINE_MARKER = "__TPUFT_FROM_LINE__"
"""``follow`` first prints the index of the first log line it sends, so that a re-attach continues exactly."""

STOP_GRACE_SECONDS = 10.0
"""SIGTERM, then SIGKILL after this long: a trainer gets time to exit cleanly, not to finish a checkpoint."""
ALIVE_EVERY_SECONDS = 15.0
TICK_SECONDS = 0.25
TAIL_LINES = 30
PATIENT_FACTOR = 3.0
PATIENT_MIN_SECONDS = 60.0
WAITING_FACTOR = 2.0
TPU_DEVICES = ("/dev/accel", "/dev/vfio/")
TPU_LOCKFILE = "/tmp/libtpu_lockfile"


def control_poll_seconds(remote: bool) -> float:
    """How often a supervisor looks for a stop request or a failed peer: a local file is cheap, a bucket listing
    costs an API call per worker (and the 10 s fail-fast budget still holds)."""
    return float(os.environ.get("TPUFT_CONTROL_POLL_SECONDS", "2.5" if remote else "0.5"))


# ----------------------------------------------------------------------------------------------------------------
# This worker's state on its own disk


def state_dir() -> Path:
    return Path(os.environ.get("HOME") or Path.home()) / STATE_DIR


def current_path() -> Path:
    return state_dir() / "current.json"


@contextlib.contextmanager
def worker_lock() -> Iterator[None]:
    """One ``check``/``start`` at a time on a worker: two ``tpuft train`` racing cannot both claim it."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_current() -> dict[str, Any]:
    return rundir.read_json(current_path()) or {}


def write_current(data: dict[str, Any]) -> None:
    rundir.write_json_atomic(current_path(), data)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22): with the pid it names one process, not
    whichever later one reuses the number."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def process_state(pid: int) -> str | None:
    """``R``, ``S``, ``D``, ``T`` (stopped), ``Z``...; None when there is no such process."""
    fields = _stat(pid)
    return fields[0] if fields else None


def is_alive(pid: int | None, ticks: int | None = None) -> bool:
    fields = _stat(pid) if pid else None
    if fields is None or fields[0] in {"Z", "X"}:
        return False
    return ticks is None or int(fields[19]) == ticks


def supervisor_alive(current: dict[str, Any]) -> bool:
    return current.get("status") in {"starting", "running"} and is_alive(current.get("supervisor_pid"), current.get("supervisor_ticks"))


def process_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# ----------------------------------------------------------------------------------------------------------------
# check: is this worker free? clean what dead runs left behind


def leftover_processes(home: str, keep_run: str | None) -> list[tuple[int, str]]:
    """(pid, run id) of processes of this worker (its HOME) that belong to a tpuft run other than ``keep_run``: the
    trainers, supervisors and followers of runs that are no longer alive."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in {me, os.getppid()}:
            continue
        env = process_environ(int(entry.name))
        run = env.get("TPUFT_RUN_ID")
        if run and env.get("HOME") == home and run != keep_run:
            found.append((int(entry.name), run))
    return found


def tpu_holders(devices: tuple[str, ...] = TPU_DEVICES) -> list[int]:
    """Processes holding a TPU chip open (``/dev/accel*``, ``/dev/vfio/*``): a crashed run's trainer keeps the chips
    and the next one fails with "TPU in use", as MaxText's multihost runner knows."""
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(devices):
                holders.append(int(entry.name))
                break
    return holders


def check_worker(*, free_tpu: bool, devices: tuple[str, ...] = TPU_DEVICES, lockfile: str = TPU_LOCKFILE) -> dict[str, Any]:
    """Under the worker lock: {"busy": run id of a live run, or None; "cleaned": what was stopped or removed}."""
    current = read_current()
    if supervisor_alive(current):
        return {"busy": current.get("run_id"), "since": current.get("started"), "attempt": current.get("attempt"), "cleaned": []}
    cleaned = []
    home = os.environ.get("HOME") or str(Path.home())
    for pid, run in leftover_processes(home, None):
        with contextlib.suppress(OSError):
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                kill_group(pgid, signal.SIGKILL)
        kill_pid(pid, signal.SIGKILL)
        cleaned.append(f"killed pid {pid}, left over from run {run}")
    if free_tpu:
        for pid in tpu_holders(devices):
            kill_pid(pid, signal.SIGKILL)
            cleaned.append(f"killed pid {pid}, which held the TPU chips")
        if os.path.exists(lockfile):
            with contextlib.suppress(OSError):
                os.remove(lockfile)
                cleaned.append(f"removed {lockfile}")
    if current and current.get("status") in {"starting", "running"}:
        write_current({**current, "status": "ended", "cleaned": time.time()})
        cleaned.append(f"run {current.get('run_id')} had lost its supervisor (pid {current.get('supervisor_pid')})")
    return {"busy": None, "cleaned": cleaned}


# ----------------------------------------------------------------------------------------------------------------
# The supervisor proper


class StartError(Exception):
    """The trainer's command could not be started (its python is gone, say)."""


class TrainerOutput:
    """The trainer's stdout+stderr: each line, time-stamped, to the worker's log; the last lines kept for a failure
    report."""

    def __init__(self, log_path: Path, stream: BinaryIO) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed by close()
        self.lock = threading.Lock()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: BinaryIO) -> None:
        for raw in iter(stream.readline, b""):
            self.write(raw)

    def write(self, raw: bytes) -> None:
        with self.lock:
            self.log.write(rundir.log_timestamp().encode() + b" " + (raw if raw.endswith(b"\n") else raw + b"\n"))
            self.log.flush()
            self.tail.append(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def say(self, message: str) -> None:
        self.write(f"[supervisor] {message}\n".encode())

    def close(self) -> None:
        self.thread.join(timeout=10)
        with self.lock:
            self.log.close()


class Supervisor:
    def __init__(self, ctx: WorkerContext, argv: list[str], attempt: int, hang_timeout: float, storage: Any) -> None:
        self.ctx = ctx
        self.argv = argv
        self.attempt = attempt
        self.hang_timeout = hang_timeout
        self.storage = storage
        self.record_path = rundir.attempt_record(attempt, ctx.worker_id)
        self.record: dict[str, Any] = {
            "worker": ctx.worker_id, "attempt": attempt, "host": socket.gethostname(), "supervisor_pid": os.getpid(),
            "status": "starting", "started": time.time(),
        }
        self.stop_reason: str | None = None
        self.hang: tuple[str, bool] | None = None
        """(what happened, whether it was only waiting for peers) once the trainer is declared hung."""
        self.stop_sent_at: float | None = None
        self.killed = False
        self.pending_stop: str | None = None
        """Set by the signal handler (SIGTERM from ``tpuft stop``), acted on at the next tick."""
        self.trainer_started = time.time()

    # -- records ---------------------------------------------------------------------------------------------
    def publish(self, **changes: Any) -> None:
        self.record.update(changes, alive=time.time())
        text = json.dumps(self.record, indent=2, sort_keys=True)
        try:
            if self.record.get("status") in rundir.FAILED and "status" in changes:  # the peers poll for these
                self.storage.write_text(rundir.failure_record(self.attempt, self.ctx.worker_id), text)
            self.storage.write_text(self.record_path, text)
        except Exception as exc:  # noqa: BLE001 - the bucket may hiccup; the next beat retries, training goes on
            print(f"[supervisor] cannot write {self.record_path}: {exc}", flush=True)

    # -- the run ---------------------------------------------------------------------------------------------
    def run(self) -> int:
        syncer = self._stage() if self.ctx.remote else None
        output = None
        try:
            env = {**os.environ, "TPUFT_ATTEMPT": str(self.attempt)}
            log = rundir.log_path(self.ctx.run_dir, self.ctx.worker_id)
            try:
                trainer = subprocess.Popen(
                    self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True, env=env,
                )
            except OSError as exc:  # what a shell would report as exit 126/127: one line, no traceback
                raise StartError(f"worker {self.ctx.worker_id}: cannot start {self.argv[0]}: {exc.strerror or exc}") from None
            assert trainer.stdout is not None
            output = TrainerOutput(log, trainer.stdout)
            output.say(f"attempt {self.attempt}: trainer pid {trainer.pid} started (supervisor pid {os.getpid()})")
            self.trainer_started = time.time()
            self.publish(status="running", trainer_pid=trainer.pid, trainer_ticks=start_ticks(trainer.pid))
            with worker_lock():
                write_current({**read_current(), "status": "running", "trainer_pid": trainer.pid})
            code = self._watch(trainer, output)
            return self._end(code, output, syncer)
        except BaseException as exc:
            reason = str(exc) if isinstance(exc, StartError) else f"supervisor error: {type(exc).__name__}: {exc}"
            self.publish(status="failed", reason=reason[:2000], ended=time.time(), final=True)
            rundir.finalize_run(self.storage, self.attempt)
            if isinstance(exc, StartError):
                print(reason, flush=True)
                return 1
            raise
        finally:
            if output is not None:
                output.close()
            with worker_lock():
                current = read_current()
                if current.get("supervisor_pid") == os.getpid():
                    write_current({**current, "status": "ended", "ended": time.time()})

    def _stage(self) -> Any:
        """A gs:// run dir: the trainer writes a local staging folder; mirror it to the bucket while it grows."""
        from tpuft.storage.sync import RunDirSync

        self.ctx.run_dir.mkdir(parents=True, exist_ok=True)
        text = self.storage.read_text(rundir.RECIPE)
        if text is None:
            raise SystemExit(f"tpuft supervisor: {self.ctx.run_url}/{rundir.RECIPE} not found")
        (self.ctx.run_dir / rundir.RECIPE).write_text(text)
        syncer = RunDirSync(self.ctx.run_dir, self.storage)
        syncer.changed_files()  # what is here already came from there, or is an earlier attempt's: not sent again
        return syncer.start()

    def _watch(self, trainer: subprocess.Popen[bytes], output: TrainerOutput) -> int:
        poll = control_poll_seconds(self.ctx.remote)
        next_control = time.monotonic() + poll
        next_alive = time.monotonic() + ALIVE_EVERY_SECONDS
        while True:
            code = trainer.poll()
            if code is not None:
                return code
            now = time.monotonic()
            if self.stop_reason is None and self.hang is None:
                if now >= next_control or self.pending_stop:
                    next_control = now + poll
                    reason = self._stop_wanted()
                    if reason:
                        self._stop(trainer, output, reason)
                hang = self._hang_check(trainer.pid)
                if hang is not None:
                    self.hang = hang
                    output.say(f"worker {self.ctx.worker_id} {hang[0]}: stopping it")
                    kill_group(trainer.pid, signal.SIGKILL)  # a stopped (SIGSTOP) process cannot act on SIGTERM
                    self.publish(status="hung", reason=hang[0], waiting=hang[1], ended=time.time(), tail=list(output.tail))
            elif self.stop_sent_at is not None and not self.killed and now - self.stop_sent_at > STOP_GRACE_SECONDS:
                output.say(f"the trainer ignored SIGTERM for {STOP_GRACE_SECONDS:.0f} s: SIGKILL")
                kill_group(trainer.pid, signal.SIGKILL)
                self.killed = True
            if now >= next_alive:
                next_alive = now + ALIVE_EVERY_SECONDS
                self.publish(step=self._beat().get("step"))
            time.sleep(TICK_SECONDS)

    def request_stop(self, reason: str) -> None:
        self.pending_stop = reason

    def _stop_wanted(self) -> str | None:
        if self.pending_stop:
            return self.pending_stop
        try:
            stop = rundir.read_json_text(self.storage.read_text(rundir.stop_request(self.attempt)))
            if stop is not None:
                return str(stop.get("reason") or "stop requested")
            records = rundir.attempt_records(self.storage, self.attempt, "failures")
        except Exception as exc:  # noqa: BLE001 - a bucket hiccup: look again next time
            print(f"[supervisor] cannot read the run's control files: {exc}", flush=True)
            return None
        culprit = rundir.failure_culprit({w: r for w, r in records.items() if w != self.ctx.worker_id})
        if culprit is not None:
            return f"worker {culprit.get('worker')} {'hung' if culprit.get('status') == 'hung' else 'failed'}"
        return None

    def _stop(self, trainer: subprocess.Popen[bytes], output: TrainerOutput, reason: str) -> None:
        self.stop_reason = reason
        output.say(f"stopping the trainer: {reason}")
        kill_group(trainer.pid, signal.SIGTERM)
        self.stop_sent_at = time.monotonic()

    def _beat(self) -> dict[str, Any]:
        return rundir.read_json(rundir.heartbeat_path(self.ctx.run_dir, self.ctx.worker_id)) or {}

    def _hang_check(self, pid: int) -> tuple[str, bool] | None:
        """(what, waiting) when the trainer has made no progress for too long, else None."""
        beat = self._beat()
        beat_time = float(beat.get("time") or 0.0)
        if beat_time < self.trainer_started:  # nothing yet from this attempt (an earlier one's beat is still there)
            beat, beat_time = {"phase": "starting"}, self.trainer_started
        quiet = time.time() - beat_time
        phase = str(beat.get("phase") or "step")
        step = beat.get("step")
        limit = max(self.hang_timeout * PATIENT_FACTOR, PATIENT_MIN_SECONDS) if phase in PATIENT_PHASES else self.hang_timeout
        if quiet <= limit:
            return None
        stopped = process_state(pid) in {"T", "t"}
        at = f"(last step {step}, phase {phase})" if step is not None else f"(phase {phase})"
        if phase == "collective" and not stopped:
            if quiet <= self.hang_timeout * WAITING_FACTOR:
                return None  # waiting for a peer: that peer's supervisor reports it
            return f"waited for its peers in a collective for {quiet:.0f} s and none reported a failure {at}", True
        what = "was stopped (SIGSTOP)" if stopped else "made no progress"
        return f"{what} for {quiet:.0f} s {at}", False

    def _end(self, code: int, output: TrainerOutput, syncer: Any) -> int:
        ended = time.time()
        if self.hang is not None:
            status = "hung"
            extra: dict[str, Any] = {}
        elif self.stop_reason is not None:
            status, extra = "stopped", {"reason": self.stop_reason}
        elif code == 0:
            status, extra = "finished", {}
        else:
            status, extra = "failed", {"reason": f"exit code {code}" if code > 0 else f"killed by signal {-code}"}
        if self.hang is None:
            self.publish(status=status, exit_code=code, ended=ended, tail=list(output.tail), **extra)
        output.say(f"trainer ended: {status} (exit code {code})")
        output.close()
        if syncer is not None:
            syncer.close()  # the last metrics, checkpoints, export and the whole log reach the bucket
        self.publish(final=True)
        rundir.finalize_run(self.storage, self.attempt)
        return 0


# ----------------------------------------------------------------------------------------------------------------
# Subcommands


def _open_storage(ctx: WorkerContext) -> Any:
    from tpuft.storage import open_storage

    return open_storage(ctx.run_url)


def cmd_check(args: argparse.Namespace) -> int:
    with worker_lock():
        result = check_worker(free_tpu=args.free_tpu)
    print(json.dumps(result), flush=True)
    return BUSY_EXIT if result["busy"] else 0


def cmd_start(args: argparse.Namespace) -> int:
    """Claim the worker and start a detached supervisor; return once its trainer runs."""
    ctx = WorkerContext.from_env()
    with worker_lock():
        result = check_worker(free_tpu=args.free_tpu)
        for line in result["cleaned"]:
            print(f"[supervisor] cleaned: {line}", flush=True)
        if result["busy"]:
            print(json.dumps(result), flush=True)
            return BUSY_EXIT
        state_dir().mkdir(parents=True, exist_ok=True)
        out = state_dir() / f"{ctx.run_id}.attempt-{args.attempt}.out"
        with open(out, "ab") as sink:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "tpuft.worker.supervisor", "run", "--argv", args.argv, "--attempt", str(args.attempt),
                 "--hang-timeout", str(args.hang_timeout)],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=os.environ.get("HOME"),
            )
        write_current({
            "run_id": ctx.run_id, "run_url": ctx.run_url, "attempt": args.attempt, "worker": ctx.worker_id,
            "supervisor_pid": daemon.pid, "supervisor_ticks": start_ticks(daemon.pid), "status": "starting",
            "started": time.time(), "output": str(out),
        })
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        current = read_current()
        if current.get("status") == "running" and current.get("supervisor_pid") == daemon.pid:
            print(f"[supervisor] worker {ctx.worker_id}: trainer pid {current.get('trainer_pid')} under supervisor pid "
                  f"{daemon.pid}", flush=True)
            return 0
        if daemon.poll() is not None:
            break
        time.sleep(0.05)
    tail = out.read_bytes()[-3000:].decode("utf-8", "replace") if out.exists() else ""
    print(f"[supervisor] worker {ctx.worker_id}: the supervisor did not start its trainer "
          f"({'exit code ' + str(daemon.poll()) if daemon.poll() is not None else 'still starting after ' + str(args.wait) + ' s'})",
          flush=True)
    print(tail, flush=True)
    if daemon.poll() is None:
        kill_group(daemon.pid, signal.SIGKILL)
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    ctx = WorkerContext.from_env()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    supervisor = Supervisor(ctx, json.loads(args.argv), args.attempt, args.hang_timeout, _open_storage(ctx))

    def on_signal(signum: int, frame: object) -> None:
        supervisor.request_stop(f"stop requested on worker {ctx.worker_id} ({signal.Signals(signum).name})")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.run()


def cmd_stop(args: argparse.Namespace) -> int:
    """SIGTERM this worker's supervisor of run ``--run`` (it stops its trainer and records why); wait for it."""
    current = read_current()
    if current.get("run_id") != args.run or not supervisor_alive(current):
        print(f"[supervisor] no live supervisor of run {args.run} on this worker", flush=True)
        return 0
    pid = int(current["supervisor_pid"])
    kill_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline and is_alive(pid, current.get("supervisor_ticks")):
        time.sleep(0.1)
    if is_alive(pid, current.get("supervisor_ticks")):
        trainer = current.get("trainer_pid")
        if trainer:
            kill_group(int(trainer), signal.SIGKILL)
        kill_pid(pid, signal.SIGKILL)
        print(f"[supervisor] the supervisor (pid {pid}) did not end in {args.wait:.0f} s: killed it and its trainer", flush=True)
    else:
        print(f"[supervisor] stopped run {args.run}", flush=True)
    return 0


def cmd_follow(args: argparse.Namespace) -> int:
    """Print this worker's log of the run, from a line on, until its supervisor has ended and the log is read."""
    ctx = WorkerContext.from_env()
    path = rundir.log_path(ctx.run_dir, ctx.worker_id)
    current = read_current()
    if current.get("run_id") != ctx.run_id and not path.exists():
        print(f"[supervisor] no run {ctx.run_id} on this worker", flush=True)
        return NO_RUN_EXIT
    start, index, offset = locate_start(path, args.from_line, args.tail, args.since)
    print(f"{FROM_LINE_MARKER} {start}", flush=True)
    partial = b""
    while True:
        running = _still_running(ctx.run_id)
        data = b""
        with contextlib.suppress(FileNotFoundError):
            with path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
        offset += len(data)
        chunks = (partial + data).split(b"\n")
        partial = chunks.pop()
        out = []
        for raw in chunks:
            if index >= start:
                stamp, text = rundir.split_log_stamp(raw)
                out.append((f"{stamp} " if args.timestamps and stamp else "") + text.decode("utf-8", "replace"))
            index += 1
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()
        if not running and not data:
            return 0
        time.sleep(0.2)


def locate_start(path: Path, from_line: int, tail: int | None, since: str | None) -> tuple[int, int, int]:
    """Where ``follow`` starts in a log that may hold a week of lines: (the first line to send, the index of the line
    at ``offset``, ``offset`` in bytes), in one streaming pass that keeps only the offsets it may need. The first line
    to send is the latest of ``from_line``, the last ``tail`` lines and the first line stamped ``since`` or later."""
    recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=(tail or 0) + 1)
    known: dict[int, int] = {}
    total = offset = 0
    since_index: int | None = None
    with contextlib.suppress(FileNotFoundError), path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break  # a line still being written: the follow loop reads it once it is whole
            if total == from_line:
                known[total] = offset
            if since is not None and since_index is None and (rundir.split_log_stamp(raw)[0] or "") >= since:
                since_index, known[total] = total, offset
            recent.append((total, offset))
            total += 1
            offset += len(raw)
    known.update(recent)
    start = from_line
    if tail is not None:
        start = max(start, total - tail)
    if since is not None:
        start = max(start, since_index if since_index is not None else total)
    base = min(start, total)
    return start, base, offset if base == total else known[base]


def _still_running(run_id: str) -> bool:
    current = read_current()
    return current.get("run_id") == run_id and supervisor_alive(current)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuft.worker.supervisor", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="is this worker free? clean the leftovers of dead runs")
    check.add_argument("--free-tpu", action="store_true")
    for name in ("start", "run"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--argv", required=True, help="the trainer's command (the backend venv's python first), as a JSON list")
        cmd.add_argument("--attempt", type=int, default=1)
        cmd.add_argument("--hang-timeout", type=float, default=600.0)
        if name == "start":
            cmd.add_argument("--free-tpu", action="store_true")
            cmd.add_argument("--wait", type=float, default=120.0)
    stop = sub.add_parser("stop")
    stop.add_argument("--run", required=True)
    stop.add_argument("--wait", type=float, default=STOP_GRACE_SECONDS + 20)
    follow = sub.add_parser("follow")
    follow.add_argument("--from-line", type=int, default=0)
    follow.add_argument("--tail", type=int)
    follow.add_argument("--since", help="ISO time (UTC, as the log stamps): lines from then on")
    follow.add_argument("--timestamps", action="store_true")
    args = parser.parse_args(argv)
    commands = {"check": cmd_check, "start": cmd_start, "run": cmd_run, "stop": cmd_stop, "follow": cmd_follow}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
