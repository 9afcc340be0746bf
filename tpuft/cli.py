"""The ``tpuft`` command. Thin: parse options, call one ``ops`` function, render the result with rich.

Nothing heavy is imported at module level (``tpuft --help`` must start fast) and no ML framework is imported at
all: those live in the backend venvs on the workers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from tpuft import __version__
from tpuft.launcher import QUICKSTART, SUMMARY

if TYPE_CHECKING:
    from rich.console import Console

    from tpuft.config import ClusterConfig, Loaded, RecipeConfig

app = typer.Typer(
    name="tpuft",
    help=f"{SUMMARY}\n\n{QUICKSTART}",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
recipes_app = typer.Typer(help="List, show, copy and validate recipes.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes", rich_help_panel="Recipes")

_WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")

ConfigOpt = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="Cluster file (default: $TPUFT_CONFIG, ./tpuft.yaml, then the built-in local one).", show_default=False),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", help="Override a recipe key, e.g. --set train.steps=50 (repeatable).", show_default=False),
]
RecipeArg = Annotated[Path, typer.Argument(help="Recipe file, or the name of a shipped recipe (see: tpuft recipes ls).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


# ---------------------------------------------------------------------------------------------------------------
# Output helpers


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def _err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _line_printer(console: Console):  # type: ignore[no-untyped-def]
    """Worker output, one line at a time, behind a coloured ``[wN]`` prefix (called from reader threads)."""
    from rich.markup import escape

    def on_line(index: int, line: str) -> None:
        colour = _WORKER_COLOURS[index % len(_WORKER_COLOURS)]
        console.print(f"[{colour}]\\[w{index}][/{colour}] {escape(line)}", soft_wrap=True)

    return on_line


def _load_cluster(config: Path | None) -> ClusterConfig:
    from tpuft.config import load_cluster

    return load_cluster(config).value


def _load_recipe(recipe: Path, overrides: list[str] | None) -> Loaded[RecipeConfig]:
    from tpuft.config import load_recipe

    return load_recipe(recipe, overrides or [])


def _fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _fmt_metric(key: str, value: Any) -> str:
    """Throughput as people read it (248.3 ex/s, 9,731 tok/s), the learning rate in scientific notation."""
    if not isinstance(value, (int, float)):
        return _fmt(value)
    if key == "lr":
        return f"{value:.2e}"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if key in {"examples_per_s", "elapsed_s"}:
        return f"{value:,.1f}"
    return _fmt(value)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.{digits}f}"
    return str(value)


# ---------------------------------------------------------------------------------------------------------------
# Cluster


def _confirm_cost(cfg: ClusterConfig, yes: bool, console: Console) -> None:
    """A new cloud cluster costs money: show the estimate and ask (or require --yes when nobody can answer)."""
    if cfg.provider == "local":
        return
    from tpuft.errors import UsageError
    from tpuft.ops.cluster import cost_estimate
    from tpuft.ops.cluster import status as status_op

    if status_op(cfg).state != "NOT_FOUND":
        return  # reused as it is: nothing new is billed
    console.print(cost_estimate(cfg).describe(cfg.accelerator, cfg.gcp.spot), soft_wrap=True)
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"creating {cfg.name} in {cfg.gcp.project}/{cfg.gcp.zone} costs money: pass --yes to confirm")
    typer.confirm(f"Create {cfg.name} in {cfg.gcp.project}/{cfg.gcp.zone}?", abort=True)


@app.command(rich_help_panel="Cluster")
def create(config: ConfigOpt = None, json_out: JsonOpt = False, yes: YesOpt = False) -> None:
    """Create the cluster (TPU VM / pod slice, or local worker folders) and its bucket. Safe to run twice.

    Example: tpuft create --config tpuft.yaml
    """
    from tpuft.ops.cluster import create as create_op

    cfg = _load_cluster(config)
    console = _err_console() if json_out else _console()
    _confirm_cost(cfg, yes, console)
    with console.status(f"creating {cfg.name} ({cfg.provider}, {cfg.accelerator})...") as spinner:
        result = create_op(cfg, progress=lambda msg: spinner.update(msg))
    if json_out:
        print(json.dumps(_cluster_json(result.cluster) | {"created": result.created}, indent=2))
        return
    verb = "created" if result.created else "already exists, reused"
    acc = result.accelerator
    price = f", list price ~${acc.price_per_hour:.2f}/h on GCP" if acc.price_per_hour else ""
    console.print(
        f"[green]cluster {cfg.name} {verb}[/green]: {len(result.cluster.workers)} worker(s); "
        f"{acc.name} = {acc.chips} chips on {acc.hosts} host(s){price}"
    )
    console.print(f"run storage: {result.cluster.bucket}")
    if result.cluster.details.get("bucket_warning"):
        console.print(f"[yellow]warning:[/yellow] {result.cluster.details['bucket_warning']}", soft_wrap=True)


def _cluster_json(cluster: Any) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "provider": cluster.provider,
        "state": cluster.state,
        "accelerator": cluster.accelerator,
        "bucket": cluster.bucket,
        "workers": [
            {"index": w.index, "address": w.address, "internal_address": w.internal_address or None, "home": str(w.home) if w.home else None}
            for w in cluster.workers
        ],
        "details": cluster.details,
    }


@app.command(rich_help_panel="Cluster")
def status(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """Show the cluster's state and its workers.

    Example: tpuft status --json
    """
    from rich.table import Table

    from tpuft.ops.cluster import status as status_op

    cfg = _load_cluster(config)
    cluster = status_op(cfg)
    if json_out:
        print(json.dumps(_cluster_json(cluster), indent=2))
        return
    console = _console()
    colour = "green" if cluster.ready else "yellow" if cluster.state == "NOT_FOUND" else "red"
    console.print(f"cluster [bold]{cluster.name}[/bold] ({cluster.provider}, {cluster.accelerator}): [{colour}]{cluster.state}[/{colour}]")
    for key, value in cluster.details.items():
        console.print(f"  {key}: {value}")
    console.print(f"  run storage: {cluster.bucket}")
    if cluster.workers:
        table = Table("worker", "address", "internal address", "home", "cpus")
        for w in cluster.workers:
            cpus = ",".join(map(str, w.cpus)) or ("shared" if w.home else "own")
            table.add_row(str(w.index), w.address, w.internal_address or "-", str(w.home or "-"), cpus)
        console.print(table)


@app.command(rich_help_panel="Cluster")
def delete(config: ConfigOpt = None, yes: YesOpt = False) -> None:
    """Delete the cluster's workers. Runs in the bucket are kept.

    Example: tpuft delete --yes
    """
    from tpuft.ops.cluster import delete as delete_op
    from tpuft.ops.cluster import status as status_op

    cfg = _load_cluster(config)
    cluster = status_op(cfg)
    console = _console()
    if cluster.state == "NOT_FOUND":
        console.print(f"cluster {cfg.name} does not exist; nothing to delete")
        return
    if not yes:
        if not sys.stdin.isatty():
            _err_console().print("refusing to delete without confirmation: pass --yes")
            raise typer.Exit(2)
        typer.confirm(f"Delete cluster {cfg.name} ({len(cluster.workers)} workers)?", abort=True)
    delete_op(cfg)
    console.print(f"[green]deleted cluster {cfg.name}[/green]; runs kept in {cluster.bucket}")


@app.command("exec", rich_help_panel="Cluster", context_settings={"allow_extra_args": True})
def exec_(
    command: Annotated[list[str], typer.Argument(help="Command to run; one quoted argument is a shell line.")],
    worker: Annotated[Optional[str], typer.Option("--worker", "-w", help="Workers to run on, e.g. 0,2 or 1-3 (default: all).")] = None,
    config: ConfigOpt = None,
) -> None:
    """Run a command on every worker (or some) in parallel, with prefixed output.

    Example: tpuft exec -- 'hostname; nproc'
    """
    from tpuft.ops.cluster import exec_command
    from tpuft.ops.common import raise_on_failure

    cfg = _load_cluster(config)
    result = exec_command(cfg, command, workers=worker, on_line=_line_printer(_console()))
    raise_on_failure(result, "the command")


@app.command(rich_help_panel="Cluster")
def ssh(
    worker: Annotated[int, typer.Option("--worker", "-w", help="Which worker (0 is the coordinator).")] = 0,
    config: ConfigOpt = None,
) -> None:
    """Open an interactive shell on one worker (SSH on GCP; the worker's folder locally).

    Example: tpuft ssh --worker 1
    """
    import os
    import shutil

    from tpuft.errors import UsageError
    from tpuft.ops.cluster import shell_argv

    argv, env, cwd = shell_argv(_load_cluster(config), worker)
    if shutil.which(argv[0]) is None:
        raise UsageError(f"{argv[0]} is not installed on this machine")
    if cwd:
        os.chdir(cwd)
    os.execvpe(argv[0], argv, {**os.environ, **env})


# ---------------------------------------------------------------------------------------------------------------
# Training


@app.command(rich_help_panel="Training")
def setup(recipe: RecipeArg, config: ConfigOpt = None, overrides: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Install the recipe's backend environment on every worker, in parallel (cached: the second time takes seconds).

    Example: tpuft setup quickstart
    """
    from tpuft.ops.setup import setup as setup_op

    loaded = _load_recipe(recipe, overrides)
    cfg = _load_cluster(config)
    console = _err_console() if json_out else _console()
    console.print(f"setting up [bold]{loaded.value.backend.kind}[/bold] on the workers of {cfg.name}")
    result = setup_op(cfg, loaded.value, on_line=_line_printer(console))
    if json_out:
        payload = {"backend": result.backend, "venv": result.venv, "python": f"{result.venv}/bin/python", "seconds": round(result.seconds, 2)}
        print(json.dumps(payload, indent=2))
        return
    console.print(f"[green]setup done[/green] on {result.workers} worker(s) in {_fmt_seconds(result.seconds)}: {result.venv}")


@app.command(rich_help_panel="Training")
def train(recipe: RecipeArg, config: ConfigOpt = None, overrides: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Launch the recipe on every worker, stream their logs, stop all of them if one fails.

    Example: tpuft train quickstart --set train.steps=200
    """
    from tpuft.ops.train import train as train_op

    loaded = _load_recipe(recipe, overrides)
    cfg = _load_cluster(config)
    console = _err_console() if json_out else _console()  # stdout carries only the JSON
    _preflight(cfg, loaded, console)
    result = train_op(
        cfg,
        loaded,
        on_line=_line_printer(console),
        on_start=lambda run_id, run_dir: console.print(f"run [bold]{run_id}[/bold] -> {run_dir}"),
        checked=True,
    )
    _print_train_summary(console, result, json_out)


def _print_train_summary(console: Console, result: Any, json_out: bool) -> None:
    if json_out:
        payload = {
            "run_id": result.run_id,
            "run_dir": str(result.run_dir),
            "seconds": round(result.seconds, 1),
            "last_train": result.last_train,
            "last_eval": result.last_eval,
            "export_dir": str(result.export_dir) if result.export_dir else None,
            "weight_digests": result.weight_digests,
        }
        print(json.dumps(payload, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"run {result.run_id}", show_header=False)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # paths are shown whole, to be copied
    table.add_row("wall time", _fmt_seconds(result.seconds))
    table.add_row("workers", str(result.workers))
    table.add_row("final train loss", _fmt(result.last_train.get("loss")))
    for key in ("eval_loss", "eval_token_accuracy", "eval_exact_match"):
        if key in result.last_eval:
            table.add_row(key.replace("_", " "), _fmt(result.last_eval[key]))
    digests = set(result.weight_digests.values())
    if digests:
        same = "identical on all workers" if len(digests) == 1 and len(result.weight_digests) == result.workers else "DIFFER between workers"
        table.add_row("weights", same)
    table.add_row("run dir", str(result.run_dir))
    if result.export_dir:
        table.add_row("HF export", str(result.export_dir))
    console.print(table)


@app.command(rich_help_panel="Training")
def up(
    recipe: RecipeArg,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    yes: YesOpt = False,
) -> None:
    """Create, set up, train, summarize and export in one go.

    Example: tpuft up quickstart
    """
    import time

    from tpuft.ops.cluster import create as create_op
    from tpuft.ops.setup import setup as setup_op
    from tpuft.ops.train import train as train_op

    started = time.monotonic()
    loaded = _load_recipe(recipe, overrides)
    cfg = _load_cluster(config)
    console = _err_console() if json_out else _console()  # stdout carries only the JSON
    printer = _line_printer(console)
    _preflight(cfg, loaded, console)  # a bad recipe or data file must not cost a cluster and a venv build first
    console.rule(f"1/4 create {cfg.name}")
    _confirm_cost(cfg, yes, console)
    created = create_op(cfg)
    console.print(f"{len(created.cluster.workers)} worker(s), {'created' if created.created else 'reused'}; runs in {created.cluster.bucket}")
    console.rule(f"2/4 setup {loaded.value.backend.kind}")
    done = setup_op(cfg, loaded.value, on_line=printer)
    console.print(f"environment ready in {_fmt_seconds(done.seconds)}: {done.venv}")
    console.rule(f"3/4 train {loaded.value.name}")
    result = train_op(
        cfg, loaded, on_line=printer, on_start=lambda rid, rdir: console.print(f"run [bold]{rid}[/bold] -> {rdir}"), checked=True
    )
    console.rule("4/4 summary and export")
    _print_train_summary(console, result, json_out)
    if not json_out:
        console.print(f"total time {_fmt_seconds(time.monotonic() - started)}")
        if result.export_dir:
            console.print(f"load it: T5ForConditionalGeneration.from_pretrained({str(result.export_dir)!r})")


# ---------------------------------------------------------------------------------------------------------------
# Results


@app.command(rich_help_panel="Results")
def monitor(
    run_id: Annotated[Optional[str], typer.Argument(help="Run id or a unique prefix (default: the latest run).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one snapshot and exit (default: refresh until the run ends).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 5.0,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the loss and eval curves to this PNG and exit.")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch a run: node state, per-worker health, step, loss, lr, throughput, eval metrics, ETA and log tails.

    Refreshes every few seconds until the run ends (Ctrl-C leaves, the run goes on). Reads metrics.jsonl, or the TensorBoard events of a backend that writes only those (T5X).

    Example: tpuft monitor --plot curves.png
    """
    from tpuft.errors import UsageError
    from tpuft.monitor import watch
    from tpuft.runs import read_run_metrics, resolve_run

    if interval <= 0:
        raise UsageError(f"--interval {interval}: must be positive")
    cfg = _load_cluster(config)
    run = resolve_run(cfg, run_id)
    if plot is not None:
        from tpuft.plot import plot_curves

        log, _ = read_run_metrics(run.local_view())
        written = plot_curves(log, plot, title=run.id)
        _console().print(f"[green]wrote {written}[/green]: {len(log.train_rows)} training and {len(log.eval_rows)} eval points")
        return
    snap = watch(cfg, run)
    if json_out:
        print(json.dumps(snap.as_json(), indent=2))
        return
    console = _console()
    if once or snap.ended or not console.is_terminal:
        console.print(_snapshot_view(snap))
        return
    import time

    from rich.live import Live

    try:
        with Live(_snapshot_view(snap), console=console, refresh_per_second=2, screen=False) as live:
            while not snap.ended:
                time.sleep(interval)
                snap = watch(cfg, run)
                live.update(_snapshot_view(snap))
    except KeyboardInterrupt:
        console.print("[dim]stopped watching; the run goes on[/dim]")


def _snapshot_view(snap: Any) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    info = snap.info
    colour = {"running": "green", "finished": "blue", "failed": "red", "stale": "yellow", "interrupted": "yellow"}.get(snap.status, "white")
    node = f"  node [bold]{snap.node_state}[/bold]" if snap.node_state else ""
    stale = f" (no heartbeat for {_fmt_seconds(snap.stale_for_s)})" if snap.stale_for_s is not None else ""
    head = Text.from_markup(
        f"run [bold]{snap.run_id}[/bold]  recipe {info.get('recipe', '-')}  backend {info.get('backend', '-')}  "
        f"status [bold {colour}]{snap.status}[/bold {colour}]{stale}{node}\n"
        f"step {snap.step}/{snap.total_steps or '?'}  elapsed {_fmt_seconds(snap.elapsed_s)}  ETA {_fmt_seconds(snap.eta_s)}"
    )
    parts: list[Any] = [head]
    if snap.total_steps:
        done = min(snap.step, snap.total_steps) / snap.total_steps
        parts.append(Text("█" * round(done * 50) + "░" * (50 - round(done * 50)) + f" {done:.0%}", style=colour))
    table = Table("metric", "value", title=f"latest (from {snap.metrics_source})", title_justify="left")
    for key in ("loss", "lr", "examples_per_s", "tokens_per_s", "elapsed_s"):
        if key in snap.last_train:
            table.add_row(key, _fmt_metric(key, snap.last_train[key]))
    for key, value in snap.last_eval.items():
        if key.startswith("eval_"):
            table.add_row(f"{key} (step {snap.last_eval.get('step')})", _fmt(value))
    best = snap.best_metric
    if best:
        table.add_row(f"best {best[0]}", f"{_fmt(best[1])} at step {best[2]}")
    parts.append(table)
    workers = Table("worker", "status", "step", "loss", "lr", "ex/s", "tok/s", "heartbeat", "last log line", title="workers", title_justify="left")
    for w in snap.workers:
        age = f"{_fmt_seconds(w.age_s)} ago" + (" [red](stale)[/red]" if w.stale else "") if w.age_s is not None else "-"
        line = (w.last_log_line or "")[-70:]
        workers.add_row(
            str(w.index), w.status, _fmt(w.step), _fmt_metric("loss", w.loss), _fmt_metric("lr", w.lr),
            _fmt_metric("examples_per_s", w.examples_per_s), _fmt_metric("tokens_per_s", w.tokens_per_s), age, Text(line),
        )
    parts.append(workers)
    if snap.skipped_lines:
        parts.append(Text(f"skipped {len(snap.skipped_lines)} corrupt metrics line(s) (lines {snap.skipped_lines[:5]})", style="yellow"))
    for note in snap.notes:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


@app.command(rich_help_panel="Results")
def runs(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """List the runs in the cluster's bucket (or local folder): recipe, backend, status, steps, best eval, start.

    Example: tpuft runs --json
    """
    import time

    from rich.table import Table

    from tpuft.runs import list_runs

    found = [run.snapshot() for run in list_runs(_load_cluster(config))]
    if json_out:
        print(json.dumps([r.as_json() | {"started": r.info.get("started")} for r in found], indent=2))
        return
    table = Table("run", "recipe", "backend", "status", "steps", "best eval", "started")
    for r in found:
        best = r.best_metric
        started = r.info.get("started")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if isinstance(started, (int, float)) else "-"
        status = r.status + (f" ({_fmt_seconds(r.stale_for_s)})" if r.stale_for_s is not None else "")
        table.add_row(r.run_id, str(r.info.get("recipe", "-")), str(r.info.get("backend", "-")), status,
                      f"{r.step}/{r.total_steps or '?'}", f"{best[0]} {_fmt(best[1])} @{best[2]}" if best else "-", when)
    console = _console()
    console.print(table if found else "no runs yet (start one: tpuft up quickstart)")


@app.command(rich_help_panel="Results")
def logs(
    run_id: Annotated[Optional[str], typer.Argument(help="Run id or a unique prefix (default: the latest run).")] = None,
    worker: Annotated[Optional[int], typer.Option("--worker", "-w", help="Only this worker's log (default: all, interleaved in time order).")] = None,
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")] = False,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Show when each line arrived (UTC).")] = False,
    config: ConfigOpt = None,
) -> None:
    """Print a run's worker logs; -f follows them live while it trains.

    Example: tpuft logs -f --worker 0
    """
    from tpuft.ops.logs import follow, open_run_logs, read_all

    run_logs = open_run_logs(_load_cluster(config), run_id, worker)
    prefix = len(run_logs.sources) > 1 or worker is None

    def emit(line: Any) -> None:
        print(line.render(prefix=prefix, timestamps=timestamps), flush=True)

    if not follow_:
        for line in read_all(run_logs):
            emit(line)
        return
    try:
        follow(run_logs, emit)
    except KeyboardInterrupt:
        pass


@app.command(rich_help_panel="Results")
def pull(
    run_id: Annotated[Optional[str], typer.Argument(help="Run id, a unique prefix of one, or 'latest' (the default).")] = None,
    dest: Annotated[Optional[Path], typer.Argument(help="Where to put it (default: ./RUN_ID).")] = None,
    checkpoints: Annotated[str, typer.Option("--checkpoints", help="Which checkpoints come along: latest, best, all or none.")] = "latest",
    workers: Annotated[int, typer.Option("--workers", help="Parallel downloads.")] = 16,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Copy a run home: recipe, metrics, logs, TensorBoard events, the chosen checkpoints and the HF export.

    Parallel, verified against the bucket's checksums, resumable: files already there and intact are skipped, so running it again after an interruption fetches only the rest.

    Example: tpuft pull latest ./my-run --checkpoints best
    """
    from tpuft.ops.pull import pull as pull_op
    from tpuft.runs import resolve_run

    cfg = _load_cluster(config)
    run = resolve_run(cfg, run_id)
    target = dest if dest is not None else Path(run.id)
    console = _console()
    with _byte_progress(console, f"pulling {run.id}", enabled=not json_out) as progress:
        result = pull_op(run.url, target, checkpoints=checkpoints, workers=workers, progress=progress, project=cfg.gcp.project)
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    steps = ", ".join(str(s) for s in result.checkpoints) or "none"
    console.print(
        f"[green]pulled {result.source} -> {result.dest}[/green]: {result.files_fetched} files fetched "
        f"({result.bytes_fetched / 1e6:.1f} MB), {result.files_skipped} already there and intact; "
        f"{result.files_total} files, {result.bytes_total / 1e6:.1f} MB in all; checkpoints: {steps}; {result.seconds:.1f} s"
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


@app.command(rich_help_panel="Results")
def tensorboard(
    run_id: Annotated[Optional[str], typer.Argument(help="Run id or a unique prefix (default: the latest run).")] = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to serve on (0: a free one).")] = 6006,
    host: Annotated[str, typer.Option("--host", help="Address to bind (0.0.0.0 to reach it from other machines).")] = "127.0.0.1",
    config: ConfigOpt = None,
) -> None:
    """Serve a run's TensorBoard events (from its folder, or mirrored from the bucket every 30 s) until Ctrl-C.

    Example: tpuft tensorboard --port 6007
    """
    import time

    from tpuft.ops.tensorboard import free_port, start_tensorboard
    from tpuft.runs import resolve_run

    run = resolve_run(_load_cluster(config), run_id).url
    console = _console()
    if port and not _port_is_free(host, port):
        console.print(f"[yellow]port {port} is taken; using a free one[/yellow]")
        port = free_port(host)
    with console.status(f"starting TensorBoard on {run} ..."):
        handle = start_tensorboard(run, port=port, host=host)
    console.print(f"TensorBoard for {run}: [bold]{handle.url}[/bold]  (events: {handle.logdir}; Ctrl-C stops it)")
    try:
        while handle.running:
            time.sleep(1.0)
        console.print(f"[red]TensorBoard exited[/red]; its output: {handle.log_path}")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()


def _port_is_free(host: str, port: int) -> bool:
    import socket

    from tpuft.errors import UsageError

    try:
        socket.getaddrinfo(host, port)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--host {host!r}: not an address of this machine ({exc})") from None
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@app.command(rich_help_panel="Results")
def convert(
    checkpoint: Annotated[
        Optional[str],
        typer.Argument(help="T5X model dir or checkpoint_N (legacy or Orbax), a torch run/checkpoints/step_N dir, or a Keras/TF save_pretrained dir; local or gs://."),
    ] = None,
    out_dir: Annotated[Optional[str], typer.Argument(help="Where to write the Hugging Face model dir (local or gs://).")] = None,
    run: Annotated[Optional[str], typer.Option("--run", help="Convert the latest checkpoint of this run (OUT_DIR: its export/hf).")] = None,
    step: Annotated[Optional[int], typer.Option("--step", help="Pick this step instead of the latest.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (default) or bfloat16.")] = "float32",
    max_shard_size: Annotated[Optional[str], typer.Option("--max-shard-size", help="Split the weights into shards of at most this size (e.g. 5GB, 500MB).")] = None,
    hf_config: Annotated[Optional[Path], typer.Option("--hf-config", help="JSON whose keys override the derived HF config.")] = None,
    hf_set: Annotated[Optional[list[str]], typer.Option("--hf-set", help="Override one HF config key: KEY=VALUE (repeatable).")] = None,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="A SentencePiece model file or an HF tokenizer dir to ship with the model.")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="Load the result with transformers, run it, compare with the source where possible.")] = False,
    verify_python: Annotated[Optional[str], typer.Option("--verify-python", help="Python with torch + transformers for --verify (default: found).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a non-empty OUT_DIR.")] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Turn a training checkpoint into a Hugging Face model dir (config.json, safetensors, tokenizer).

    Reads T5X checkpoints (legacy and Orbax) without t5x, PyTorch/XLA checkpoints and transformers 4.x Keras/TF weights; streams one tensor at a time, and writes OUT_DIR only when it is complete.

    Example: tpuft convert gs://my-bucket/t5x/flan_t5_base ./flan-t5-base --verify
    """
    from tpuft.errors import UsageError
    from tpuft.ops.convert import convert as convert_op
    from tpuft.ops.convert import parse_overrides

    if dtype not in {"float32", "bfloat16"}:
        raise UsageError(f"--dtype {dtype!r}: expected float32 or bfloat16")
    if run is not None and checkpoint is not None and out_dir is None:
        checkpoint, out_dir = None, checkpoint  # `convert --run ID OUT_DIR`
    cfg = _load_cluster(config) if run is not None or _mentions_bucket(checkpoint, out_dir) else None
    overrides = parse_overrides(hf_set or [], hf_config)
    console = _console()
    with _byte_progress(console, "converting", enabled=not json_out) as progress:
        report = convert_op(
            checkpoint, out_dir, run_id=run, config=cfg, step=step, dtype=dtype, overwrite=overwrite, overrides=overrides,
            tokenizer=tokenizer, max_shard_size=max_shard_size, verify=verify, verify_python=verify_python, progress=progress,
        )
    if json_out:
        print(json.dumps(report.as_json(), indent=2))
        return
    r = report.result
    step_text = f" step {report.step}" if report.step is not None else ""
    shards = f" in {r.shards} shards" if r.shards > 1 else ""
    console.print(
        f"[green]wrote {report.out}[/green] from {r.kind}{step_text} ({r.checkpoint}): {r.config.get('model_type')}, "
        f"{r.tensors} tensors, {r.weight_bytes / 1e6:.1f} MB {r.dtype}{shards}"
    )
    for note in r.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if report.verify is not None:
        v = report.verify
        compared = (
            f"max |logit diff| vs {v['compared_with']}: {v['max_abs_diff']:.2e}" if v.get("compared_with") else f"not compared: {v.get('not_compared')}"
        )
        console.print(f"[green]verified[/green] with transformers {v['transformers']} ({v['model_class']}): loads cleanly, finite logits; {compared}")


def _mentions_bucket(*paths: str | None) -> bool:
    """gs:// paths use the cluster file's project when there is one (and credentials' default otherwise)."""
    return any(p is not None and p.startswith("gs://") for p in paths)


@contextmanager
def _byte_progress(console: Console, label: str, *, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar with bytes and rate for long copies; nothing when output is JSON."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


# ---------------------------------------------------------------------------------------------------------------
# Recipes


@recipes_app.command("ls")
def recipes_ls(json_out: JsonOpt = False) -> None:
    """List the shipped recipes.

    Example: tpuft recipes ls
    """
    from rich.table import Table

    from tpuft.ops.recipes import list_recipes

    found = list_recipes()
    if json_out:
        print(json.dumps([{"name": r.name, "backend": r.backend, "path": str(r.path), "summary": r.summary} for r in found], indent=2))
        return
    table = Table("recipe", "backend", "what it is")
    for r in found:
        table.add_row(r.name, r.backend, r.summary)
    _console().print(table)


@recipes_app.command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="A shipped recipe's name.")]) -> None:
    """Print a shipped recipe.

    Example: tpuft recipes show quickstart
    """
    from tpuft.ops.recipes import find

    print(find(name).read_text(encoding="utf-8"), end="")


@recipes_app.command("cp")
def recipes_cp(
    name: Annotated[str, typer.Argument(help="A shipped recipe's name.")],
    dest: Annotated[Path, typer.Argument(help="File or folder to copy it to.")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing file.")] = False,
) -> None:
    """Copy a shipped recipe to edit it (its data paths keep pointing at the shipped data).

    Example: tpuft recipes cp quickstart my_recipe.yaml
    """
    from tpuft.ops.recipes import copy

    target = copy(name, dest, overwrite=overwrite)
    _console().print(f"copied {name} to {target}")


@recipes_app.command("validate")
def recipes_validate(recipe: RecipeArg, overrides: SetOpt = None, config: ConfigOpt = None) -> None:
    """Check a recipe (and the cluster file) without running anything; exit 2 with every problem listed.

    Example: tpuft recipes validate my_recipe.yaml --set train.steps=10
    """
    loaded = _load_recipe(recipe, overrides)
    cfg = _load_cluster(config)
    console = _console()
    checked = _preflight(cfg, loaded, console)
    counts = ", ".join(f"{check.examples:,} {key}" for key, check in checked.files.items())
    console.print(
        f"[green]{loaded.source} is valid[/green] for cluster {cfg.name} ({cfg.num_workers} workers); "
        f"examples read: {counts}"
    )


def _preflight(cfg: ClusterConfig, loaded: Loaded[RecipeConfig], console: Console) -> Any:
    """The recipe against the cluster and its data read through, with a spinner that counts bytes on big files."""
    from tpuft.ops.preflight import preflight

    with console.status(f"checking the data of {loaded.value.name} ...") as spinner:

        def progress(path: Path, done: int, total: int) -> None:
            spinner.update(f"checking {path.name}: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB")

        return preflight(cfg, loaded, progress)


# ---------------------------------------------------------------------------------------------------------------


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
        console = _err_console()
        from rich.markup import escape

        label = "[yellow]interrupted:[/yellow]" if exc.exit_code == 130 else "[bold red]error:[/bold red]"
        console.print(f"{label} {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            console.print(escape(exc.hint), soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _err_console().print("[yellow]interrupted: every worker process was stopped[/yellow]")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:  # a path or address of the user's that the system refused: one line, not a traceback
        import os

        if os.environ.get("TPUFT_DEBUG"):
            raise
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        _err_console().print(f"[bold red]error:[/bold red] {exc.strerror or exc}{where}", soft_wrap=True)
        _err_console().print("(TPUFT_DEBUG=1 shows where it happened)")
        sys.exit(1)
    except typer.Abort as exc:  # click turns Ctrl-C into Abort outside standalone mode
        if isinstance(exc.__cause__, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            _err_console().print("[yellow]interrupted: every worker process was stopped[/yellow]")
            sys.exit(130)
        _err_console().print("aborted")
        sys.exit(1)
    except Exception as exc:
        show = getattr(exc, "show", None)
        if callable(show) and isinstance(getattr(exc, "exit_code", None), int):  # click's usage errors
            show()
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        raise
    if code == 130:  # click returns 130 for a Ctrl-C that it caught itself
        _err_console().print("[yellow]interrupted[/yellow]")
    sys.exit(code if isinstance(code, int) else 0)
