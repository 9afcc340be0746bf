"""Where a run is tracked, as the readers show it: ``runs show`` / ``monitor`` (the snapshot view and its
JSON) from the sidecar's tracking.json while the run goes on, and from run.json's ``tracking`` once it has
ended."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from tpuft.cli.render import snapshot_view
from tpuft.readers import runs
from tpuft.run import rundir

STATE = {
    "wandb": {
        "id": "ab12cd34",
        "project": "p",
        "mode": "offline",
        "dir": "wandb/offline-run-1-ab12cd34",
        "rows": 9,
        "marks": {"loss": 40},
    },
    "mlflow": {
        "run_id": "f00d",
        "tracking_uri": "sqlite:////runs/r/mlflow.db",
        "experiment": "e",
        "rows": 9,
        "marks": {"loss": 40},
    },
}


def shown(run_dir: Path) -> tuple[str, dict[str, object]]:
    snap = runs.snapshot(run_dir)
    console = Console(width=200, record=True)
    console.print(snapshot_view(snap))
    return console.export_text(), snap.as_json()["tracking"]


def test_a_running_run_shows_the_sidecars_state_and_an_ended_one_run_json(tmp_path: Path) -> None:
    (tmp_path / rundir.RUN_INFO).write_text(
        json.dumps({"run_id": "r", "status": "running", "total_steps": 40})
    )
    (tmp_path / rundir.TRACKING).write_text(json.dumps(STATE))
    text, entry = shown(tmp_path)
    assert (
        "tracked in wandb: p/ab12cd34 (offline: wandb sync <run dir>/wandb/offline-run-1-ab12cd34), 9 rows"
        in text
    )
    assert "tracked in mlflow: run f00d in sqlite:////runs/r/mlflow.db (experiment e), 9 rows" in text
    assert entry == rundir.tracking_entry(STATE) and "marks" not in entry["wandb"]  # type: ignore[operator]
    online = {"wandb": {"id": "x9", "url": "https://wandb.ai/team/p/runs/x9", "mode": "online", "rows": 12}}
    (tmp_path / rundir.RUN_INFO).write_text(
        json.dumps({"run_id": "r", "status": "finished", "tracking": online})
    )
    text, entry = shown(tmp_path)
    assert "tracked in wandb: https://wandb.ai/team/p/runs/x9, 12 rows" in text and "mlflow" not in text
    assert entry == online
    (tmp_path / rundir.TRACKING).unlink()
    (tmp_path / rundir.RUN_INFO).write_text(json.dumps({"run_id": "r", "status": "finished"}))
    text, entry = shown(tmp_path)
    assert "tracked in" not in text and entry == {}
