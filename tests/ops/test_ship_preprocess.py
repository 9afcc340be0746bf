"""A remote run ships the preprocess hook's file with the data (its function name stays), and refuses a
Hugging Face dataset that only this machine can read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.backends.base import LaunchPlan
from tpuft.config import load_recipe
from tpuft.ops.ship_data import hook_parts, local_only_dataset, ship_data, shipped_data

QUICKSTART = Path(__file__).resolve().parents[2] / "tpuft" / "recipes" / "quickstart.yaml"


class _Fleet:
    def __init__(self) -> None:
        self.sent: list[tuple[Path, str]] = []

    def put(self, local: Path, remote: str, workers: Any = None) -> None:
        self.sent.append((local, remote))


class _Session:  # only what ship_data uses: the fleet's put (the sshd rig tests the real one)
    def __init__(self) -> None:
        self.fleet = _Fleet()


def test_the_hook_file_travels_and_the_recipe_names_the_copy(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    hooks.write_text("def clean(record):\n    return record\n")
    recipe = load_recipe(QUICKSTART, [f"data.preprocess={hooks}:clean"]).value
    plan = LaunchPlan(workers=(0, 1))
    assert shipped_data(recipe, plan)["preprocess"] == f"{hooks}:clean"
    session = _Session()
    shipped = ship_data(session, recipe, "run-1", plan)  # type: ignore[arg-type]
    assert shipped.data.preprocess == ".tpuft/data/run-1/preprocess-hooks.py:clean"
    assert (hooks, ".tpuft/data/run-1/preprocess-hooks.py") in session.fleet.sent
    assert hook_parts("gs://b/x.jsonl") == ("gs://b/x.jsonl", "") and hook_parts(None) == (None, "")


def test_a_dataset_on_this_machine_is_named_for_a_remote_run(tmp_path: Path) -> None:
    data = tmp_path / "part.jsonl"
    data.write_text('{"source": "a", "target": "b"}\n')
    base = ["data.train=null", "data.eval=null", "data.test=null", "data.hf.path=json"]
    local = load_recipe(QUICKSTART, [*base, f"data.hf.data_files=[{data}]"]).value
    assert "data.hf.data_files" in (local_only_dataset(local) or "")
    remote = load_recipe(QUICKSTART, [*base, "data.hf.data_files=[gs://bucket/part.jsonl]"]).value
    assert local_only_dataset(remote) is None
