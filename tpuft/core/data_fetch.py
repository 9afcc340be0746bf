"""Where a missing data file comes from: a ``fetch.py`` in the folder the file belongs in (the shipped recipes
whose data tpuft cannot ship, e.g. GLUE SST-2 under ``tpuft/recipes/data/glue/SST-2/``, keep the script that
downloads it there, as the shipped data keeps the ``make.py`` that made it). Stdlib only: the recipe's data
check and ``recipes validate`` both name the command.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

FETCH_SCRIPT = "fetch.py"


def fetch_script(missing: Path) -> Path | None:
    """The ``fetch.py`` beside where ``missing`` goes, if there is one."""
    candidate = missing.parent / FETCH_SCRIPT
    return candidate if candidate.is_file() else None


def fetch_command(missing: Path) -> str | None:
    """``python tpuft/recipes/data/glue/SST-2/fetch.py``: the command that writes ``missing`` (relative to the
    current folder when under it), or None."""
    script = fetch_script(missing)
    if script is None:
        return None
    shown = script.resolve()
    try:
        shown = shown.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return f"python {shlex.quote(os.fspath(shown))}"
