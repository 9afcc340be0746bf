"""``tpuft predict``: a trained model on an input file, on the cluster's workers (a run of its own) or here
(``--local``), with a progress bar while attached, the scores when the input has targets, and one summary
line."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuft.cli.app import command
from tpuft.cli.options import ConfigOpt, JsonOpt, SetOpt, load_cluster_file
from tpuft.cli.render import err_console, line_printer, out_console

if TYPE_CHECKING:
    from rich.console import Console

    from tpuft.ops.predict import PredictResult


DetachOpt = Annotated[
    bool,
    typer.Option(
        "--detach",
        "-d",
        help="Return once every worker predicts; worker 0 joins OUT when it can reach it, else tpuft attach "
        "RUN does.",
    ),
]
StopOnInterruptOpt = Annotated[
    bool,
    typer.Option(
        "--stop-on-interrupt", help="Ctrl-C stops the job on every worker (default: Ctrl-C only detaches)."
    ),
]


@command("predict")
def predict(
    source: Annotated[
        str,
        typer.Argument(
            help="A run id or prefix (latest: the newest), a checkpoint folder, or a Hugging Face model "
            "folder (local or gs://)."
        ),
    ],
    input_: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="JSON lines, CSV or TSV (by its suffix), local or gs://.",
            show_default=False,
        ),
    ],
    output: Annotated[
        str,
        typer.Option(
            "--output", "-o", help="Where the predictions go: JSON lines, local or gs://.", show_default=False
        ),
    ],
    field: Annotated[
        str | None,
        typer.Option(
            "--field",
            help="Read the source text from this field (default: the recipe's source_field or "
            "source_template).",
            show_default=False,
        ),
    ] = None,
    num_beams: Annotated[
        int, typer.Option("--num-beams", min=1, help="Beam search with this many beams (1: greedy).")
    ] = 1,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            min=1,
            help="At most this many tokens per prediction (default: the recipe's data.max_target_length).",
            show_default=False,
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Examples per process per step.")
    ] = 32,
    shard_lines: Annotated[
        int,
        typer.Option(
            "--shard-lines", min=1, help="Input lines per shard: the unit a killed predict resumes from."
        ),
    ] = 10_000,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="Predict on this machine's CPU with the run's Hugging Face export, not on the workers.",
        ),
    ] = False,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=1,
            help="--local: engine processes, each on its share of the CPUs (default: one per CPU, at most 8)",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="OUT's job was cut off: keep its finished shards and predict the rest."
        ),
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing OUT (and drop an earlier job's shards).")
    ] = False,
    recipe: Annotated[
        Path | None,
        typer.Option(
            "--recipe",
            "-r",
            help="The recipe whose fields, prefix and lengths the input follows (default: the source's "
            "run's).",
            show_default=False,
        ),
    ] = None,
    overrides: SetOpt = None,
    detach: DetachOpt = False,
    stop_on_interrupt: StopOnInterruptOpt = False,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.core.errors import UsageError
    from tpuft.ops import predict as ops

    if local and detach:
        raise UsageError(
            "--detach leaves the job to the workers' supervisors; --local runs it here: give one"
        )
    if processes is not None and not local:
        raise UsageError(
            "--processes is for --local: on the cluster every worker runs the backend's own processes"
        )
    cfg = load_cluster_file(config)
    options = ops.PredictOptions(
        input=input_,
        output=output,
        field=field,
        num_beams=num_beams,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        shard_lines=shard_lines,
        local=local,
        resume=resume,
        overwrite=overwrite,
        recipe=recipe,
        overrides=tuple(overrides or ()),
        processes=processes,
    )
    console = err_console() if json_out else out_console()
    found = ops.resolve_source(cfg, source, options)
    console.print(f"model: {found.label}" + "".join(f" ({note})" for note in found.notes))
    with console.status(f"checking {input_} ...") as spinner:
        checked = ops.check_input(
            found,
            options,
            progress=lambda done, total: spinner.update(
                f"checking {input_}: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB"
            ),
        )
    console.print(
        f"{checked.records:,} records in {input_}"
        + (f", {checked.targets:,} with a target" if checked.targets else "")
    )
    command_line = _command_line()
    with _bar(console, checked.records, json_out) as progress:
        if local:
            result = _local(cfg, found, options, checked.records, console, progress, json_out)
        else:
            from tpuft.ops.predict_launch import predict_on_cluster

            result = predict_on_cluster(
                cfg,
                found,
                options,
                checked.records,
                command=command_line,
                on_line=line_printer(console),
                on_progress=progress,
                on_start=lambda rid, rdir: console.print(f"run [bold]{rid}[/bold] -> {rdir}"),
                on_notice=console.print,
                detach=detach,
                stop_on_interrupt=stop_on_interrupt,
            )
    print_predict_result(console, result, json_out)


def _local(
    cfg: Any, found: Any, options: Any, total: int, console: Console, progress: Any, json_out: bool
) -> PredictResult:
    from tpuft.core.paths import tpuft_home
    from tpuft.ops import predict as ops
    from tpuft.ops.predict_shards import absolute, claim_output, default_shards, storage_shards

    model = ops.hf_model_for_local(found, cfg.gcp.project)
    output = absolute(options.output)
    shards = (
        default_shards(output)
        if not output.startswith("gs://")
        else storage_shards(str(tpuft_home()), output)
    )
    processes = options.processes or ops.local_processes()
    job = ops.make_job(
        found,
        options,
        model=model,
        backend=ops.HF_ENGINE,
        input_url=absolute(options.input),
        shards=shards,
        output=None,
        total=total,
        settings=ops.local_settings(processes),
    )
    resumed = claim_output(
        job, output, resume=options.resume, overwrite=options.overwrite, project=cfg.gcp.project
    )
    from rich.markup import escape

    shown = err_console() if json_out else console
    return ops.run_local(
        job,
        output,
        on_line=lambda line: shown.print(f"[dim]{escape(line)}[/dim]", soft_wrap=True),
        progress=progress,
        resumed=resumed,
        processes=processes,
    )


class _bar:
    """A rich progress bar (examples done of the input's, examples/s, ETA) while the job runs; nothing with
    --json."""

    def __init__(self, console: Console, total: int, quiet: bool) -> None:
        self.console, self.total, self.quiet = console, total, quiet
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Any:
        if self.quiet:
            return None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("predicting"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self._progress.add_task("predict", total=self.total, rate="")
        self._progress.start()
        first: list[int] = []

        def update(done: int, total: int) -> None:
            task = self._progress.tasks[0]
            if not first:
                first.append(done)  # a resumed job starts with its kept shards: not this job's speed
            speed = (done - first[0]) / task.elapsed if task.elapsed else 0.0
            self._progress.update(
                self._task,
                completed=done,
                total=total or self.total,
                rate=f"{speed:,.1f} examples/s" if speed else "",
            )

        return update

    def __exit__(self, *_: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def print_predict_result(console: Console, result: PredictResult, json_out: bool) -> None:
    from tpuft.ops.predict import score_line, summary_line

    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    if result.detached:
        console.print(f"run {result.run_id} predicts on the workers without this terminal")
        console.print(
            f"watch it (and join its shards into {result.output} at the end): tpuft attach {result.run_id}"
        )
        return
    if result.resumed_shards:
        console.print(f"{result.resumed_shards} shard(s) kept from the earlier job")
    if result.scores:
        console.print(f"scores: {score_line(result.scores)}")
    console.print(f"[green]done[/green]: {summary_line(result)}")


def attach_predict_run(cfg: Any, run: Any, console: Console, json_out: bool, **attach: Any) -> None:
    """``tpuft attach`` of a predict run (its progress, then the join and summary)."""
    from tpuft.ops.predict_launch import attach_predict

    total = int((run.info().get("predict") or {}).get("examples") or 0)
    with _bar(console, total, json_out) as progress:
        result = attach_predict(cfg, run, on_line=line_printer(console), on_progress=progress, **attach)
    print_predict_result(console, result, json_out)


def _command_line() -> str:
    """The command as typed (for a failure's hint: the same command with --resume)."""
    args = [a for a in sys.argv[1:] if a not in {"--resume", "--overwrite", "--detach", "-d"}]
    return "tpuft " + " ".join(shlex.quote(a) for a in args)
