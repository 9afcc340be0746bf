"""What every generator of docs/ shares: a page's checked-in text against what it must hold now, and the
command line (``--check`` writes nothing and exits 1 when a page is stale). The generators stay scripts run as
files, so this module is found beside them (docs/ is on ``sys.path`` then); tests load it the same way."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

Outputs = Callable[[], dict[Path, str]]


def stale(outputs: Outputs) -> list[Path]:
    """The generated files whose checked-in text differs from what their sources give now."""
    return [
        path
        for path, text in outputs().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def main(
    argv: list[str] | None,
    *,
    description: str,
    outputs: Outputs,
    command: str,
    repo: Path,
    wrote: Callable[[Path, str], str],
) -> int:
    """Write each output (saying so with ``wrote``), or with ``--check`` only name the stale ones."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is stale")
    args = parser.parse_args(argv)
    if args.check:
        behind = stale(outputs)
        for path in behind:
            print(f"{path.relative_to(repo)} is stale: run {command}", file=sys.stderr)
        return 1 if behind else 0
    for path, text in outputs().items():
        path.write_text(text, encoding="utf-8")
        print(wrote(path, text))
    return 0
