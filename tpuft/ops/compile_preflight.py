"""What can fail fast before a compile installs anything: are the framework's sources and pip's index
reachable?

``recipes show --compile`` (and ``--check-fit``) builds the backend's venv and the libtpu overlay the first
time: minutes of pip. Its last step installs the sources a backend names (T5X: t5x, airio and jestimator,
from their git repositories unless the recipe points at a checkout or wheels), and that is the step that
needs git and the network. So before any install, and only when something is to be installed, this
checks, in seconds:

* each local source the plan names exists (a checkout, a wheel, a folder of wheels);
* each git source: ``git`` is on PATH and ``git ls-remote`` reaches the repository (git's own configuration
  applies, its ``insteadOf`` rewrites and proxies included), bounded by :data:`GIT_TIMEOUT_S`;
* pip's index: at least one of the places pip would look (``--index-url``, ``--extra-index-url``,
  ``--find-links``, from pip's configuration and environment, as the venv's pip reads them) answers.

A failure is one located problem per source, at the recipe key that chooses them (the plan's
``sources_key``), with how to set it: exit code 2, before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from tpuft.core.errors import ConfigError, UsageError
from tpuft.core.waiting import waiting

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuft.backends.base import CompilePlan
    from tpuft.core.config_types import KeyPath

GIT_TIMEOUT_S = 20.0
"""``git ls-remote`` of one repository: a reachable host answers in a second or two."""
INDEX_TIMEOUT_S = 10.0
DEFAULT_INDEX = "https://pypi.org/simple"


def check_sources(
    plan: CompilePlan,
    *,
    venv_missing: bool,
    overlay_missing: bool,
    locate: Callable[[KeyPath, str], str] | None = None,
    source: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Raise a :class:`ConfigError` (exit 2) naming the recipe key of the sources and how to set it when the
    install about to run cannot reach them, a :class:`UsageError` when only pip's index is out of reach;
    nothing when nothing is to be installed."""
    if not venv_missing and not overlay_missing:
        return
    problems: list[str] = []
    if venv_missing:
        with waiting("the sources the compile's venv installs to answer (git ls-remote)", progress=progress):
            problems += [_at(plan, locate, text) for text in source_problems(plan.env.no_deps)]
    index = index_problem()
    if problems:
        error = ConfigError([*problems, *([index] if index else [])], source=source)
        error.hint = plan.sources_help or None
        raise error
    if index is not None:
        raise UsageError(index)


def _at(plan: CompilePlan, locate: Callable[[KeyPath, str], str] | None, text: str) -> str:
    key = plan.sources_key
    if not key:
        return text
    if locate is not None:
        return locate(key, text)
    return f"{'.'.join(str(part) for part in key)}: {text}"


def source_problems(requirements: tuple[str, ...]) -> list[str]:
    """What stands in the way of installing ``requirements`` (``name @ git+URL@COMMIT`` or a local path)."""
    found: list[str] = []
    git = shutil.which("git")
    for requirement in requirements:
        name, _, url = requirement.partition(" @ ")
        if not url:
            path = Path(os.path.expanduser(requirement))
            if not path.exists():
                found.append(f"{requirement} does not exist (a checkout, a wheel or a folder of wheels)")
            continue
        if not url.startswith("git+"):
            continue
        repository = url[len("git+") :].rsplit("@", 1)[0]
        if git is None:
            found.append(f"{name} comes from {repository} with git, and git is not installed on this machine")
            continue
        said = _ls_remote(git, repository)
        if said is not None:
            found.append(f"{name} comes from {repository}, which git cannot reach: {said}")
    return found


def _ls_remote(git: str, repository: str) -> str | None:
    """None when ``git ls-remote`` reaches ``repository``; else git's last words (or the timeout)."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    try:
        done = subprocess.run(
            [git, "ls-remote", "--exit-code", repository, "HEAD"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=GIT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {GIT_TIMEOUT_S:.0f} s (is the network down?)"
    except OSError as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"git ls-remote exit code {done.returncode}"


# -- pip's index -------------------------------------------------------------------------------------------
def pip_locations() -> tuple[bool, list[str]]:
    """(``no-index`` set, the URLs and folders pip would look in) as pip reads its configuration and the
    ``PIP_*`` environment: ``pip config list`` (files and environment), run with tpuft's interpreter (the
    configuration files are the machine's and the user's, the ones the venv's pip reads too)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
        listed = done.stdout if done.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if option in ("index-url", "extra-index-url", "find-links", "no-index"):
            # :env: lines come last from pip; a later one wins, as pip applies them
            settings[option] = value.strip().strip("'\"")
    for option in ("index-url", "extra-index-url", "find-links", "no-index"):
        env = os.environ.get(f"PIP_{option.upper().replace('-', '_')}")
        if env is not None:
            settings[option] = env
    no_index = settings.get("no-index", "").lower() in ("1", "true", "yes", "on")
    places = [] if no_index else [settings.get("index-url") or DEFAULT_INDEX]
    places += settings.get("extra-index-url", "").split() if not no_index else []
    places += settings.get("find-links", "").split()
    return no_index, [place for place in places if place]


def index_problem() -> str | None:
    """None when at least one place pip looks in answers (an HTTP answer of any status, or a folder that
    exists); else one line that names them and what each said."""
    _, places = pip_locations()
    said: list[str] = []
    with waiting(f"pip's index to answer ({', '.join(places)})"):
        for place in places:
            problem = _place_problem(place)
            if problem is None:
                return None
            said.append(f"{place}: {problem}")
    return (
        "pip's index cannot be reached, and the compile's venv or libtpu must be installed from it: "
        + "; ".join(said)
        + " (set PIP_INDEX_URL or pip's configuration to an index this machine reaches, or build the venv "
        "where one is reachable)"
    )


def _place_problem(place: str) -> str | None:
    if place.startswith("file:"):
        path = Path(urllib.request.url2pathname(place[len("file:") :].removeprefix("//")))
        return None if path.exists() else "no such folder"
    if "://" not in place:
        return None if Path(place).expanduser().exists() else "no such folder"
    try:
        with urllib.request.urlopen(urllib.request.Request(place, method="HEAD"), timeout=INDEX_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return str(reason)
