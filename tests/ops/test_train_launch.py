"""A run whose trainer never starts says so: `failed` with the cause in run.json, one clear error, no traceback.

The venv here is a real folder that tpuft's bootstrap accepts as built (its completion marker) but whose python is
gone, as after a half-finished clean-up of the cache: nothing is mocked, the worker process just cannot start.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tpuft.backends.torch_xla import BACKEND
from tpuft.backends.torch_xla import TorchXlaBackend
from tpuft.worker.bootstrap import MARKER

RECIPE = """\
name: t
backend: {kind: torch_xla}
model: {config: {d_model: 16}}
data: {train: train.jsonl}
train: {steps: 2, batch_size: 2}
"""


def test_a_trainer_that_cannot_start_leaves_a_failed_run(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cache = tmp_path / "venvs"
    cluster.write_text(f"name: broken\nlocal:\n  workers: 2\n  venv_cache: {cache}\n  python: {sys.executable}\n")
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 4)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    assert cli("create", "-c", str(cluster)).code == 0
    key = BACKEND.env_spec(TorchXlaBackend(), "cpu", sys.executable).key
    (cache / key).mkdir(parents=True)
    (cache / key / MARKER).write_text(json.dumps({"python": f"{sys.version_info.major}.{sys.version_info.minor}"}))

    result = cli("train", str(recipe), "-c", str(cluster))
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    assert f"worker 0: cannot start {cache / key / 'bin' / 'python'}: No such file or directory" in result.err
    bucket = Path(json.loads(cli("status", "-c", str(cluster), "--json").out)["bucket"])
    runs = list((bucket / "runs").iterdir())
    assert len(runs) == 1
    info = json.loads((runs[0] / "run.json").read_text())
    assert info["status"] == "failed" and "cannot start" in info["cause"]
