"""The supervisor's side of the tracker sidecar: start it beside the chief's trainer, stop it after, never let
it matter to training.

The controller names the tracking venv's python in ``TPUFT_TRACKING_PYTHON`` (only for a recipe whose
``report.to`` names wandb or mlflow); the chief's supervisor then starts ``python -m
tpuft.worker.tracking.sidecar`` in its own process group with the same environment as the trainer
(``worker_env``'s ``WANDB_API_KEY`` or ``MLFLOW_TRACKING_URI`` included: never argv), and writes the sidecar's
lines into the chief's log. At the end it writes the trainer's outcome to ``tracking-stop.json`` and gives the
sidecar a while to send the rest; a sidecar that does not end in time is killed. Nothing here raises: a
sidecar that cannot start is a warning in the log.

Stdlib only: it runs in the supervisor, in the backend venv.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tpuft.config.tracking_env import PYTHON_ENV
from tpuft.host.state import kill_group
from tpuft.run import rundir
from tpuft.worker.context import WorkerContext

STOP_WAIT_SECONDS = float(os.environ.get("TPUFT_TRACKING_STOP_SECONDS", "120"))
"""How long the chief's supervisor waits for the sidecar to send its last rows, the summary and the samples
(an online tracker's upload may take a while; the run's outcome in run.json waits for it)."""


class TrackingSidecar:
    def __init__(self, process: subprocess.Popen[bytes], pump: threading.Thread, run_dir: Path) -> None:
        self.process = process
        self.pump = pump
        self.run_dir = run_dir

    @classmethod
    def start(cls, ctx: WorkerContext, storage: Any, output: Any) -> TrackingSidecar | None:
        """The sidecar, started, when this worker is the chief and the run asks for trackers; else None."""
        python = os.environ.get(PYTHON_ENV)
        if not python or not ctx.chief:
            return None
        try:
            (ctx.run_dir / rundir.TRACKING_STOP).unlink(missing_ok=True)  # an earlier attempt's
            if ctx.remote and not (ctx.run_dir / rundir.TRACKING).exists():  # a recovered run on a new node
                state = storage.read_text(rundir.TRACKING)
                if state is not None:
                    (ctx.run_dir / rundir.TRACKING).write_text(state)
            info = rundir.read_json_text(storage.read_text(rundir.RUN_INFO)) or {}
            env = {key: value for key, value in os.environ.items() if key != PYTHON_ENV}
            process = subprocess.Popen(
                [
                    python,
                    "-m",
                    "tpuft.worker.tracking.sidecar",
                    "--run-dir",
                    str(ctx.run_dir),
                    "--run-id",
                    ctx.run_id,
                    "--accelerator",
                    str(info.get("accelerator") or ""),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=str(ctx.run_dir),
            )
        except Exception as exc:  # noqa: BLE001 - no tracking is a warning, never a failed run
            output.say(
                f"WARNING: the tracking sidecar did not start ({type(exc).__name__}: {exc}); training "
                "goes on without W&B/MLflow (metrics.jsonl and TensorBoard have every row)"
            )
            return None
        assert process.stdout is not None
        stream = process.stdout
        pump = threading.Thread(
            target=lambda: [output.write(raw) for raw in iter(stream.readline, b"")], daemon=True
        )
        pump.start()
        output.say(f"tracking sidecar pid {process.pid} started")
        return cls(process, pump, ctx.run_dir)

    def stop(self, status: str, output: Any, wait: float = STOP_WAIT_SECONDS) -> None:
        """Tell the sidecar how the trainer ended and let it finish; kill it after ``wait`` seconds."""
        try:
            rundir.write_json_atomic(
                self.run_dir / rundir.TRACKING_STOP, {"status": status, "time": time.time()}
            )
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            output.say(
                f"WARNING: the tracking sidecar did not finish in {wait:.0f} s: stopped it (the trackers may "
                "lack the last rows; metrics.jsonl has them)"
            )
            self.kill()
        except Exception as exc:  # noqa: BLE001
            output.say(f"WARNING: stopping the tracking sidecar: {type(exc).__name__}: {exc}")
            self.kill()
        self.pump.join(timeout=5)

    def kill(self) -> None:
        if self.process.poll() is None:
            kill_group(self.process.pid, signal.SIGKILL)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
