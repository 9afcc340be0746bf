"""The shipped recipes travel inside the package (issue 39, item 2): a wheel (what ``pip install .``, a git
URL or an index installs) finds them, and their data, exactly as the editable install of a clone does.

The wheel is built here from a copy of the source (offline: ``--no-build-isolation``, with the setuptools of
the test extras) and installed with ``--no-deps`` into a fresh venv whose only way to the dependencies is a
``.pth`` line naming this venv's site-packages; the commands run from an empty folder with no
``PYTHONPATH``, so the clone's ``tpuft/`` cannot be what they import (each install checks
``tpuft.__file__``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuft.core.paths import recipes_dir

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "tpuft")
"""What the wheel is built from: the build reads nothing else (the copy keeps the clone free of build/)."""
FETCHED = ("tpuft/recipes/data/glue/SST-2/train.tsv", "tpuft/recipes/data/so_quality/train.jsonl")
"""Data the recipes' fetch.py scripts write beside themselves: the user's, never in a wheel."""


@dataclass(frozen=True)
class Installed:
    """A venv with the wheel installed, and an empty folder to run its ``tpuft`` from."""

    venv: Path
    cwd: Path
    env: dict[str, str]

    @property
    def site_packages(self) -> Path:
        found = list((self.venv / "lib").glob("python3*/site-packages"))
        assert len(found) == 1, found
        return found[0]

    def run(self, *args: str, python: bool = False) -> subprocess.CompletedProcess[str]:
        program = [str(self.venv / "bin" / "python")] if python else [str(self.venv / "bin" / "tpuft")]
        return subprocess.run(
            [*program, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, source / name)
    for fetched in FETCHED:  # as a user's clone has them after the fetch scripts ran
        (source / fetched).parent.mkdir(parents=True, exist_ok=True)
        (source / fetched).write_text("fetched\n")
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = out.glob("tpuft-*.whl")
    return found


def install(wheel: Path, root: Path) -> Installed:
    """A fresh venv (no pip of its own: this venv's pip installs into it) with the wheel and nothing else."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
        + ["--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    installed = Installed(venv, root / "cwd", {})
    # the dependencies (typer, pydantic, ...) come from this venv; tpuft itself from the wheel, which is first
    # on sys.path (a path in a .pth file is appended; the editable install's own .pth there is not read)
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (installed.site_packages / "dev_dependencies.pth").write_text("\n".join(sorted(dependencies)) + "\n")
    installed.cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(
        TPUFT_HOME=str(root / "home"),
        TPUFT_VENV_CACHE=str(root / "venvs"),
        TPUFT_NO_AGENT="1",
        COLUMNS="200",
        PYTHONDONTWRITEBYTECODE="1",
    )
    installed.env.update(env)
    where = installed.run("-c", "import tpuft; print(tpuft.__file__)", python=True)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed.site_packages), where.stdout
    return installed


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    yield install(wheel, tmp_path_factory.mktemp("installed"))


def test_the_wheel_ships_every_recipe_and_its_data(wheel: Path, installed: Installed) -> None:
    """The same recipes as the clone's, at the same place inside the package, found by ``recipes ls``; not the
    data a user fetched."""
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
    assert "tpuft/recipes/quickstart.yaml" in members, sorted(members)
    assert not members & set(FETCHED), sorted(members & set(FETCHED))
    packaged = installed.site_packages / "tpuft" / "recipes"
    tracked = subprocess.run(
        ["git", "ls-files", "tpuft/recipes"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    shipped = [REPO / name for name in tracked if not name.endswith(".gitignore")]
    assert shipped and [p for p in shipped if not (packaged / p.relative_to(recipes_dir())).is_file()] == []
    assert recipes_dir() == REPO / "tpuft" / "recipes"  # the editable install: the same place in the package

    listed = installed.run("recipes", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {entry["name"]: Path(entry["path"]) for entry in json.loads(listed.stdout)}
    assert names.keys() == {p.stem for p in recipes_dir().glob("*.yaml")}
    assert names["quickstart"] == packaged / "quickstart.yaml"
    table = installed.run("recipes", "ls")
    assert table.returncode == 0 and "quickstart" in table.stdout and "torch_xla" in table.stdout


def test_show_cp_validate_and_plan_find_the_packaged_recipe_and_data(installed: Installed) -> None:
    packaged = installed.site_packages / "tpuft" / "recipes"
    shown = installed.run("recipes", "show", "quickstart")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (packaged / "quickstart.yaml").read_text()

    copied = installed.run("recipes", "cp", "quickstart", "x.yaml")
    assert copied.returncode == 0, copied.stderr
    assert (installed.cwd / "x.yaml").is_file()
    # the copy's data paths point at the packaged data; the data is read (examples counted), not just named
    for recipe in ("quickstart", "x.yaml"):
        valid = installed.run("recipes", "validate", recipe)
        assert valid.returncode == 0, valid.stdout + valid.stderr
        assert "9,000 train" in " ".join(valid.stdout.split()), valid.stdout

    planned = installed.run("up", "quickstart", "--dry-run")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "recipe quickstart" in planned.stdout


def test_an_install_without_the_recipes_says_so(wheel: Path, tmp_path: Path) -> None:
    """An install that lost its package data (today's ``pip install .`` before the recipes moved into the
    package): ``recipes ls`` fails naming the folder instead of an empty table and exit 0, and a recipe
    name says why it is not found."""
    broken = install(wheel, tmp_path)
    recipes = broken.site_packages / "tpuft" / "recipes"
    shutil.rmtree(recipes, ignore_errors=True)  # (a wheel of today's main has none to remove)
    for args in (
        ["recipes", "ls"],
        ["recipes", "cp", "quickstart", "x.yaml"],
        ["up", "quickstart", "--dry-run"],
    ):
        result = broken.run(*args)
        assert result.returncode != 0, (args, result.stdout)
        assert f"no shipped recipes: {recipes}" in result.stderr, (args, result.stderr)
        assert "Reinstall tpuft" in result.stderr, (args, result.stderr)
    assert not (broken.cwd / "x.yaml").exists()
