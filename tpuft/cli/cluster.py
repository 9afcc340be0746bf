"""The Cluster panel: create, status, delete, exec, ssh, doctor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tpuft.cli.app import command
from tpuft.cli.options import (
    ConfigOpt,
    JsonOpt,
    SetOpt,
    YesOpt,
    confirm_or_refuse,
    load_cluster_file,
    load_files,
)
from tpuft.cli.render import (
    cluster_json,
    cluster_slices,
    err_console,
    line_printer,
    out_console,
    worker_label,
)

if TYPE_CHECKING:
    from rich.console import Console

    from tpuft.config import ClusterConfig, Loaded, RecipeConfig
    from tpuft.ops.cluster import CostEstimate

DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Show the plan and exit: the node(s) or queued resource with the request create would send, the "
        "bucket, "
        "which workers run what, the environment's names and the list price; no API call, no connection.",
    ),
]


def show_plan(
    cfg: ClusterConfig, verb: str, json_out: bool, recipe: Loaded[RecipeConfig] | None = None
) -> None:
    """``--dry-run``: the plan as worked out by :mod:`tpuft.ops.plan`, as text or (``--json``) as JSON."""
    from tpuft.ops.plan import lines, plan

    result = plan(cfg, verb, recipe)
    if json_out:
        print(json.dumps(result.as_json(), indent=2))
        return
    console = out_console()
    for line in lines(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def confirm_cost(cfg: ClusterConfig, yes: bool, console: Console) -> Callable[[CostEstimate], None]:
    """How this terminal agrees to a new cloud cluster's cost: show the estimate and ask, or require --yes
    when nobody can answer (a script, CI)."""

    def confirm(estimate: CostEstimate) -> None:
        console.print(estimate.describe(cfg.accelerator, cfg.gcp.spot), soft_wrap=True)
        confirm_or_refuse(
            yes,
            f"Create {cfg.name} in {cfg.gcp.project}/{cfg.gcp.zone}?",
            f"creating {cfg.name} in {cfg.gcp.project}/{cfg.gcp.zone} costs money",
        )

    return confirm


@command("create")
def create(
    config: ConfigOpt = None, json_out: JsonOpt = False, yes: YesOpt = False, dry_run: DryRunOpt = False
) -> None:
    from tpuft.ops.cluster import cost_estimate, cost_to_confirm
    from tpuft.ops.cluster import create as create_op

    cfg = load_cluster_file(config)
    if dry_run:
        show_plan(cfg, "create", json_out)
        return
    console = err_console() if json_out else out_console()
    estimate = cost_to_confirm(cfg)
    if estimate is not None:
        confirm_cost(cfg, yes, console)(estimate)
    with console.status(f"creating {cfg.name} ({cfg.provider}, {cfg.accelerator})...") as spinner:
        result = create_op(cfg, progress=lambda msg: spinner.update(msg))
    if json_out:
        print(json.dumps(cluster_json(result.cluster) | {"created": result.created}, indent=2))
        return
    verb = "created" if result.created else "already exists, reused"
    acc = result.accelerator
    per_hour = cost_estimate(cfg).per_hour  # the one estimate: --dry-run and the confirmation show it too
    price = f", list price ~${per_hour:.2f}/h on GCP" if per_hour else ""
    console.print(
        f"[green]cluster {cfg.name} {verb}[/green]: {len(result.cluster.workers)} worker(s)"
        f"{f' in {result.cluster.layout.slices} slices' if result.cluster.layout.slices > 1 else ''}; "
        f"{acc.name} = {acc.chips} chips on {acc.hosts} host(s){price}"
    )
    console.print(f"run storage: {result.cluster.bucket}")
    if result.cluster.details.get("bucket_warning"):
        console.print(f"[yellow]warning:[/yellow] {result.cluster.details['bucket_warning']}", soft_wrap=True)


@command("status")
def status(config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.ops.cluster import status as status_op

    cfg = load_cluster_file(config)
    cluster = status_op(cfg)
    if json_out:
        print(json.dumps(cluster_json(cluster), indent=2))
        return
    console = out_console()
    colour = "green" if cluster.ready else "yellow" if cluster.state == "NOT_FOUND" else "red"
    console.print(
        f"cluster [bold]{cluster.name}[/bold] ({cluster.provider}, {cluster.accelerator}): "
        f"[{colour}]{cluster.state}[/{colour}]"
    )
    layout = cluster.layout
    multislice = layout.slices > 1
    for key, value in cluster.details.items():
        if not (multislice and key.startswith("slice ")):  # shown per slice below
            console.print(f"  {key}: {value}")
    console.print(f"  run storage: {cluster.bucket}")
    if multislice:
        console.print(
            f"  slices: {layout.slices} x {layout.hosts} host(s); --worker S:I is host I of slice S"
        )
        for entry in cluster_slices(cluster):
            node = f"node {entry['node']} " if entry["node"] else ""
            console.print(
                f"    slice {entry['slice']}: {node}{entry['state']}, workers {', '.join(entry['workers'])}"
            )
    if cluster.workers:
        table = FitTable(
            Col("worker", copy=True),
            Col("address", copy=True),
            Col("internal address", copy=True, drop=2),
            Col("home", copy=True),
            Col("cpus", drop=1),
        )
        for w in cluster.workers:
            cpus = ",".join(map(str, w.cpus)) or ("shared" if w.home else "own")
            table.add_row(
                worker_label(w.index, layout), w.address, w.internal_address or "-", str(w.home or "-"), cpus
            )
        console.print(table)


@command("delete")
def delete(
    config: ConfigOpt = None,
    yes: YesOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Stop the runs that train on the cluster first (they are refused otherwise)."
        ),
    ] = False,
) -> None:
    from tpuft.ops.cluster import delete as delete_op
    from tpuft.ops.cluster import status as status_op

    cfg = load_cluster_file(config)
    cluster = status_op(cfg)
    console = out_console()
    if cluster.state == "NOT_FOUND":
        console.print(f"cluster {cfg.name} does not exist; nothing to delete")
        return
    confirm_or_refuse(
        yes,
        f"Delete cluster {cfg.name} ({len(cluster.workers)} workers)?",
        "refusing to delete without confirmation",
    )
    delete_op(cfg, progress=lambda message: console.print(message), force=force)
    console.print(f"[green]deleted cluster {cfg.name}[/green]; runs kept in {cluster.bucket}")


@command("exec", context_settings={"allow_extra_args": True})
def exec_(
    command: Annotated[
        list[str], typer.Argument(help="Command to run; one quoted argument is a shell line.")
    ],
    worker: Annotated[
        str | None,
        typer.Option(
            "--worker",
            "-w",
            help="Workers to run on: flat indices (0,2 or 1-3) or, on a multislice cluster, slice:host (1:0, "
            "1:2-3, or 1:* for a whole slice); default: all.",
        ),
    ] = None,
    config: ConfigOpt = None,
) -> None:
    from tpuft.ops.cluster import exec_command
    from tpuft.ops.common import raise_on_failure

    cfg = load_cluster_file(config)
    result = exec_command(
        cfg, command, workers=worker, on_line=line_printer(out_console()), cluster_path=config, use_agent=True
    )
    raise_on_failure(result, "the command", worker_exit_code=True)


@command("ssh")
def ssh(
    worker: Annotated[
        str,
        typer.Option(
            "--worker", "-w", help="Which worker: a flat index (0 is the coordinator) or slice:host like 1:0."
        ),
    ] = "0",
    config: ConfigOpt = None,
) -> None:
    import os
    import shutil

    from tpuft.core.errors import UsageError
    from tpuft.ops.cluster import shell_argv

    argv, env, cwd = shell_argv(load_cluster_file(config), worker)
    if shutil.which(argv[0]) is None:
        raise UsageError(f"{argv[0]} is not installed on this machine")
    if cwd:
        os.chdir(cwd)
    os.execvpe(argv[0], argv, {**os.environ, **env})


@command("doctor")
def doctor(
    recipe: Annotated[
        Path, typer.Argument(help="Recipe file, or the name of a shipped recipe (see: tpuft recipes ls).")
    ],
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.ops.doctor import doctor as doctor_op
    from tpuft.ops.doctor_checks import CHECKS, CONTROLLER

    loaded, cfg = load_files(recipe, overrides, config, against_cluster=False)  # the doctor checks the hosts
    console = err_console() if json_out else out_console()
    with console.status(f"asking the workers of {cfg.name} ..."):
        report = doctor_op(cfg, loaded)
    if json_out:
        print(json.dumps(report.as_json(), indent=2))
        if not report.ok:
            raise typer.Exit(1)
        return
    console.print(
        f"cluster [bold]{report.cluster}[/bold] ({report.target}), {report.backend} venv {report.venv_key}, "
        f"tpuft {report.package}"
    )
    columns = [c for c in CHECKS if any(f.check == c and f.status != "skip" for f in report.findings)]
    table = FitTable(Col("worker", copy=True), *(Col(check) for check in columns))
    colours = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}
    rows = [*report.workers, *([CONTROLLER] if any(f.worker == CONTROLLER for f in report.findings) else [])]
    for index in rows:
        cells = []
        for check in columns:
            found = report.cell(index, check)
            cells.append(
                "" if found is None else f"[{colours[found.status]}]{found.cell}[/{colours[found.status]}]"
            )
        table.add_row("this machine" if index == CONTROLLER else str(index), *cells)
    console.print(table)
    for note in report.notes:
        console.print(note, soft_wrap=True, markup=False, highlight=False)
    for line in report.warnings():
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)
    for line in report.problems():
        console.print(f"[red]problem:[/red] {escape(line)}", soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)
    console.print("[green]all checks pass[/green]" + (" (with warnings)" if report.warnings() else ""))
