"""The stdlib-only bootstrap that builds a backend venv on a worker: cached by key, rebuilt when incomplete or
built by another Python, built once when several workers share a disk; ``--no-deps`` installs after the pinned
set, and a newer interpreter when the pins need one. Real venvs, real pip (offline: the requirement is pip
itself, already satisfied, and the other packages are local wheels, so nothing is downloaded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.venvs import tiny_wheel
from tpuft.backends.base import EnvSpec
from tpuft.host import bootstrap

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
    # the host's python3 was upgraded since
    (venv / bootstrap.MARKER).write_text(json.dumps({"python": "2.7"}))
    assert not bootstrap.is_ready(venv)
    (venv / bootstrap.MARKER).write_text("{not json")
    assert not bootstrap.is_ready(venv)


def test_workers_sharing_a_disk_build_it_once(tmp_path: Path) -> None:
    outputs: list[str] = []

    def worker() -> None:
        out = subprocess.run(
            [sys.executable, bootstrap.__file__, "--cache", str(tmp_path), "--spec", json.dumps(SPEC)],
            capture_output=True,
            text=True,
            check=True,
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
    argv = [
        sys.executable,
        bootstrap.__file__,
        "--cache",
        str(tmp_path),
        "--spec",
        json.dumps(SPEC),
        "--check",
    ]
    missing = subprocess.run(argv, capture_output=True, text=True)
    assert missing.returncode == 3 and "missing" in missing.stdout and not (tmp_path / SPEC["key"]).exists()


def _run_in(venv: Path, code: str) -> str:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_no_deps_entries_install_without_their_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t5x names unpinned git dependencies: its entry must install even though they are nowhere to be found. A
    ``~/`` entry is a copy shipped under the worker's HOME."""
    plain = tiny_wheel(tmp_path / "wheels", "tpuft_tiny_a", requires=("tpuft-no-such-package>=1",))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    tiny_wheel(tmp_path / "home" / "shipped", "tpuft_tiny_b", requires=("tpuft-no-such-package",))
    spec = {
        **SPEC,
        "key": "no-deps",
        "pip_args": ["--no-index"],
        "no_deps": [str(plain), "~/shipped/tpuft_tiny_b-0.1-py3-none-any.whl"],
    }
    venv = bootstrap.ensure_venv(tmp_path / "cache", spec)
    assert (
        _run_in(venv, "import tpuft_tiny_a, tpuft_tiny_b; print(tpuft_tiny_a.VALUE + tpuft_tiny_b.VALUE)")
        == "84"
    )
    marker = json.loads((venv / bootstrap.MARKER).read_text())
    assert marker["no_deps"][1] == str(tmp_path / "home" / "shipped" / "tpuft_tiny_b-0.1-py3-none-any.whl")


def test_a_python_too_old_for_the_pins_stops_with_what_to_do(tmp_path: Path) -> None:
    spec = {**SPEC, "kind": "t5x", "min_python": "3.99"}
    argv = [sys.executable, bootstrap.__file__, "--cache", str(tmp_path), "--spec", json.dumps(spec)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode != 0 and not (tmp_path / SPEC["key"]).exists()
    message = proc.stderr.strip()
    assert len(message.splitlines()) == 1, message
    for part in (
        "t5x venv needs Python >= 3.99",
        f"Python {bootstrap.PYTHON}",
        "no python3.99 or newer on PATH",
        "apt-get install python3.99 python3.99-venv",
        "gcp.python",
    ):
        assert part in message, message


def test_a_python_new_enough_builds_the_venv_itself(tmp_path: Path) -> None:
    venv = bootstrap.ensure_venv(tmp_path, {**SPEC, "min_python": "3.0"})
    marker = json.loads((venv / bootstrap.MARKER).read_text())
    assert (
        marker["python"] == marker["base_python"] == bootstrap.PYTHON
        and marker["interpreter"] == sys.executable
    )


def test_a_newer_python_on_path_builds_the_venv_and_it_stays_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    """A stand-in ``python3.19`` on PATH (it answers the version probe as 3.19 and is this interpreter
    otherwise) is chosen over this older one; a ``python3.20`` that does not run (a shim for a version not
    installed) is passed over. The marker records both versions, and the venv counts as ready on the next
    run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3.20").write_text("#!/bin/sh\nexit 127\n")
    (bin_dir / "python3.19").write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo 3.19; exit 0; fi\nexec {sys.executable} "$@"\n'
    )
    for fake in bin_dir.iterdir():
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    venv = bootstrap.ensure_venv(tmp_path / "cache", {**SPEC, "min_python": "3.19"})
    assert "using python3.19 (3.19)" in capsys.readouterr().out
    marker = json.loads((venv / bootstrap.MARKER).read_text())
    assert marker == {
        **marker,
        "python": "3.19",
        "base_python": bootstrap.PYTHON,
        "interpreter": str(bin_dir / "python3.19"),
    }
    assert bootstrap.is_ready(venv)
    bootstrap.ensure_venv(tmp_path / "cache", {**SPEC, "min_python": "3.19"})
    assert "venv ready (cached)" in capsys.readouterr().out


def test_a_python_past_the_ceiling_is_passed_over_for_the_newest_within_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T5X's pins stop at 3.12 (no editdistance wheel for 3.13): a worker with both a python3.20 and a
    python3.19 that run builds from 3.19 when the spec says ``max_python: 3.19``; with none within the range
    it stops with what to install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for minor in (19, 20):
        fake = bin_dir / f"python3.{minor}"
        fake.write_text(
            f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo 3.{minor}; exit 0; fi\nexec {sys.executable} "$@"\n'
        )
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert bootstrap.pick_python({**SPEC, "min_python": "3.19", "max_python": "3.19"}) == (
        str(bin_dir / "python3.19"),
        "3.19",
    )
    assert bootstrap.pick_python({**SPEC, "min_python": "3.19"}) == (str(bin_dir / "python3.20"), "3.20")
    assert bootstrap.pick_python({**SPEC, "max_python": bootstrap.PYTHON})[1] == bootstrap.PYTHON
    with pytest.raises(SystemExit) as stopped:
        bootstrap.pick_python({**SPEC, "kind": "t5x", "min_python": "3.21", "max_python": "3.22"})
    assert "needs Python >= 3.21 and <= 3.22" in str(
        stopped.value
    ) and "no python3.21 .. python3.22 on PATH" in str(stopped.value)


def test_the_key_names_the_sources_and_the_payload_keeps_it() -> None:
    spec = EnvSpec(
        kind="t5x",
        requirements=("jax",),
        python="python3",
        no_deps=("/w/t5x.whl",),
        local_sources=("/w/t5x.whl",),
        min_python="3.11",
        sources_digest="aaaa",
    )
    changed = replace(spec, sources_digest="bbbb")
    assert spec.key != changed.key
    plain = EnvSpec(kind="torch_xla", requirements=("torch",), python="python3")
    assert (
        plain.key
        == EnvSpec(
            kind="torch_xla", requirements=("torch",), python="python3", no_deps=(), min_python=None
        ).key
    )
    shipped = spec.payload(no_deps=("~/.tpuft/sources/aaaa/t5x.whl",))
    assert shipped["key"] == spec.key and shipped["no_deps"] == ["~/.tpuft/sources/aaaa/t5x.whl"]
    assert spec.payload()["no_deps"] == ["/w/t5x.whl"] and spec.payload()["min_python"] == "3.11"
