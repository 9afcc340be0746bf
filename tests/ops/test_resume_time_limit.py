"""``tpuft resume RUN --time-limit``: a run that finished because its ``train.time_limit`` was spent is
resumable, with the new limit written into the recipe its next attempt launches; any other finished run is
not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tpuft.config import dump_recipe, load_recipe, recipe_from_text


def finished_run(tmp_path: Path, beat: dict[str, Any]) -> tuple[Path, Path]:
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: budget\nbucket: {tmp_path / 'bucket'}\nlocal:\n  workers: 1\n")
    run_dir = tmp_path / "bucket" / "runs" / "demo-20261128-120000-0001"
    (run_dir / "heartbeat").mkdir(parents=True)
    info = {"run_id": run_dir.name, "provider": "local", "status": "finished", "attempt": 1, "recipe": "demo"}
    (run_dir / "run.json").write_text(json.dumps(info))
    recipe = load_recipe(REPO / "tpuft" / "recipes" / "quickstart.yaml", ["train.time_limit=1"]).value
    (run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
    (run_dir / "heartbeat" / "worker-0.json").write_text(json.dumps({"status": "finished", **beat}))
    return cluster, run_dir


def test_a_run_that_finished_at_its_time_limit_resumes_with_a_new_one(tmp_path: Path, cli: Any) -> None:
    cluster, run_dir = finished_run(tmp_path, {"step": 40, "ended": "time_limit"})
    assert cli("resume", run_dir.name, "-c", str(cluster), "--time-limit", "soon").code == 2
    resumed = cli("resume", run_dir.name, "-c", str(cluster), "--time-limit", "2h")
    recipe = recipe_from_text((run_dir / "recipe.yaml").read_text(), "recipe.yaml", check_files=False)
    assert recipe.train.time_limit == 7200.0
    assert "has finished" not in resumed.err  # past the check (this stand-in run has no launch)
    cli("resume", run_dir.name, "-c", str(cluster), "--time-limit", "5400")
    recipe = recipe_from_text((run_dir / "recipe.yaml").read_text(), "recipe.yaml", check_files=False)
    assert recipe.train.time_limit == 5400.0  # seconds, as in the recipe
    cli("resume", run_dir.name, "-c", str(cluster), "--time-limit", "0")
    recipe = recipe_from_text((run_dir / "recipe.yaml").read_text(), "recipe.yaml", check_files=False)
    assert recipe.train.time_limit is None


def test_a_run_that_finished_its_steps_is_not_resumed(tmp_path: Path, cli: Any) -> None:
    cluster, run_dir = finished_run(tmp_path, {"step": 1200})
    done = cli("resume", run_dir.name, "-c", str(cluster))
    assert done.code == 2 and "has finished: there is nothing to resume" in done.err
