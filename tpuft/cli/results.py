"""The Results panel: monitor, runs, logs, pull, tensorboard, convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tpuft.cli.app import command
from tpuft.cli.options import ConfigOpt, JsonOpt, load_cluster_file
from tpuft.cli.render import (
    accounts,
    accounts_json,
    byte_progress,
    fmt,
    fmt_seconds,
    goodput_cell,
    out_console,
    snapshot_json,
    snapshot_view,
    test_cell,
)


@command("monitor")
def monitor(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id or a unique prefix (default: the latest run).")
    ] = None,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one snapshot and exit (default: refresh until the run ends)."),
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 5.0,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Write the loss and eval curves, and a stacked bar of where the run's time went (goodput), "
            "to this PNG and exit.",
        ),
    ] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.core.errors import UsageError
    from tpuft.readers.monitor import watch
    from tpuft.readers.runs import read_run_metrics, resolve_run

    if interval <= 0:
        raise UsageError(f"--interval {interval}: must be positive")
    cfg = load_cluster_file(config)
    run = resolve_run(cfg, run_id)
    if plot is not None:
        from tpuft.readers.plot import plot_curves

        log, _ = read_run_metrics(run.local_view())
        written = plot_curves(log, plot, title=run.id, goodput=accounts(run.storage, run.info() or {})[0])
        out_console().print(
            f"[green]wrote {written}[/green]: {len(log.train_rows)} training and {len(log.eval_rows)} eval "
            "points"
        )
        return
    snap = watch(cfg, run)
    account = accounts(run.storage, snap.info)
    if json_out:
        print(json.dumps(snapshot_json(snap) | accounts_json(*account), indent=2))
        return
    console = out_console()
    if once or snap.ended or not console.is_terminal:
        console.print(snapshot_view(snap, account))
        return
    import time

    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from tpuft.storage.network import CloudUnreachable

    try:
        with Live(snapshot_view(snap, account), console=console, refresh_per_second=2, screen=False) as live:
            while not snap.ended:
                time.sleep(interval)
                try:
                    snap = watch(cfg, run)
                    account = accounts(run.storage, snap.info)
                    live.update(snapshot_view(snap, account))
                except (
                    CloudUnreachable
                ) as exc:  # a live view outlives the network's outage: the last view, said so
                    note = (
                        f"cannot reach Google Cloud ({exc.message}); the last view, tried again every "
                        f"{interval:.0f} s"
                    )
                    live.update(Group(snapshot_view(snap, account), Text(note, style="yellow")))
    except KeyboardInterrupt:
        console.print("[dim]stopped watching; the run goes on[/dim]")


@command("runs")
def runs(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    import time

    from tpuft.cli.tables import Col, FitTable
    from tpuft.readers.runs import list_runs

    listed = [(run, run.snapshot()) for run in list_runs(load_cluster_file(config))]
    found = [snap for _, snap in listed]
    account = [accounts(run.storage, snap.info) for run, snap in listed]
    if json_out:
        print(
            json.dumps(
                [
                    r.as_json() | {"started": r.info.get("started")} | accounts_json(*a)
                    for r, a in zip(found, account)
                ],
                indent=2,
            )
        )
        return
    table = FitTable(
        Col("run", copy=True),
        Col("recipe", copy=True, drop=7),
        Col("backend", drop=4),
        Col("status", drop=10),  # the last to go: a run id too long for the line goes whole before them
        Col("steps", drop=9),
        Col("attempt", drop=1),
        Col("best eval", drop=8),
        Col("test", drop=2),
        Col("goodput", drop=6),
        Col("cost", drop=5),
        Col("started", drop=3),
    )
    for r, (good, spent) in zip(found, account):
        best = r.best_metric
        started = r.info.get("started")
        when = (
            time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
            if isinstance(started, (int, float))
            else "-"
        )
        status = r.label + (f" ({fmt_seconds(r.stale_for_s)})" if r.stale_for_s is not None else "")
        recipe = str(r.info.get("recipe", "-")) + (" (predict)" if r.info.get("job") == "predict" else "")
        table.add_row(
            r.run_id,
            recipe,
            str(r.info.get("backend", "-")),
            status,
            f"{r.step}/{r.total_steps or '?'}",
            _attempt_cell(r.info),
            f"{best[0]} {fmt(best[1])} @{best[2]}" if best else "-",
            test_cell(r.test),
            goodput_cell(good),
            spent.label(),
            when,
        )
    console = out_console()
    if found:
        console.print(table)
    else:
        console.print("no runs yet (start one: tpuft up quickstart)")


@command("goodput")
def goodput(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.readers.runs import list_runs
    from tpuft.run.goodput import CAUSES, SHORT, duration, total

    listed = [(run, run.info() or {}) for run in list_runs(load_cluster_file(config))]
    account = [accounts(run.storage, info) for run, info in listed]
    whole = total([good for good, _ in account])
    spent = [c.total_usd for _, c in account if c.total_usd is not None]
    whole_cost = round(sum(spent), 4) if spent else None
    if json_out:
        rows = [
            {
                "run_id": run.id,
                "status": info.get("status"),
                "recipe": info.get("recipe"),
                **accounts_json(*a),
            }
            for (run, info), a in zip(listed, account)
        ]
        print(
            json.dumps(
                {"runs": rows, "total": {"goodput": whole.as_dict(), "cost_usd": whole_cost}}, indent=2
            )
        )
        return
    console = out_console()
    if not listed:
        console.print("no runs yet (start one: tpuft up quickstart)")
        return
    causes = [c for c in CAUSES if any(good.badput.get(c, 0.0) >= 0.5 for good, _ in account)]
    # at a narrow width the causes that cost the least time give way first
    smallest_first = sorted(causes, key=lambda c: whole.badput.get(c, 0.0))
    table = FitTable(
        Col("run", copy=True),
        Col("status", drop=3),
        Col("wall", drop=len(causes) + 4),
        Col("goodput", drop=len(causes) + 5),  # the last to go: a run id too long for the line goes first
        *[Col(SHORT.get(c, c), drop=smallest_first.index(c) + 4) for c in causes],
        Col("steps lost", drop=1),
        Col("cost", drop=2),
        title="where the runs' time went (badput by cause)",
    )

    def cells(good: Any) -> list[str]:
        shown = f"{good.goodput:.0%}" if good.events else "-"
        return [
            duration(good.wall_s),
            shown,
            *[duration(good.badput.get(c, 0.0)) if good.badput.get(c) else "-" for c in causes],
            str(good.steps_lost),
        ]

    for (run, info), (good, cost) in zip(listed, account):
        table.add_row(run.id, str(info.get("status", "-")), *cells(good), cost.label())
    table.add_section()
    table.add_row(
        f"total ({len(listed)} runs)",
        "",
        *cells(whole),
        f"${whole_cost:,.2f} (est.)" if whole_cost is not None else "-",
    )
    console.print(table)
    notes = sorted({good.external for good, _ in account if good.external})
    if notes:
        console.print(
            f"[yellow]the job's code also records with ml-goodput-measurement ({', '.join(notes)}): these "
            "figures are tpuft's own timeline, not added to Cloud Logging's[/yellow]"
        )


def _attempt_cell(info: dict[str, Any]) -> str:
    """``2 (1 recovery: node PREEMPTED)``: how many attempts, and what the recoveries were for."""
    recoveries = info.get("recoveries") or []
    text = str(info.get("attempt", 1))
    if recoveries:
        text += (
            f" ({len(recoveries)} recover{'y' if len(recoveries) == 1 else 'ies'}: "
            f"{recoveries[-1].get('cause')})"
        )
    return text


@command("logs")
def logs(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id or a unique prefix (default: the latest run).")
    ] = None,
    worker: Annotated[
        str | None,
        typer.Option(
            "--worker",
            "-w",
            help="Only this worker's log: a flat index, or slice:host like 1:0 on a multislice run (default: "
            "all, interleaved in time order).",
        ),
    ] = None,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")
    ] = False,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", "-t", help="Show when each line arrived (UTC).")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    from tpuft.ops.logs import follow, open_run_logs, read_all

    run_logs = open_run_logs(load_cluster_file(config), run_id, worker)
    prefix = len(run_logs.sources) > 1 or worker is None

    def emit(line: Any) -> None:
        print(line.render(prefix=prefix, timestamps=timestamps, layout=run_logs.layout), flush=True)

    if not follow_:
        for line in read_all(run_logs):
            emit(line)
        return
    try:
        follow(run_logs, emit)
    except KeyboardInterrupt:
        pass


@command("pull")
def pull(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id, a unique prefix of one, or 'latest' (the default).")
    ] = None,
    dest: Annotated[Path | None, typer.Argument(help="Where to put it (default: ./RUN_ID).")] = None,
    checkpoints: Annotated[
        str, typer.Option("--checkpoints", help="Which checkpoints come along: latest, best, all or none.")
    ] = "latest",
    workers: Annotated[int, typer.Option("--workers", help="Parallel downloads.")] = 16,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.ops.pull import pull as pull_op
    from tpuft.readers.runs import resolve_run

    cfg = load_cluster_file(config)
    run = resolve_run(cfg, run_id)
    target = dest if dest is not None else Path(run.id)
    console = out_console()
    with byte_progress(console, f"pulling {run.id}", enabled=not json_out) as progress:
        result = pull_op(
            run.url,
            target,
            checkpoints=checkpoints,
            workers=workers,
            progress=progress,
            project=cfg.gcp.project,
        )
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    steps = ", ".join(str(s) for s in result.checkpoints) or "none"
    console.print(
        f"[green]pulled {result.source} -> {result.dest}[/green]: {result.files_fetched} files fetched "
        f"({result.bytes_fetched / 1e6:.1f} MB), {result.files_skipped} already there and intact; "
        f"{result.files_total} files, {result.bytes_total / 1e6:.1f} MB in all; checkpoints: {steps}; "
        f"{result.seconds:.1f} s"
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


@command("tensorboard")
def tensorboard(
    run_id: Annotated[
        str | None, typer.Argument(help="Run id or a unique prefix (default: the latest run).")
    ] = None,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to serve on (0: a free one).")
    ] = 6006,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (0.0.0.0 to reach it from other machines).")
    ] = "127.0.0.1",
    config: ConfigOpt = None,
) -> None:
    import time

    from tpuft.core.ports import free_port, port_is_free
    from tpuft.ops.tensorboard import start_tensorboard
    from tpuft.readers.runs import resolve_run

    run = resolve_run(load_cluster_file(config), run_id).url
    console = out_console()
    if port and not port_is_free(host, port):
        console.print(f"[yellow]port {port} is taken; using a free one[/yellow]")
        port = free_port(host)
    with console.status(f"starting TensorBoard on {run} ..."):
        handle = start_tensorboard(run, port=port, host=host)
    # from the URL's line on, Ctrl-C is how it stops (exit 0): a reader may send it as soon as it sees the
    # URL, before this process has gone on from the print (CI saw exit 130 on a loaded machine)
    try:
        console.print(
            f"TensorBoard for {run}: [bold]{handle.url}[/bold]  (events: {handle.logdir}; Ctrl-C stops it)"
        )
        while handle.running:
            time.sleep(1.0)
        console.print(f"[red]TensorBoard exited[/red]; its output: {handle.log_path}")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()


@command("convert")
def convert(
    checkpoint: Annotated[
        str | None,
        typer.Argument(
            help="T5X model dir or checkpoint_N (legacy or Orbax), a torch run/checkpoints/step_N dir, or a "
            "Keras/TF save_pretrained dir; local or gs://."
        ),
    ] = None,
    out_dir: Annotated[
        str | None, typer.Argument(help="Where to write the Hugging Face model dir (local or gs://).")
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("--run", help="Convert the latest checkpoint of this run (OUT_DIR: its export/hf)."),
    ] = None,
    step: Annotated[int | None, typer.Option("--step", help="Pick this step instead of the latest.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (default) or bfloat16.")] = "float32",
    max_shard_size: Annotated[
        str | None,
        typer.Option(
            "--max-shard-size", help="Split the weights into shards of at most this size (e.g. 5GB, 500MB)."
        ),
    ] = None,
    hf_config: Annotated[
        Path | None, typer.Option("--hf-config", help="JSON whose keys override the derived HF config.")
    ] = None,
    hf_set: Annotated[
        list[str] | None,
        typer.Option("--hf-set", help="Override one HF config key: KEY=VALUE (repeatable)."),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer", help="A SentencePiece model file or an HF tokenizer dir to ship with the model."
        ),
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Load the result with transformers, run it, compare with the source where possible.",
        ),
    ] = False,
    verify_python: Annotated[
        str | None,
        typer.Option(
            "--verify-python", help="Python with torch + transformers for --verify (default: found)."
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty OUT_DIR.")] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    from tpuft.core.errors import UsageError
    from tpuft.ops.convert import convert as convert_op
    from tpuft.ops.convert import parse_overrides

    if dtype not in {"float32", "bfloat16"}:
        raise UsageError(f"--dtype {dtype!r}: expected float32 or bfloat16")
    if run is not None and checkpoint is not None and out_dir is None:
        checkpoint, out_dir = None, checkpoint  # `convert --run ID OUT_DIR`
    cfg = load_cluster_file(config) if run is not None or mentions_bucket(checkpoint, out_dir) else None
    overrides = parse_overrides(hf_set or [], hf_config)
    console = out_console()
    with byte_progress(console, "converting", enabled=not json_out) as progress:
        report = convert_op(
            checkpoint,
            out_dir,
            run_id=run,
            config=cfg,
            step=step,
            dtype=dtype,
            overwrite=overwrite,
            overrides=overrides,
            tokenizer=tokenizer,
            max_shard_size=max_shard_size,
            verify=verify,
            verify_python=verify_python,
            progress=progress,
        )
    if json_out:
        print(json.dumps(report.as_json(), indent=2))
        return
    r = report.result
    step_text = f" step {report.step}" if report.step is not None else ""
    shards = f" in {r.shards} shards" if r.shards > 1 else ""
    console.print(
        f"[green]wrote {report.out}[/green] from {r.kind}{step_text} ({r.checkpoint}): "
        f"{r.config.get('model_type')}, "
        f"{r.tensors} tensors, {r.weight_bytes / 1e6:.1f} MB {r.dtype}{shards}"
    )
    for note in r.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if report.verify is not None:
        v = report.verify
        compared = (
            f"max |logit diff| vs {v['compared_with']}: {v['max_abs_diff']:.2e}"
            if v.get("compared_with")
            else f"not compared: {v.get('not_compared')}"
        )
        console.print(
            f"[green]verified[/green] with transformers {v['transformers']} ({v['model_class']}): loads "
            f"cleanly, finite logits; {compared}"
        )


def mentions_bucket(*paths: str | None) -> bool:
    """gs:// paths use the cluster file's project when there is one (and credentials' default otherwise)."""
    return any(p is not None and p.startswith("gs://") for p in paths)
