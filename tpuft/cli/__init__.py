"""The ``tpuft`` command: a Typer app whose verbs live in one module per panel (cluster, training, results, recipes)
and whose rendering lives in ``render``. Thin: parse options, call one ``ops`` function, render the result.

Nothing heavy is imported at module level (``tpuft --help`` must start fast) and no ML framework is imported at
all: those live in the backend venvs on the workers. The fast launcher (:mod:`tpuft.launcher`) answers top-level
help and ``tpuft exec`` without this package; both read the verbs from :mod:`tpuft.commands`.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from tpuft import __version__
from tpuft.cli import cluster, recipes, results, training  # noqa: F401 - importing them registers their verbs
from tpuft.cli.app import app
from tpuft.cli.render import err_console

__all__ = ["app", "main"]


def _version(value: bool) -> None:
    if value:
        print(f"tpuft {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
) -> None:
    pass


def main() -> None:
    """Entry point: user mistakes and worker failures become one clear message and an exit code, not a traceback."""
    from tpuft.errors import TpuftError

    try:
        code = app(standalone_mode=False)
    except TpuftError as exc:
        console = err_console()
        from rich.markup import escape

        label = "[yellow]interrupted:[/yellow]" if exc.exit_code == 130 else "[bold red]error:[/bold red]"
        console.print(f"{label} {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            console.print(escape(exc.hint), soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console().print("[yellow]interrupted: every worker process was stopped[/yellow]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:  # a path or address of the user's that the system refused: one line, not a traceback
        import os

        if os.environ.get("TPUFT_DEBUG"):
            raise
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        err_console().print(f"[bold red]error:[/bold red] {exc.strerror or exc}{where}", soft_wrap=True)
        err_console().print("(TPUFT_DEBUG=1 shows where it happened)")
        sys.exit(1)
    except typer.Abort as exc:  # click turns Ctrl-C into Abort outside standalone mode
        if isinstance(exc.__cause__, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            err_console().print("[yellow]interrupted: every worker process was stopped[/yellow]")
            sys.exit(130)
        err_console().print("aborted")
        sys.exit(1)
    except Exception as exc:
        show = getattr(exc, "show", None)
        if callable(show) and isinstance(getattr(exc, "exit_code", None), int):  # click's usage errors
            show()
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        raise
    if code == 130:  # click returns 130 for a Ctrl-C that it caught itself
        err_console().print("[yellow]interrupted[/yellow]")
    sys.exit(code if isinstance(code, int) else 0)
