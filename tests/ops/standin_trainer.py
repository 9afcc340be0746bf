"""The stand-in trainer (run by tests/ops/standin.py's ``bin/python``): beats like a trainer and ends as told.

``$HOME/standin.json`` (all optional): ``seconds`` to run (default 3600), ``exit`` code at the end (0),
``beat`` interval (0.1 s), ``wait_for_peer``: beat ``collective`` and stop beating once worker 1-i has been
silent for a second, as a trainer blocked in an all-reduce would, ``ignore_term``: survive SIGTERM (only
SIGKILL ends it), and ``start_after``: seconds spent in the ``starting`` phase first (one beat, then silence,
like a runtime waiting in its rendezvous for a host that has not come). It records its pid and environment in
``$HOME/trainer.json`` so that tests can check the launch and find the process."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tpuft.run import rundir
from tpuft.worker.context import WorkerContext
from tpuft.worker.multislice import apply_megascale_env


def main() -> int:
    home = Path(os.environ["HOME"])
    plan = json.loads((home / "standin.json").read_text()) if (home / "standin.json").exists() else {}
    ctx = WorkerContext.from_env()
    # as tpuft.worker's main does: the MEGASCALE variables land in trainer.json
    multislice = apply_megascale_env(ctx)
    (home / "trainer.json").write_text(
        json.dumps({"pid": os.getpid(), "argv": sys.argv, "env": dict(os.environ)})
    )
    if plan.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(
        f"stand-in trainer {ctx.worker_id} of {ctx.num_workers} (resume: "
        f"{os.environ.get('TPUFT_RESUME', '0')})",
        flush=True,
    )
    if multislice:
        print(multislice, flush=True)
    beat = rundir.heartbeat_path(ctx.run_dir, ctx.worker_id)
    if plan.get("start_after"):
        rundir.write_json_atomic(
            beat, {"step": 0, "status": "running", "phase": "starting", "time": time.time()}
        )
        time.sleep(float(plan["start_after"]))
    started = time.time()
    step = 0
    peer = rundir.heartbeat_path(ctx.run_dir, 1 - ctx.worker_id) if ctx.num_workers == 2 else None
    while time.time() - started < float(plan.get("seconds", 3600)):
        step += 1
        phase = "step"
        if plan.get("wait_for_peer") and peer is not None:
            other = rundir.read_json(peer) or {}
            if time.time() - float(other.get("time", time.time())) > 1.0:
                phase = "collective"
                rundir.write_json_atomic(
                    beat, {"step": step, "status": "running", "phase": phase, "time": time.time()}
                )
                while True:  # blocked in the collective: no more beats
                    time.sleep(1)
        rundir.write_json_atomic(
            beat, {"step": step, "status": "running", "phase": phase, "time": time.time()}
        )
        if step % 10 == 0:
            print(f"step {step}", flush=True)
        time.sleep(float(plan.get("beat", 0.1)))
    code = int(plan.get("exit", 0))
    print(f"stand-in trainer {ctx.worker_id} ends with exit code {code}", flush=True)
    rundir.write_json_atomic(
        beat, {"step": step, "status": "finished" if code == 0 else "failed", "time": time.time()}
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
