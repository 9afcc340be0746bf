"""The recovery watcher, seen from the command line: ``train``, ``up`` and ``resume`` with ``--recover`` run
it here, attached to the run's lines, or start it in a session of its own on this machine (``--detach``), so
that a closed terminal does not end it."""

from __future__ import annotations

from pathlib import Path

from tpuft.cli.render import line_printer


def watch_run(
    cfg: object,
    config: Path | None,
    run_id: str,
    console: object,
    detach: bool,
    stop_on_interrupt: bool,
    *,
    new_run: bool,
    started: object = None,
) -> object:
    """The recovery watcher: here (attached), or started in the background on this machine (``--detach``)."""
    from tpuft.ops.recover import Callbacks, resume_and_watch, watch_new_run
    from tpuft.ops.train import TrainResult

    if detach:
        pid, log = spawn_watcher(run_id, config)
        console.print(f"recovery watcher: pid {pid} on this machine, log {log}")  # type: ignore[attr-defined]
        return started or TrainResult(run_id, "", 0.0, 0, detached=True)
    shown: list[str] = []

    def progress(text: str) -> None:  # the provider repeats its state while it waits: show each change once
        if not shown or shown[-1] != text:
            shown.append(text)
            console.print(f"  {text}")  # type: ignore[attr-defined]

    callbacks = Callbacks(
        on_line=line_printer(console),
        on_notice=lambda text: console.print(f"[yellow]{text}[/yellow]"),  # type: ignore[arg-type,attr-defined]
        on_progress=progress,
    )
    if new_run:
        return watch_new_run(
            cfg, TrainResult(run_id, "", 0.0, 0), callbacks, stop_on_interrupt=stop_on_interrupt
        )  # type: ignore[arg-type]
    return resume_and_watch(cfg, run_id, callbacks, stop_on_interrupt=stop_on_interrupt)  # type: ignore[arg-type]


def spawn_watcher(run_id: str, config: Path | None) -> tuple[int, Path]:
    """``tpuft resume RUN --recover`` in a session of its own: a closed terminal does not end it (a sleeping
    laptop does: run it on a machine that stays up, or take it over from one with the same command)."""
    import os
    import subprocess
    import sys

    from tpuft.core.paths import tpuft_home

    log = tpuft_home() / "watchers" / f"{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tpuft",
        "resume",
        run_id,
        "--recover",
        *(["-c", str(config.resolve())] if config else []),
    ]
    with open(log, "ab") as sink:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=os.getcwd(),
            env={**os.environ, "COLUMNS": "160"},
        )
    return child.pid, log
