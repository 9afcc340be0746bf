"""The tracker sidecar's rig: a synthetic run dir (a recipe.yaml with a ``report`` section, a metrics.jsonl as
the trainers write it, test predictions) and the sidecar run on it in the tracking venv, no training. A
``stop`` written first makes the sidecar do one pass and finish, as the supervisor's stop file does at a
trainer's end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tpuft.run import rundir

REPO = Path(__file__).resolve().parents[2]

TRAIN = [
    {
        "step": s,
        "time": 1_700_000_000.0 + s,
        "loss": round(5.0 / s, 6),
        "lr": 0.001 * s,
        "examples_per_s": 20.5,
    }
    for s in (10, 20, 30, 40)
]
EVAL = [
    {"step": 20, "time": 1_700_000_021.0, "eval_loss": 1.5, "eval_token_accuracy": 0.5},
    {
        "step": 20,
        "time": 1_700_000_022.0,
        "eval_exact_match": 0.25,
        "eval_examples": 8,
        "checkpoint": "checkpoint_20",
    },
    {"step": 40, "time": 1_700_000_041.0, "eval_loss": 1.25, "eval_token_accuracy": 0.625},
    {
        "step": 40,
        "time": 1_700_000_042.0,
        "eval_exact_match": 0.5,
        "eval_examples": 8,
        "checkpoint": "checkpoint_40",
    },
]
"""Two eval rows per evaluation at one step, as one backend writes its loss and its decoded scores apart."""
TEST = {
    "step": 40,
    "time": 1_700_000_050.0,
    "test_exact_match": 0.375,
    "test_accuracy": 0.375,
    "test_examples": 8,
}


def rows_in_order() -> list[dict[str, Any]]:
    return sorted([*TRAIN, *EVAL, TEST], key=lambda r: (r["step"], r["time"]))


def write_run_dir(run_dir: Path, report: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe = {
        "name": "synthetic",
        "backend": {"kind": "torch_xla"},
        "train": {"steps": 40, "batch_size": 8},
        "report": {"to": ["tensorboard", "wandb", "mlflow"], "samples": 3, **report},
    }
    (run_dir / rundir.RECIPE).write_text(yaml.safe_dump(recipe))
    with (run_dir / rundir.METRICS).open("a") as handle:
        for row in rows_in_order() if rows is None else rows:
            handle.write(json.dumps(row) + "\n")
    test = run_dir / rundir.TEST_DIR
    test.mkdir(exist_ok=True)
    (test / "predictions-00000.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "id": i,
                    "input": f"in {i}",
                    "prediction": f"p{i}",
                    "target": f"p{i if i % 2 else i + 1}",
                    "correct": bool(i % 2),
                }
            )
            + "\n"
            for i in range(5)
        )
    )
    return run_dir


def run_sidecar(
    python: str,
    run_dir: Path,
    *,
    stop: str | None = "finished",
    env: dict[str, str] | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """The sidecar on ``run_dir`` to its end; ``stop`` (the trainer's outcome) written first."""
    if stop is not None:
        rundir.write_json_atomic(run_dir / rundir.TRACKING_STOP, {"status": stop})
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    full = {**clean, "PYTHONPATH": str(REPO), "TPUFT_TRACKING_POLL_SECONDS": "0.1", **(env or {})}
    return subprocess.run(
        [
            python,
            "-m",
            "tpuft.worker.tracking.sidecar",
            "--run-dir",
            str(run_dir),
            "--run-id",
            "synthetic-1",
            "--accelerator",
            "v4-8",
        ],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        cwd=run_dir,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
