"""The supervisor proper: one attempt of a run's trainer on this worker, from its start to its recorded end.

What it does and why is told in :mod:`tpuft.worker.supervisor.process` (the command that starts it): the
trainer in its own process group with its output time-stamped to the worker's log, the worker's records in the
run dir, a stop when a peer fails or hangs or ``tpuft stop`` asks, hang detection from the heartbeat, and the
run's outcome at the end.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from tpuft.host.state import (
    kill_group,
    process_state,
    read_current,
    start_ticks,
    worker_lock,
    write_current,
)
from tpuft.run import rundir
from tpuft.run.startup import names, not_up
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import PATIENT_PHASES
from tpuft.worker.ondemand import Relay
from tpuft.worker.supervisor.cost_guard import CostGuard
from tpuft.worker.supervisor.maintenance import MaintenanceNotices
from tpuft.worker.tracking.launch import TrackingSidecar

STOP_GRACE_SECONDS = 10.0
"""SIGTERM, then SIGKILL after this long: a trainer gets time to exit cleanly, not to finish a checkpoint."""
ALIVE_EVERY_SECONDS = 15.0
TICK_SECONDS = 0.25
TAIL_LINES = 30
PATIENT_FACTOR = 3.0
PATIENT_MIN_SECONDS = 60.0
WAITING_FACTOR = 2.0


def control_poll_seconds(remote: bool) -> float:
    """How often a supervisor looks for a stop request or a failed peer: a local file is cheap, a bucket
    listing costs an API call per worker (and the 10 s fail-fast budget still holds)."""
    return float(os.environ.get("TPUFT_CONTROL_POLL_SECONDS", "2.5" if remote else "0.5"))


class StartError(Exception):
    """The trainer's command could not be started (its python is gone, say)."""


class TrainerOutput:
    """The trainer's stdout+stderr: each line, time-stamped, to the worker's log; the last lines kept for a
    failure report."""

    def __init__(self, log_path: Path, stream: BinaryIO) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "ab")  # closed by close()
        self.lock = threading.Lock()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: BinaryIO) -> None:
        for raw in iter(stream.readline, b""):
            self.write(raw)

    def write(self, raw: bytes) -> None:
        with self.lock:
            self.log.write(
                rundir.log_timestamp().encode() + b" " + (raw if raw.endswith(b"\n") else raw + b"\n")
            )
            self.log.flush()
            self.tail.append(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def say(self, message: str) -> None:
        self.write(f"[supervisor] {message}\n".encode())

    def close(self) -> None:
        self.thread.join(timeout=10)
        with self.lock:
            self.log.close()


class Supervisor:
    def __init__(
        self,
        ctx: WorkerContext,
        argv: list[str],
        attempt: int,
        hang_timeout: float,
        storage: Any,
        startup_timeout: float = 1800.0,
    ) -> None:
        self.ctx = ctx
        self.argv = argv
        self.attempt = attempt
        self.hang_timeout = hang_timeout
        self.startup_timeout = startup_timeout
        """``train.startup_timeout``: the patience of the ``starting`` phase, and when the peers must all be
        up."""
        self.peers_checked = False
        self.storage = storage
        self.record_path = rundir.attempt_record(attempt, ctx.worker_id)
        self.record: dict[str, Any] = {
            "worker": ctx.worker_id,
            "name": ctx.layout.name(ctx.worker_id),
            "attempt": attempt,
            "host": socket.gethostname(),
            "supervisor_pid": os.getpid(),
            "status": "starting",
            "started": time.time(),
        }
        self.stop_reason: str | None = None
        self.hang: tuple[str, bool] | None = None
        """(what happened, whether it was only waiting for peers) once the trainer is declared hung."""
        self.stop_sent_at: float | None = None
        self.killed = False
        self.pending_stop: str | None = None
        """Set by the signal handler (SIGTERM from ``tpuft stop``), acted on at the next tick."""
        self.trainer_started = time.time()
        self.sidecar: TrackingSidecar | None = None
        """The chief's tracker sidecar (``report.to``: wandb, mlflow), beside the trainer; never its
        concern."""
        self.relay = Relay(ctx.run_dir, ctx.worker_id, attempt)
        """Checkpoint requests (``tpuft checkpoint``) into the trainer's control folder, polled with the stop
        request."""
        self.cost_guard: CostGuard | None = None
        """Worker 0's watch over ``train.max_cost`` once the trainer runs (None elsewhere, or without the
        key)."""
        self.maintenance: MaintenanceNotices | None = None
        """The host's maintenance notices, polled beside the trainer (None where there is nothing to poll)."""

    # -- records --------------------------------------------------------------------------------------------
    def publish(self, **changes: Any) -> None:
        self.record.update(changes, alive=time.time())
        text = json.dumps(self.record, indent=2, sort_keys=True)
        try:
            if self.record.get("status") in rundir.FAILED and "status" in changes:  # the peers poll for these
                self.storage.write_text(rundir.failure_record(self.attempt, self.ctx.worker_id), text)
            self.storage.write_text(self.record_path, text)
        except Exception as exc:  # noqa: BLE001 - the bucket may hiccup; the next beat retries, training goes on
            print(f"[supervisor] cannot write {self.record_path}: {exc}", flush=True)

    # -- the run --------------------------------------------------------------------------------------------
    def run(self) -> int:
        syncer = self._stage() if self.ctx.remote else None
        output = None
        try:
            env = {**os.environ, "TPUFT_ATTEMPT": str(self.attempt)}
            log = rundir.log_path(self.ctx.run_dir, self.ctx.worker_id)
            self.relay.clear()
            try:
                trainer = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                )
            except OSError as exc:  # what a shell would report as exit 126/127: one line, no traceback
                raise StartError(
                    f"worker {self.ctx.worker_id}: cannot start {self.argv[0]}: {exc.strerror or exc}"
                ) from None
            assert trainer.stdout is not None
            output = TrainerOutput(log, trainer.stdout)
            output.say(
                f"attempt {self.attempt}: trainer pid {trainer.pid} started (supervisor pid {os.getpid()})"
            )
            self.trainer_started = time.time()
            self.publish(status="running", trainer_pid=trainer.pid, trainer_ticks=start_ticks(trainer.pid))
            with worker_lock():
                write_current({**read_current(), "status": "running", "trainer_pid": trainer.pid})
            self.sidecar = TrackingSidecar.start(self.ctx, self.storage, output)
            self.maintenance = MaintenanceNotices.start(self.ctx, self.storage, self.attempt, output.say)
            self.cost_guard = CostGuard.start(
                self.ctx.worker_id,
                self.attempt,
                self.storage,
                output.say,
                remote=self.ctx.remote,
                poll_seconds=control_poll_seconds(self.ctx.remote),
            )
            code = self._watch(trainer, output)
            return self._end(code, output, syncer)
        except BaseException as exc:
            reason = (
                str(exc) if isinstance(exc, StartError) else f"supervisor error: {type(exc).__name__}: {exc}"
            )
            self.publish(status="failed", reason=reason[:2000], ended=time.time(), final=True)
            rundir.finalize_run(self.storage, self.attempt)
            if isinstance(exc, StartError):
                print(reason, flush=True)
                return 1
            raise
        finally:
            if self.sidecar is not None:
                self.sidecar.kill()  # ended by _end already, unless the supervisor itself failed
            if output is not None:
                output.close()
            with worker_lock():
                current = read_current()
                if current.get("supervisor_pid") == os.getpid():
                    write_current({**current, "status": "ended", "ended": time.time()})

    def _stage(self) -> Any:
        """A gs:// run dir: the trainer writes a local staging folder; mirror it to the bucket while it
        grows."""
        from tpuft.storage.sync import RunDirSync

        self.ctx.run_dir.mkdir(parents=True, exist_ok=True)
        text = self.storage.read_text(rundir.RECIPE)
        if text is None:
            raise SystemExit(f"tpuft supervisor: {self.ctx.run_url}/{rundir.RECIPE} not found")
        (self.ctx.run_dir / rundir.RECIPE).write_text(text)
        syncer = RunDirSync(self.ctx.run_dir, self.storage)
        # what is here already came from there, or is an earlier attempt's: not sent again
        syncer.changed_files()
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
                    else:
                        self._relay()
                        self._guard_cost(trainer, output)
                if self.stop_reason is None and (asked := self.relay.stop_reason()):
                    self._stop_after_checkpoint(trainer, output, asked)
                hang = self._startup_check() or self._hang_check(trainer.pid)
                if hang is not None:
                    self.hang = hang
                    output.say(f"{self.ctx.layout.name(self.ctx.worker_id)} {hang[0]}: stopping it")
                    # a stopped (SIGSTOP) process cannot act on SIGTERM
                    kill_group(trainer.pid, signal.SIGKILL)
                    self.publish(
                        status="hung",
                        reason=hang[0],
                        waiting=hang[1],
                        ended=time.time(),
                        tail=list(output.tail),
                    )
            elif (
                self.stop_sent_at is not None
                and not self.killed
                and now - self.stop_sent_at > STOP_GRACE_SECONDS
            ):
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
            who = culprit.get("name") or f"worker {culprit.get('worker')}"
            return f"{who} {'hung' if culprit.get('status') == 'hung' else 'failed'}"
        return None

    def _relay(self) -> None:
        try:
            self.relay.poll(self.storage)
        except Exception as exc:  # noqa: BLE001 - a bucket hiccup: look again next time
            print(f"[supervisor] cannot relay the run's checkpoint requests: {exc}", flush=True)

    def _guard_cost(self, trainer: subprocess.Popen[bytes], output: TrainerOutput) -> None:
        """``train.max_cost`` (:mod:`tpuft.worker.supervisor.cost_guard`): its ask for a stopping checkpoint
        is relayed like any other; only when no checkpoint follows does it stop the run outright, as a stop
        request would."""
        if self.cost_guard is None:
            return
        try:
            reason = self.cost_guard.poll(self._beat())
        except Exception as exc:  # noqa: BLE001 - a week's run is never lost to its own cost check
            print(
                f"[supervisor] train.max_cost is not watched any more: {type(exc).__name__}: {exc}",
                flush=True,
            )
            self.cost_guard = None
            return
        if reason:
            self._stop_after_checkpoint(trainer, output, reason)

    def _stop_after_checkpoint(
        self, trainer: subprocess.Popen[bytes], output: TrainerOutput, reason: str
    ) -> None:
        """The trainer saved the checkpoint asked for with ``stop``: stopped as ``tpuft stop`` would, the
        chief's supervisor writing the run's stop request with the reason (every worker stops; run.json's
        cause)."""
        if self.ctx.worker_id == 0:
            try:
                self.storage.write_text(
                    rundir.stop_request(self.attempt), json.dumps({"reason": reason, "time": time.time()})
                )
            except Exception as exc:  # noqa: BLE001 - the peers stop on their own trainers' answers too
                print(f"[supervisor] cannot write the stop request: {exc}", flush=True)
        self._stop(trainer, output, reason)

    def _stop(self, trainer: subprocess.Popen[bytes], output: TrainerOutput, reason: str) -> None:
        self.stop_reason = reason
        output.say(f"stopping the trainer: {reason}")
        kill_group(trainer.pid, signal.SIGTERM)
        self.stop_sent_at = time.monotonic()

    def _beat(self) -> dict[str, Any]:
        return rundir.read_json(rundir.heartbeat_path(self.ctx.run_dir, self.ctx.worker_id)) or {}

    def _startup_check(self) -> tuple[str, bool] | None:
        """Once, ``train.startup_timeout`` after the trainer started: the peers that are not up yet, named,
        end the run (as a wait for them: the missing hosts are the cause, not this one)."""
        waited = time.time() - self.trainer_started
        if self.peers_checked or waited < self.startup_timeout:
            return None
        self.peers_checked = True
        try:
            missing = [
                w
                for w in not_up(self.storage, self.attempt, self.ctx.num_workers, self.trainer_started - 5.0)
                if w != self.ctx.worker_id
            ]
        except Exception as exc:  # noqa: BLE001 - a bucket hiccup is no verdict on the peers
            print(f"[supervisor] cannot read the peers' records: {exc}", flush=True)
            return None
        if not missing:
            return None
        return (
            f"waited {waited:.0f} s (train.startup_timeout {self.startup_timeout:.0f} s) for "
            f"{names(self.ctx.layout, missing)} to start",
            True,
        )

    def _hang_check(self, pid: int) -> tuple[str, bool] | None:
        """(what, waiting) when the trainer has made no progress for too long, else None."""
        beat = self._beat()
        beat_time = float(beat.get("time") or 0.0)
        if (
            beat_time < self.trainer_started
        ):  # nothing yet from this attempt (an earlier one's beat is still there)
            beat, beat_time = {"phase": "starting"}, self.trainer_started
        quiet = time.time() - beat_time
        phase = str(beat.get("phase") or "step")
        step = beat.get("step")
        limit = (
            max(self.hang_timeout * PATIENT_FACTOR, PATIENT_MIN_SECONDS)
            if phase in PATIENT_PHASES
            else self.hang_timeout
        )
        if (
            phase == "starting"
        ):  # the runtime's rendezvous waits for every host of every slice: as long as allowed
            limit = max(limit, self.startup_timeout)
        if quiet <= limit:
            return None
        stopped = process_state(pid) in {"T", "t"}
        at = f"(last step {step}, phase {phase})" if step is not None else f"(phase {phase})"
        if phase == "collective" and not stopped:
            if quiet <= self.hang_timeout * WAITING_FACTOR:
                return None  # waiting for a peer: that peer's supervisor reports it
            return (
                f"waited for its peers in a collective for {quiet:.0f} s and none reported a failure {at}",
                True,
            )
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
            status, extra = (
                "failed",
                {"reason": f"exit code {code}" if code > 0 else f"killed by signal {-code}"},
            )
        if self.hang is None:
            self.publish(status=status, exit_code=code, ended=ended, tail=list(output.tail), **extra)
        output.say(f"trainer ended: {status} (exit code {code})")
        if self.sidecar is not None:
            # before the last upload: tracking.json and wandb/ go up with the rest
            self.sidecar.stop(status, output)
        output.close()
        if syncer is not None:
            syncer.close()  # the last metrics, checkpoints, export and the whole log reach the bucket
        self.publish(final=True)
        rundir.finalize_run(self.storage, self.attempt)
        return 0
