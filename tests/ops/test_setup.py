"""setup: ships the tpuft package to the workers of the backend's launch plan and runs the venv bootstrap there, in
parallel; a venv already built is reused (here one marked built: see tests/ops/standin.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.ops.standin import built_venv
from tpuft.ops.common import package_hash


def test_setup_ships_the_package_and_finds_the_venv_on_every_planned_worker(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, venv = built_venv(tmp_path, cli, None)
    result = cli("setup", str(recipe), "-c", str(cluster), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["venv"] == str(venv) and report["backend"] == "torch_xla"
    homes = [Path(os.environ["TPUFT_HOME"]) / "local" / "stand-in" / "workers" / f"worker-{i}" for i in range(2)]
    for home in homes:
        shipped = home / ".tpuft" / "pkg" / package_hash() / "tpuft"
        assert (shipped / "worker" / "bootstrap.py").is_file() and not list(shipped.rglob("__pycache__"))
    assert result.err.count("venv ready (cached)") == 2  # each worker checked it, none rebuilt it
