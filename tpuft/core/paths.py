"""Where tpuft keeps state on the controller machine. Every location can be moved by an environment variable
so that tests (and users with odd home directories) stay out of ``~``."""

from __future__ import annotations

import os
from pathlib import Path


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


def package_root() -> Path:
    """The directory holding the ``tpuft`` package, shipped as-is to workers."""
    return Path(__file__).resolve().parents[1]


def environ_with_package() -> dict[str, str]:
    """This process's environment for a Python started from it in another interpreter (a backend venv, a
    detached agent) that must import this very tpuft: its folder first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root().parent), env.get("PYTHONPATH")]))
    return env


def repo_root() -> Path | None:
    """The source checkout when running from one (recipes/ and data/ live there); None for an installed
    wheel."""
    root = package_root().parent
    return root if (root / "recipes").is_dir() else None


def recipes_dir() -> Path:
    """Shipped recipes: ``recipes/`` of the checkout (``tpuft recipes ls`` lists it)."""
    root = repo_root()
    return (root if root is not None else package_root().parent) / "recipes"


def shipped_recipe(name: str) -> Path | None:
    """``quickstart`` or ``quickstart.yaml`` -> the shipped file, if there is one."""
    stem = name[:-5] if name.endswith(".yaml") else name
    if "/" in stem or not stem:
        return None
    candidate = recipes_dir() / f"{stem}.yaml"
    return candidate if candidate.is_file() else None
