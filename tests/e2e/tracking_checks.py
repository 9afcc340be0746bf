"""What a run's trackers must hold, checked against the run dir: the e2e quickstarts (``report.to=[wandb,
mlflow]``) and tests/tracking call :func:`check_tracking` after a run. Read back with the trackers' own
readers in the tracking venv (tests/tracking/readback.py): the W&B offline run(s) under ``wandb/`` and the
MLflow run ``tracking.json`` names must hold every train and eval row of ``metrics.jsonl`` (what ``tpuft
monitor --plot`` draws) at its step and each point once, the resolved recipe as config, the backend /
accelerator / run id tags, the test metrics as the summary and the prediction-samples table."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tpuft.run import rundir

REPO = Path(__file__).resolve().parents[2]
REPORT = "report={to: [tensorboard, wandb, mlflow], wandb: {mode: offline}, samples: 10}"
"""The ``--set`` an e2e quickstart trains with: W&B offline into the run dir, MLflow into its SQLite store."""


def read_back(python: str, run_dir: Path) -> dict[str, Any]:
    """The readback JSON (``{"wandb": [runs], "mlflow": {run}}``) for ``run_dir``, from the tracking venv
    ``python``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [python, "-m", "tests.tracking.readback", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=run_dir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def numbers(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k not in {"step", "time"} and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def check_tracking(
    run_dir: Path,
    *,
    run_id: str,
    backend: str,
    accelerator: str | None = None,
    rows: list[dict[str, Any]] | None = None,
    python: str | None = None,
) -> dict[str, Any]:
    """Assert that W&B and MLflow hold the run's curves, config, tags, test summary and samples; returns the
    readback. ``rows``: the metrics rows to find (default: every row of metrics.jsonl); ``python``: the
    tracking venv's (default: built or found through tests/venvs.py)."""
    if python is None:
        from tests.venvs import tracking_python

        python = tracking_python()
    back = read_back(python, run_dir)
    rows = rundir.read_metrics(run_dir).rows if rows is None else rows
    recipe = yaml.safe_load((run_dir / rundir.RECIPE).read_text())
    test = rundir.test_items(next((r for r in reversed(rows) if rundir.test_items(r)), {}))
    wandb_runs = back["wandb"]
    assert wandb_runs, f"no W&B offline run under {run_dir}/wandb"
    assert len({run["id"] for run in wandb_runs}) == 1, "a resumed run must continue the same W&B run"
    history: dict[int, dict[str, Any]] = {}
    for run in wandb_runs:  # a resumed run's attempts each leave an offline folder of the same run id
        for item in run["history"]:
            seen = history.setdefault(item["step"], {})
            twice = [k for k in item if k in seen and not k.startswith("_") and k != "step"]
            assert not twice, f"W&B got {twice} at step {item['step']} twice"
            seen.update(item)
    mlflow = back["mlflow"]
    assert mlflow, "no MLflow run in tracking.json"
    for row in rows:
        for key, value in numbers(row).items():
            assert history.get(row["step"], {}).get(key) == value, (
                f"W&B lacks {key}={value} at step {row['step']}"
            )
            points = [v for s, v in mlflow["metrics"].get(key, []) if s == row["step"]]
            assert points == [value], f"MLflow has {key} at step {row['step']}: {points}, not [{value}]"
    last = wandb_runs[-1]
    assert last["config"].get("name") == recipe["name"] and last["config"].get("backend") == recipe["backend"]
    assert mlflow["params"]["name"] == recipe["name"] and mlflow["params"]["backend.kind"] == backend
    tags = {backend, run_id} | ({accelerator} if accelerator else set())
    assert tags <= set(last["tags"]), (tags, last["tags"])
    assert {f"tpuft.{k}": v for k, v in {"backend": backend, "run_id": run_id}.items()}.items() <= mlflow[
        "tags"
    ].items()
    assert mlflow["run_name"] == run_id
    if test:
        summary = {k: v for k, v in last["summary"].items() if k.startswith("test_")}
        assert summary == test, (summary, test)
        assert {k: points[-1][1] for k, points in mlflow["metrics"].items() if k.startswith("test_")} == test
    tables = [k for k in last["summary"] if k.startswith("samples/") and k.endswith("/_type")]
    if [
        *(run_dir / rundir.TEST_DIR).glob("predictions-*.jsonl"),
        *(run_dir / "eval").glob("predictions-*.jsonl"),
    ]:
        assert tables, "no samples table in W&B"
        assert mlflow["tables"], "no samples table in MLflow"
        table = next(iter(mlflow["tables"].values()))
        assert table["data"] and {"input", "prediction"} <= set(table["columns"])
    return back
