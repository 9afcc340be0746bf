"""The ``tpuft`` entry point. Top-level ``--help``/``--version`` are answered from the command table
(:mod:`tpuft.commands`, which the Typer app reads too) without importing Typer and Rich (they cost ~10x
Python's own start-up), and so is the common shape of ``tpuft exec`` (people run it in loops and scripts): it
first hands the command to the cluster's connection agent (:mod:`tpuft.ops.agent_client`, no heavy import);
when there is none, it connects from what the last cold exec remembered (:mod:`tpuft.ops.quick_exec`, without
pydantic or the API), and loads the cluster file only when that is missing or stale. Everything else goes to
the Typer app in :mod:`tpuft.cli`.

``tests/cli/test_cli.py`` checks that both ways of running ``exec`` print the same thing.
"""

from __future__ import annotations

import os
import sys
import threading

from tpuft import __version__
from tpuft.commands import PIPE_CLOSED_EXIT, closed_pipe_in_thread, exit_with, stdout_closed, top_level_help

_EXEC_OPTIONS = {"-c": "config", "--config": "config", "-w": "worker", "--worker": "worker"}
# the CLI's cyan, magenta, green, ... as ANSI codes
_COLOURS = (
    "36",
    "35",
    "32",
    "33",
    "34",
    "31",
    "96",
    "95",
)


def parse_fast_exec(args: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """``exec [-c FILE] [-w SPEC] -- CMD...`` -> (options, command); None for anything else (Typer handles
    it)."""
    if not args or args[0] != "exec" or "--" not in args:
        return None
    split = args.index("--")
    head, command = args[1:split], args[split + 1 :]
    options: dict[str, str] = {}
    i = 0
    while i < len(head):
        name, eq, value = head[i].partition("=")
        key = _EXEC_OPTIONS.get(name)
        if key is None or key in options:
            return None
        if not eq:
            if i + 1 >= len(head):
                return None
            value = head[i + 1]
            i += 1
        options[key] = value
        i += 1
    return (options, command) if command else None


def _fast_exec(options: dict[str, str], command: list[str]) -> int:
    """The warm path first (the cluster's connection agent, no heavy import at all); then what the last cold
    exec with this cluster file remembered (:mod:`tpuft.ops.quick_exec`: no validation, no API, pinned host
    keys); then the whole path (the file validated, the API asked if need be), which remembers for next
    time."""
    from tpuft.core.errors import TpuftError
    from tpuft.fleet.base import failure_error
    from tpuft.ops import agent_client

    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    lock = threading.Lock()

    def on_line(index: int, line: str) -> None:
        prefix = f"[w{index}]"
        if colour:
            prefix = f"\033[{_COLOURS[index % len(_COLOURS)]}m{prefix}\033[0m"
        with lock:
            if stdout_closed():
                return
            try:
                sys.stdout.write(f"{prefix} {line}\n")
                sys.stdout.flush()
            except BrokenPipeError:
                closed_pipe_in_thread()

    try:
        config_path = agent_client.resolve_cluster_path(options.get("config"))
        result = agent_client.try_exec(config_path, command, options.get("worker"), on_line)
        refresh = False
        if result is None:
            _cold.append(True)
        if result is None and config_path is not None:
            from tpuft.ops.quick_exec import StalePlan, exec_remembered

            try:
                result = exec_remembered(config_path, command, options.get("worker"), on_line)
            except StalePlan:
                refresh = True  # the remembered workers did not answer: the whole path, asking the API first
            if result is not None:
                agent_client.ensure_agent(config_path)
        if result is None:
            from pathlib import Path

            from tpuft.config import load_cluster
            from tpuft.ops.cluster import exec_command

            path = Path(options["config"]) if "config" in options else None
            config = load_cluster(path).value
            result = exec_command(
                config,
                command,
                workers=options.get("worker"),
                on_line=on_line,
                cluster_path=path,
                use_agent=True,
                agent_tried=True,
                refresh=refresh,
            )
        error = failure_error(result, "the command", worker_exit_code=True)
        if error is not None:
            raise error
    except (TpuftError, KeyboardInterrupt) as exc:
        if (
            stdout_closed()
        ):  # the reader went away (`tpuft exec -- ... | head`): the workers were stopped for that
            return PIPE_CLOSED_EXIT
        if isinstance(exc, KeyboardInterrupt):
            sys.stderr.write("interrupted\n")
            return 130
        label = "interrupted:" if exc.exit_code == 130 else "error:"
        sys.stderr.write(f"{label} {exc.message}\n" + (f"{exc.hint}\n" if exc.hint else ""))
        return exc.exit_code
    return 0


_cold: list[bool] = []
"""Set when ``exec`` reached the workers itself (not through the agent): see :func:`main`."""


def main() -> None:
    """Every way out of tpuft, fast or not, ends quietly when the reader of its output has gone away. A cold
    ``exec`` then leaves at once (``os._exit``, its output flushed): the interpreter's teardown of paramiko,
    its threads and the modules took ~30 ms of a command that should cost one ``ssh``, and nothing is left to
    do (the connections are closed, the agent, if any, was started detached)."""
    try:
        exit_with(lambda: _dispatch(sys.argv[1:]))
    except SystemExit as done:
        if not _cold:
            raise
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # the reader is gone: exit_with has chosen the code for that
                pass
        os._exit(done.code if isinstance(done.code, int) else 0 if done.code is None else 1)


def _dispatch(args: list[str]) -> int:
    if "_TPUFT_COMPLETE" in os.environ:  # the shell asks for completions (argv is empty then): Typer answers
        from tpuft.cli import main as cli_main

        cli_main()
    fast = parse_fast_exec(args)
    if fast is not None:
        return _fast_exec(*fast)
    if args in ([], ["--help"], ["-h"]):
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        print(top_level_help(color))
        return 0
    if args in (["--version"], ["-V"]):
        print(f"tpuft {__version__}")
        return 0
    from tpuft.cli import main as cli_main

    cli_main()
    return 0
