"""Where tpuft keeps state on the controller machine. Every location can be moved by an environment variable
so that tests (and users with odd home directories) stay out of ``~``."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from tpuft.core.errors import TpuftError


def tpuft_home() -> Path:
    """Local clusters, their worker folders and the local "bucket" live under here (``$TPUFT_HOME``)."""
    return Path(os.environ.get("TPUFT_HOME") or Path.home() / ".tpuft").expanduser()


def venv_cache() -> Path:
    """Backend venvs are multi-GB and keyed by a requirements hash, so they are shared machine-wide, outside
    any repo and outside ``TPUFT_HOME`` (a test's throw-away home must not rebuild them):
    ``$TPUFT_VENV_CACHE`` moves them, else the XDG cache folder (docs/how-it-works.md, "Where things live on
    this machine")."""
    explicit = os.environ.get("TPUFT_VENV_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tpuft" / "venvs"


def compile_cache_root() -> Path:
    """Compiled XLA programs of the local pod's trainers (``train.compile_cache``), shared machine-wide like
    the venvs, so that every run of the same model here, a test's included, loads them instead of compiling:
    ``$TPUFT_COMPILE_CACHE_ROOT`` moves them, else beside the venv cache (``.../tpuft/xla``)."""
    explicit = os.environ.get("TPUFT_COMPILE_CACHE_ROOT")
    if explicit:
        return Path(explicit).expanduser()
    return venv_cache().parent / "xla"


def package_root() -> Path:
    """The directory holding the ``tpuft`` package, shipped as-is to workers."""
    return Path(__file__).resolve().parents[1]


def environ_with_package() -> dict[str, str]:
    """This process's environment for a Python started from it in another interpreter (a backend venv, a
    detached agent) that must import this very tpuft: its folder first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root().parent), env.get("PYTHONPATH")]))
    return env


RECIPES_FOLDER = "recipes"
"""The shipped recipes' folder inside the package (``tpuft/recipes/``): package data, not modules, so that
an editable install of a clone and a wheel (``pip install .``, a git URL) find them the same way."""


def recipes_dir() -> Path:
    """Shipped recipes and the data they name: ``tpuft/recipes/`` wherever the package is installed
    (``tpuft recipes ls`` lists it). A real folder, not a zip member: a recipe's data files are uploaded to
    the workers and read by path, as ``_defaults/tpuft.yaml`` is."""
    return Path(str(resources.files("tpuft").joinpath(RECIPES_FOLDER)))


def shipped_recipes() -> list[Path]:
    """Every shipped recipe file, by name."""
    return sorted(recipes_dir().glob("*.yaml"))


def no_shipped_recipes() -> TpuftError:
    """What a verb that needs the shipped recipes says when the package has none: an install that left out
    its package data (a wheel built without it), told apart from a name that matches nothing."""
    return TpuftError(
        f"this tpuft install has no shipped recipes: {recipes_dir()} holds no *.yaml (its package data is "
        "missing)",
        hint="Reinstall tpuft from a wheel or a source tree of this version (pip install --force-reinstall); "
        "a recipe file of your own still runs by its path",
    )


def shipped_recipe(name: str) -> Path | None:
    """``quickstart`` or ``quickstart.yaml`` -> the shipped file, if there is one."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if "/" in stem or not stem:
        return None
    candidate = recipes_dir() / f"{stem}.yaml"
    return candidate if candidate.is_file() else None
