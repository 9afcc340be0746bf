"""The worker-side supervisor: a run's trainer lives on the worker, not in the controller's SSH session.

``tpuft train`` starts one supervisor per launched worker (``start``) and returns to attaching (``follow``);
from then on the run does not depend on the controller, its terminal, its laptop or its connections. The
supervisor:

- runs the trainer in its own process group (its own session, as the supervisor is in another), writing every
  output line, time-stamped, to ``logs/worker-<i>.log`` on the worker's disk (the run dir, or the staging copy
  that it mirrors to a ``gs://`` run dir);
- records itself in the run dir (``attempts/<n>/worker-<i>.json``: running, alive every 15 s, how the trainer
  ended, then ``final`` once its files are uploaded; a failed or hung worker also in
  ``attempts/<n>/failures/``, the one folder its peers list);
- stops its trainer (SIGTERM to the group, SIGKILL after a grace period) when another worker's record says
  failed or hung, when ``attempts/<n>/stop.json`` appears (``tpuft stop``), or when it gets SIGTERM itself;
- declares its trainer hung when its heartbeat is older than the hang timeout (three times longer, at least a
  minute, while compiling, evaluating, checkpointing or exporting), unless the beat says it is waiting for its
  peers in a collective and the process is not stopped: a waiting worker is not the culprit (it gives up only
  after twice the timeout, when no peer has reported);
- as the last one to finish, writes the run's outcome into run.json (:func:`tpuft.run.rundir.finalize_run`).

On the worker, ``$HOME/.tpuft/supervisor/current.json`` names the run it supervises, so that a second run is
refused while this one lives and the leftovers of a dead one (a supervisor killed with its VM, a trainer that
outlived its supervisor, a process still holding the TPU chips) are cleaned before the next one starts
(``check``).

Stdlib only at import time (``follow`` and ``check`` must start fast); the storage layer is imported when
needed. This module is the command (``python -m tpuft.worker.supervisor.process
check|start|run|stop|follow``); the supervisor itself is :mod:`tpuft.worker.supervisor.supervision`, and this
host's state and its clean-up are :mod:`tpuft.host.state`; its exit codes and ``follow``'s marker, which the
controller reads, :mod:`tpuft.host.supervisor_cli`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tpuft.core.waiting import waiting
from tpuft.host.state import (
    check_worker,
    is_alive,
    kill_group,
    kill_pid,
    process_environ,
    read_current,
    start_ticks,
    state_dir,
    supervisor_alive,
    tpu_holders,
    worker_lock,
    write_current,
)
from tpuft.host.supervisor_cli import BUSY_EXIT, FROM_LINE_MARKER, NO_RUN_EXIT
from tpuft.run import rundir
from tpuft.worker.context import WorkerContext
from tpuft.worker.supervisor.supervision import STOP_GRACE_SECONDS, Supervisor

__all__ = [  # what the controller side and the tests use by this module's name
    "BUSY_EXIT",
    "FROM_LINE_MARKER",
    "NO_RUN_EXIT",
    "check_worker",
    "is_alive",
    "locate_start",
    "main",
    "process_environ",
    "read_current",
    "start_ticks",
    "tpu_holders",
    "write_current",
]


# ----------------------------------------------------------------------------------------------------------
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
                [
                    sys.executable,
                    "-m",
                    "tpuft.worker.supervisor.process",
                    "run",
                    "--argv",
                    args.argv,
                    "--attempt",
                    str(args.attempt),
                    "--hang-timeout",
                    str(args.hang_timeout),
                    "--startup-timeout",
                    str(args.startup_timeout),
                ],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=os.environ.get("HOME"),
            )
        write_current(
            {
                "run_id": ctx.run_id,
                "run_url": ctx.run_url,
                "attempt": args.attempt,
                "worker": ctx.worker_id,
                "supervisor_pid": daemon.pid,
                "supervisor_ticks": start_ticks(daemon.pid),
                "status": "starting",
                "started": time.time(),
                "output": str(out),
            }
        )
    with waiting(
        f"worker {ctx.worker_id}'s supervisor (pid {daemon.pid}) to start its trainer", args.wait
    ) as wait:
        while not wait.expired():
            current = read_current()
            if current.get("status") == "running" and current.get("supervisor_pid") == daemon.pid:
                print(
                    f"[supervisor] worker {ctx.worker_id}: trainer pid {current.get('trainer_pid')} "
                    f"under supervisor pid {daemon.pid}",
                    flush=True,
                )
                return 0
            if daemon.poll() is not None:
                break
            time.sleep(0.05)
    tail = out.read_bytes()[-3000:].decode("utf-8", "replace") if out.exists() else ""
    code = daemon.poll()
    why = f"exit code {code}" if code is not None else f"still starting after {args.wait} s"
    print(
        f"[supervisor] worker {ctx.worker_id}: the supervisor did not start its trainer ({why})",
        flush=True,
    )
    print(tail, flush=True)
    if daemon.poll() is None:
        kill_group(daemon.pid, signal.SIGKILL)
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    ctx = WorkerContext.from_env()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    supervisor = Supervisor(
        ctx,
        json.loads(args.argv),
        args.attempt,
        args.hang_timeout,
        _open_storage(ctx),
        startup_timeout=args.startup_timeout,
    )

    def on_signal(signum: int, frame: object) -> None:
        supervisor.request_stop(f"stop requested on worker {ctx.worker_id} ({signal.Signals(signum).name})")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.run()


def cmd_stop(args: argparse.Namespace) -> int:
    """SIGTERM this worker's supervisor of run ``--run`` (it stops its trainer and records why); wait for
    it."""
    current = read_current()
    if current.get("run_id") != args.run or not supervisor_alive(current):
        print(f"[supervisor] no live supervisor of run {args.run} on this worker", flush=True)
        return 0
    pid = int(current["supervisor_pid"])
    kill_pid(pid, signal.SIGTERM)
    with waiting(
        f"the supervisor of run {args.run} (pid {pid}) to stop its trainer and end", args.wait
    ) as wait:
        while not wait.expired() and is_alive(pid, current.get("supervisor_ticks")):
            time.sleep(0.1)
    if is_alive(pid, current.get("supervisor_ticks")):
        trainer = current.get("trainer_pid")
        if trainer:
            kill_group(int(trainer), signal.SIGKILL)
        kill_pid(pid, signal.SIGKILL)
        print(
            f"[supervisor] the supervisor (pid {pid}) did not end in {args.wait:.0f} s: killed it and its "
            "trainer",
            flush=True,
        )
    else:
        print(f"[supervisor] stopped run {args.run}", flush=True)
    return 0


def cmd_follow(args: argparse.Namespace) -> int:
    """Print this worker's log of the run, from a line on, until its supervisor has ended and the log is
    read."""
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
                out.append(
                    (f"{stamp} " if args.timestamps and stamp else "") + text.decode("utf-8", "replace")
                )
            index += 1
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()
        if not running and not data:
            return 0
        time.sleep(0.2)


def locate_start(path: Path, from_line: int, tail: int | None, since: str | None) -> tuple[int, int, int]:
    """Where ``follow`` starts in a log that may hold a week of lines: (the first line to send, the index of
    the line at ``offset``, ``offset`` in bytes), in one streaming pass that keeps only the offsets it may
    need. The first line to send is the latest of ``from_line``, the last ``tail`` lines and the first line
    stamped ``since`` or later."""
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
    parser = argparse.ArgumentParser(
        prog="python -m tpuft.worker.supervisor.process", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="is this worker free? clean the leftovers of dead runs")
    check.add_argument("--free-tpu", action="store_true")
    for name in ("start", "run"):
        cmd = sub.add_parser(name)
        cmd.add_argument(
            "--argv",
            required=True,
            help="the trainer's command (the backend venv's python first), as a JSON list",
        )
        cmd.add_argument("--attempt", type=int, default=1)
        cmd.add_argument("--hang-timeout", type=float, default=600.0)
        cmd.add_argument("--startup-timeout", type=float, default=1800.0)
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
    commands = {
        "check": cmd_check,
        "start": cmd_start,
        "run": cmd_run,
        "stop": cmd_stop,
        "follow": cmd_follow,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
