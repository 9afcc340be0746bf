"""The ``tpuft`` command: a Typer app whose verbs live in one module per panel (cluster, training, results,
recipes) and whose rendering lives in ``render``. Thin: parse options, call one ``ops`` function, render the
result.

Nothing heavy is imported at module level (``tpuft --help`` must start fast) and no ML framework is imported
at all: those live in the backend venvs on the workers. The fast launcher (:mod:`tpuft.launcher`) answers
top-level help and ``tpuft exec`` without this package; both read the verbs from :mod:`tpuft.commands`.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from tpuft import __version__
from tpuft.cli import cluster, drill, gc, predict, recipes, results, training  # noqa: F401 - importing them registers their verbs
from tpuft.cli.app import app
from tpuft.cli.render import err_console

__all__ = ["app", "main"]


def _version(value: bool) -> None:
    if value:
        print(f"tpuft {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool | None,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    pass


def main() -> None:
    """Entry point: user mistakes and worker failures become one clear message and an exit code, not a
    traceback; with ``--json`` that message is JSON on stdout, so a script reads one format whatever happened.
    A reader that goes away (``tpuft runs | head -1``) ends the command quietly, as ``git log | head``
    does."""
    from tpuft.commands import exit_with

    exit_with(lambda: _run(wants_json(sys.argv[1:])))


def wants_json(args: list[str]) -> bool:
    """``--json`` among tpuft's own arguments (not in the command ``exec`` runs after ``--``)."""
    own = args[: args.index("--")] if "--" in args else args
    return "--json" in own


def _run(json_errors: bool) -> int:
    from tpuft.commands import PIPE_CLOSED_EXIT, stdout_closed
    from tpuft.core.errors import TpuftError

    report = _json_error if json_errors else _text_error
    started_on_pipe = _stdout_is(stat.S_ISFIFO)
    try:
        # also under python -m: completion keys on the name
        code = app(prog_name="tpuft", standalone_mode=False)
    except SystemExit as exc:
        if exc.code == 1 and _reader_went_away(started_on_pipe):
            # Click's and Rich's own answer to a closed pipe is a quiet exit 1: give git's code
            return PIPE_CLOSED_EXIT
        raise
    except (TpuftError, KeyboardInterrupt, typer.Abort) as exc:
        if (
            stdout_closed()
        ):  # a reader thread found the pipe closed and stopped the workers: not the user's Ctrl-C
            return PIPE_CLOSED_EXIT
        if isinstance(exc, TpuftError):
            return report(exc.message, exc.hint, exc.exit_code, getattr(exc, "problems", None))
        if isinstance(exc, KeyboardInterrupt) or isinstance(
            exc.__cause__ or exc.__context__, KeyboardInterrupt
        ):
            # Abort: click's Ctrl-C
            return report("interrupted: every worker process was stopped", None, 130, bare=True)
        return report("aborted", None, 1, bare=True)
    except typer.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        raise
    except (
        OSError
    ) as exc:  # a path or address of the user's that the system refused: one line, not a traceback
        if os.environ.get("TPUFT_DEBUG"):
            raise
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return report(f"{exc.strerror or exc}{where}", "(TPUFT_DEBUG=1 shows where it happened)", 1)
    except Exception as exc:
        show = getattr(exc, "show", None)
        if callable(show) and isinstance(getattr(exc, "exit_code", None), int):  # click's usage errors
            if not json_errors:
                show()
                return exc.exit_code  # type: ignore[attr-defined,no-any-return]
            context = getattr(exc, "ctx", None)
            hint = f"Try '{context.command_path} --help' for help." if context is not None else None
            return report(exc.format_message(), hint, exc.exit_code)  # type: ignore[attr-defined]
        raise
    if stdout_closed():
        return PIPE_CLOSED_EXIT
    if code == 130:  # click returns 130 for a Ctrl-C that it caught itself
        return report("interrupted", None, 130, bare=True)
    return code if isinstance(code, int) else 0


def _stdout_is(kind: Callable[[int], bool]) -> bool:
    try:
        return kind(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


def _reader_went_away(started_on_pipe: bool) -> bool:
    """Whether Click (which wraps stdout to silence its flushes) or Rich (which points it at /dev/null) ended
    the command because stdout's pipe was closed."""
    if "PacifyFlushWrapper" in type(sys.stdout).__name__:  # Click's (Typer vendors its own copy of Click)
        return True
    try:
        now, devnull = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError, AttributeError):
        return False
    return started_on_pipe and (now.st_dev, now.st_ino) == (devnull.st_dev, devnull.st_ino)


def _text_error(
    message: str, hint: str | None, exit_code: int, problems: list[str] | None = None, *, bare: bool = False
) -> int:
    """``bare``: the message is the whole line (a Ctrl-C), not something after ``error:``."""
    from rich.markup import escape

    console = err_console()
    label = "[yellow]interrupted:[/yellow]" if exit_code == 130 else "[bold red]error:[/bold red]"
    if bare:
        console.print(f"[yellow]{escape(message)}[/yellow]", soft_wrap=True)
    else:
        console.print(f"{label} {escape(message)}", soft_wrap=True)
    if hint:
        console.print(escape(hint), soft_wrap=True)
    return exit_code


def _json_error(
    message: str, hint: str | None, exit_code: int, problems: list[str] | None = None, *, bare: bool = False
) -> int:
    """The error as one JSON object on stdout, where the verb's JSON would have gone (``problems``: a config
    error's located lines, one per problem)."""
    import json

    payload: dict[str, object] = {"error": message, "hint": hint, "exit_code": exit_code}
    if problems:
        payload["problems"] = list(problems)
    print(json.dumps(payload, indent=2))
    return exit_code
