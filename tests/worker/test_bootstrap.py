"""The stdlib-only bootstrap that builds a backend venv on a worker: cached by key, rebuilt when incomplete or built
by another Python, built once when several workers share a disk. Real venvs, real pip (offline: the requirement is
pip itself, already satisfied, so nothing is downloaded)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from tpuft.worker import bootstrap

SPEC = {"key": "unit-venv", "requirements": ["pip"], "python": sys.executable, "pip_args": []}


def test_builds_once_then_reuses(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    venv = bootstrap.ensure_venv(tmp_path, SPEC)
    assert bootstrap.is_ready(venv) and (venv / "bin" / "python").exists()
    marker = json.loads((venv / bootstrap.MARKER).read_text())
    assert marker["requirements"] == ["pip"] and marker["python"] == bootstrap.PYTHON
    built_at = marker["built_at"]
    bootstrap.ensure_venv(tmp_path, SPEC)
    assert "venv ready (cached)" in capsys.readouterr().out
    assert json.loads((venv / bootstrap.MARKER).read_text())["built_at"] == built_at


def test_an_interrupted_or_stale_build_is_rebuilt(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    venv = tmp_path / SPEC["key"]
    (venv / "bin").mkdir(parents=True)  # a build that died before its marker
    (venv / "junk").write_text("left over")
    assert not bootstrap.is_ready(venv)
    bootstrap.ensure_venv(tmp_path, SPEC)
    assert "removing an incomplete or stale venv" in capsys.readouterr().out and not (venv / "junk").exists()
    (venv / bootstrap.MARKER).write_text(json.dumps({"python": "2.7"}))  # the host's python3 was upgraded since
    assert not bootstrap.is_ready(venv)
    (venv / bootstrap.MARKER).write_text("{not json")
    assert not bootstrap.is_ready(venv)


def test_workers_sharing_a_disk_build_it_once(tmp_path: Path) -> None:
    outputs: list[str] = []

    def worker() -> None:
        out = subprocess.run(
            [sys.executable, bootstrap.__file__, "--cache", str(tmp_path), "--spec", json.dumps(SPEC)],
            capture_output=True, text=True, check=True,
        )
        outputs.append(out.stdout)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum("venv built in" in out for out in outputs) == 1
    assert sum("built by another worker" in out or "(cached)" in out for out in outputs) == 2


def test_check_mode_reports_without_building(tmp_path: Path) -> None:
    argv = [sys.executable, bootstrap.__file__, "--cache", str(tmp_path), "--spec", json.dumps(SPEC), "--check"]
    missing = subprocess.run(argv, capture_output=True, text=True)
    assert missing.returncode == 3 and "missing" in missing.stdout and not (tmp_path / SPEC["key"]).exists()
