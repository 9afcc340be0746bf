"""The Training panel: setup, train, up, resume, attach, stop, checkpoint.

A run lives on the workers under their supervisors: ``train`` and ``up`` start it and attach; Ctrl-C (or a
closed terminal) detaches and the run goes on, unless ``--stop-on-interrupt`` asks for the old way (scripts,
CI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tpuft.cli.app import command
from tpuft.cli.cluster import DryRunOpt, confirm_cost, show_plan
from tpuft.cli.options import (
    ConfigOpt,
    JsonOpt,
    RecipeArg,
    SetOpt,
    YesOpt,
    load_cluster_file,
    load_files,
    preflight_with_status,
)
from tpuft.cli.render import err_console, fmt_seconds, line_printer, out_console, print_train_summary
from tpuft.cli.watching import watch_run

DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        help="Return once every worker's trainer has started; the run goes on without this terminal.",
    ),
]
StopOnInterruptOpt = Annotated[
    bool,
    typer.Option(
        "--stop-on-interrupt",
        help="Ctrl-C stops the run on every worker (default: Ctrl-C only detaches, the run goes on).",
    ),
]
RecoverOpt = Annotated[
    bool | None,
    typer.Option(
        "--recover/--no-recover",
        help="Watch the run and recover it when the node is preempted, repaired or deleted: recreate, "
        "set up, resume from the last checkpoint (default: the cluster file's recover). With --detach "
        "the watcher runs in the background on this machine.",
        show_default=False,
    ),
]
CheckFitOpt = Annotated[
    bool,
    typer.Option(
        "--check-fit",
        help="Before anything is created or launched, compile the train step for the cluster's "
        "accelerator on this CPU (T5X; others: the paper estimate) and stop (exit 2) if it does not fit HBM.",
    ),
]
RunArg = Annotated[str | None, typer.Argument(help="Run id or a unique prefix (default: the latest run).")]


@command("setup")
def setup(
    recipe: RecipeArg,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    from tpuft.ops.setup import setup as setup_op

    loaded, cfg = load_files(recipe, overrides, config, against_cluster=False)  # no batch is split in setup
    if dry_run:
        show_plan(cfg, "setup", json_out, loaded)
        return
    console = err_console() if json_out else out_console()
    console.print(f"setting up [bold]{loaded.value.backend.kind}[/bold] on the workers of {cfg.name}")
    result = setup_op(cfg, loaded.value, on_line=line_printer(console))
    if json_out:
        payload = {
            "backend": result.backend,
            "venv": result.venv,
            "python": f"{result.venv}/bin/python",
            "seconds": round(result.seconds, 2),
        }
        print(json.dumps(payload, indent=2))
        return
    console.print(
        f"[green]setup done[/green] on {result.workers} worker(s) in {fmt_seconds(result.seconds)}: "
        f"{result.venv}"
    )


@command("train")
def train(
    recipe: Annotated[
        Path | None,
        typer.Argument(
            help="Recipe file, or the name of a shipped recipe (see: tpuft recipes ls).", show_default=False
        ),
    ] = None,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    detach: DetachOpt = False,
    stop_on_interrupt: StopOnInterruptOpt = False,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            help="Continue this stopped or failed run from its last checkpoint instead (same as: tpuft "
            "resume RUN).",
            show_default=False,
        ),
    ] = None,
    recover: RecoverOpt = None,
    dry_run: DryRunOpt = False,
    check_fit: CheckFitOpt = False,
) -> None:
    from tpuft.core.errors import UsageError

    if resume is not None:
        if dry_run:
            raise UsageError("--dry-run plans a new run: drop --resume")
        if recipe is not None or overrides or check_fit:
            raise UsageError(
                "--resume continues a run with the recipe it was started with: drop RECIPE, --set and "
                "--check-fit"
            )
        _resume(resume, config, json_out, detach, stop_on_interrupt, recover)
        return
    if recipe is None:
        raise UsageError("missing RECIPE: tpuft train RECIPE (or tpuft train --resume RUN)")
    from tpuft.ops.train import train as train_op

    loaded, cfg = load_files(recipe, overrides, config)
    if dry_run:
        show_plan(cfg, "train", json_out, loaded)
        return
    console = err_console() if json_out else out_console()  # stdout carries only the JSON
    preflight_with_status(cfg, loaded, console)
    recovering = cfg.recover.enabled if recover is None else recover
    result = train_op(
        cfg,
        loaded,
        on_line=line_printer(console),
        on_start=lambda run_id, run_dir: console.print(f"run [bold]{run_id}[/bold] -> {run_dir}"),
        on_notice=console.print,
        checked=True,
        detach=detach or recovering,
        stop_on_interrupt=stop_on_interrupt,
        check_fit=check_fit,
    )
    if recovering:
        result = watch_run(
            cfg, config, result.run_id, console, detach, stop_on_interrupt, new_run=True, started=result
        )
    print_train_summary(console, result, json_out)


@command("resume")
def resume(
    run_id: Annotated[str, typer.Argument(help="Run id or a unique prefix.")],
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    detach: DetachOpt = False,
    stop_on_interrupt: StopOnInterruptOpt = False,
    recover: RecoverOpt = None,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            metavar="USD",
            help="A new train.max_cost for the run (its whole cost so far counts against it): how a run "
            "stopped at its limit goes on.",
            show_default=False,
        ),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            metavar="DURATION",
            help="A new train.time_limit for the resumed attempt (90m, 12h, seconds; 0: none): how a run "
            "that finished at its limit goes on.",
            show_default=False,
        ),
    ] = None,
) -> None:
    _resume(run_id, config, json_out, detach, stop_on_interrupt, recover, max_cost, time_limit)


def _resume(
    run_id: str,
    config: Path | None,
    json_out: bool,
    detach: bool,
    stop_on_interrupt: bool,
    recover: bool | None = None,
    max_cost: float | None = None,
    time_limit: str | None = None,
) -> None:
    from tpuft.ops.train import resume as resume_op
    from tpuft.ops.train import set_max_cost, set_time_limit

    cfg = load_cluster_file(config)
    if max_cost is not None:
        set_max_cost(cfg, run_id, max_cost)
    if time_limit is not None:
        set_time_limit(cfg, run_id, _time_limit(time_limit))
    console = err_console() if json_out else out_console()
    if cfg.recover.enabled if recover is None else recover:
        from tpuft.readers.runs import resolve_run

        result = watch_run(
            cfg, config, resolve_run(cfg, run_id).id, console, detach, stop_on_interrupt, new_run=False
        )
        print_train_summary(console, result, json_out)  # type: ignore[arg-type]
        return
    result = resume_op(
        cfg,
        run_id,
        on_line=line_printer(console),
        on_notice=console.print,
        detach=detach,
        stop_on_interrupt=stop_on_interrupt,
        on_start=lambda rid, rdir: console.print(f"resuming run [bold]{rid}[/bold] -> {rdir}"),
    )
    print_train_summary(console, result, json_out)


def _time_limit(text: str) -> float | None:
    """``--time-limit``'s value in seconds, checked as the recipe checks ``train.time_limit``; 0: none."""
    from pydantic import TypeAdapter, ValidationError

    from tpuft.core.config_types import TimeLimit
    from tpuft.core.errors import UsageError

    text = text.strip()
    if text in ("0", "none", "null"):
        return None
    try:  # a bare number is seconds, as in the recipe (where YAML makes it a number)
        return float(TypeAdapter(TimeLimit).validate_python(int(text) if text.isdigit() else text))
    except ValidationError as exc:
        raise UsageError(
            f"--time-limit {text}: {exc.errors()[0]['msg']}", hint="write e.g. 5400, 90m, 12h or 0 (none)"
        ) from None


@command("attach")
def attach(
    run_id: RunArg = None,
    config: ConfigOpt = None,
    lines: Annotated[
        int | None,
        typer.Option(
            "--lines",
            "-n",
            help="Start with each worker's last N lines (default: 20, or all of --since).",
            show_default=False,
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Start with the lines of the last 10m / 2h / 30s, or since an ISO time (UTC).",
            show_default=False,
        ),
    ] = None,
    stop_on_interrupt: StopOnInterruptOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.ops.train import attach_run

    if lines is not None and lines < 0:
        from tpuft.core.errors import UsageError

        raise UsageError(f"--lines {lines}: must be 0 or more")
    tail = lines if lines is not None else (None if since else 20)
    cfg = load_cluster_file(config)
    console = err_console() if json_out else out_console()
    from tpuft.ops.predict_launch import is_predict_run

    predict_run = is_predict_run(cfg, run_id)
    if predict_run is not None:
        from tpuft.cli.predict import attach_predict_run

        attach_predict_run(
            cfg,
            predict_run,
            console,
            json_out,
            tail=tail,
            since=_since_stamp(since),
            stop_on_interrupt=stop_on_interrupt,
        )
        return
    result = attach_run(
        cfg,
        run_id,
        on_line=line_printer(console),
        tail=tail,
        since=_since_stamp(since),
        stop_on_interrupt=stop_on_interrupt,
        on_notice=console.print,
    )
    print_train_summary(console, result, json_out)


def _since_stamp(since: str | None) -> str | None:
    """``10m`` (a duration back from now) or an ISO time -> the log stamp to start from."""
    if since is None:
        return None
    import time

    from tpuft.core.config_types import duration_seconds
    from tpuft.core.errors import UsageError
    from tpuft.run.rundir import log_timestamp

    if since[:1].isdigit() and "-" not in since:
        try:
            seconds = duration_seconds(since if not since.isdigit() else int(since))
        except ValueError as exc:
            raise UsageError(f"--since {since}: {exc}") from None
        return log_timestamp(time.time() - float(seconds))  # type: ignore[arg-type]
    import datetime

    try:
        when = datetime.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since {since!r}: expected a duration (10m, 2h) or an ISO time (2026-11-23T14:00:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return log_timestamp(when.timestamp())


CheckpointOpt = Annotated[
    bool,
    typer.Option(
        "--checkpoint",
        help="Save a checkpoint at the next step boundary, then stop right after it: a resume loses no step.",
    ),
]
AtStepOpt = Annotated[
    int | None,
    typer.Option(
        "--at-step",
        min=1,
        help="Save at exactly this step (default: the next step boundary; on several hosts, one they all "
        "reach after the ask). A step already passed is refused.",
    ),
]
CheckpointTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=1.0,
        help="Seconds to wait for the checkpoint to be complete in run storage (exit 1 after).",
    ),
]


@command("checkpoint")
def checkpoint(
    run_id: RunArg = None,
    config: ConfigOpt = None,
    timeout: CheckpointTimeoutOpt = 600.0,
    at_step: AtStepOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.ops.lifecycle import request_checkpoint, wait_checkpoint
    from tpuft.readers.runs import resolve_run

    cfg = load_cluster_file(config)
    run = resolve_run(cfg, run_id)
    console = err_console() if json_out else out_console()
    request_id = request_checkpoint(run, reason="asked with tpuft checkpoint", at_step=at_step)
    with console.status(f"run {run.id}: waiting for its trainers' checkpoint ..."):
        done = wait_checkpoint(run, request_id, timeout)
    if json_out:
        print(json.dumps({"run_id": run.id, **done.as_dict()}, indent=2))
        return
    console.print(
        f"[green]checkpoint step {done.step}[/green] of run {run.id} complete in run storage "
        f"{done.latency_s:.1f} s after the ask: {done.path}"
    )


@command("stop")
def stop(
    run_id: RunArg = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    checkpoint: CheckpointOpt = False,
    timeout: CheckpointTimeoutOpt = 600.0,
    at_step: AtStepOpt = None,
) -> None:
    from tpuft.ops.lifecycle import stop as stop_op
    from tpuft.ops.lifecycle import stop_with_checkpoint
    from tpuft.readers.runs import resolve_run

    cfg = load_cluster_file(config)
    run = resolve_run(cfg, run_id)
    console = err_console() if json_out else out_console()
    saved = None
    if at_step is not None and not checkpoint:
        from tpuft.core.errors import UsageError

        raise UsageError("--at-step is the step of the checkpoint that --checkpoint saves: add --checkpoint")
    if checkpoint:
        with console.status(f"run {run.id}: saving a checkpoint, then stopping ..."):
            saved, result = stop_with_checkpoint(run, timeout=timeout, at_step=at_step)
        console.print(
            f"[green]checkpoint step {saved.step}[/green] complete in run storage {saved.latency_s:.1f} s "
            f"after the ask: {saved.path}"
        )
    else:
        with console.status(f"stopping run {run.id} on its workers ..."):
            result = stop_op(cfg, run)
    if json_out:
        print(
            json.dumps(
                {
                    "run_id": result.run_id,
                    "status": result.status,
                    "already_ended": result.already_ended,
                    "trainer_pids": result.trainers,
                    **({"checkpoint": saved.as_dict()} if saved else {}),
                },
                indent=2,
            )
        )
        return
    if result.already_ended:
        console.print(f"run {result.run_id} has already ended ({result.status}); nothing to stop")
        return
    console.print(
        f"[yellow]run {result.run_id}: {result.status}[/yellow] on {len(result.trainers)} worker(s)"
    )
    predict = run.info().get("predict")
    if predict:  # a predict job continues from its finished shards with the command that started it
        console.print(f"predict the rest later: {predict.get('command', 'tpuft predict ...')} --resume")
        return
    console.print(f"continue it later: tpuft resume {result.run_id}")


@command("up")
def up(
    recipe: RecipeArg,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    yes: YesOpt = False,
    detach: DetachOpt = False,
    stop_on_interrupt: StopOnInterruptOpt = False,
    recover: RecoverOpt = None,
    dry_run: DryRunOpt = False,
    check_fit: CheckFitOpt = False,
) -> None:
    from tpuft.ops.cluster import CreateResult
    from tpuft.ops.setup import SetupResult
    from tpuft.ops.up import STEPS
    from tpuft.ops.up import up as up_op

    loaded, cfg = load_files(recipe, overrides, config)
    if dry_run:
        show_plan(cfg, "up", json_out, loaded)
        return
    console = err_console() if json_out else out_console()  # stdout carries only the JSON

    def step(index: int, title: str, previous: object) -> None:
        if isinstance(previous, CreateResult):
            state = "created" if previous.created else "reused"
            console.print(
                f"{len(previous.cluster.workers)} worker(s), {state}; runs in {previous.cluster.bucket}"
            )
        elif isinstance(previous, SetupResult):
            console.print(f"environment ready in {fmt_seconds(previous.seconds)}: {previous.venv}")
        console.rule(f"{index + 1}/{len(STEPS)} {title}")

    preflight_with_status(cfg, loaded, console)
    recovering = cfg.recover.enabled if recover is None else recover
    result = up_op(
        cfg,
        loaded,
        confirm=confirm_cost(cfg, yes, console),
        on_step=step,
        on_line=line_printer(console),
        on_start=lambda rid, rdir: console.print(f"run [bold]{rid}[/bold] -> {rdir}"),
        on_notice=console.print,
        checked=True,
        detach=detach or recovering,
        stop_on_interrupt=stop_on_interrupt,
        check_fit=check_fit,
    )
    if recovering:
        result.train = watch_run(
            cfg,
            config,
            result.train.run_id,
            console,
            detach,
            stop_on_interrupt,
            new_run=True,  # type: ignore[assignment]
            started=result.train,
        )
    print_train_summary(console, result.train, json_out)
    if not json_out and not result.train.detached:
        console.print(f"total time {fmt_seconds(result.seconds)}")
        if result.train.export_dir:
            model_class = _model_class(result.train.export_dir)
            console.print(f"load it: {model_class}.from_pretrained({str(result.train.export_dir)!r})")


def _model_class(export_dir: str) -> str:
    """The transformers class that loads an export: the one its config names (a local export), else T5's."""
    try:
        config = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
        return str(config["architectures"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "T5ForConditionalGeneration"
