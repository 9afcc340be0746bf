"""``tpuft gc``: the leaked capacity of :mod:`tpuft.ops.gc` as a table (or JSON), and with ``--yes``
deleted."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from tpuft.cli.app import command
from tpuft.cli.options import ConfigOpt, JsonOpt, load_cluster_file
from tpuft.cli.render import err_console, out_console

ZoneOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--zone",
        "-z",
        metavar="ZONE",
        help="Also look in this zone of the project (repeatable).",
        show_default=False,
    ),
]
IdleOpt = Annotated[
    str,
    typer.Option(
        "--idle",
        metavar="DURATION",
        help="A READY node with no live run for longer than this is idle (e.g. 2h, 90m).",
    ),
]

DeleteOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Delete what is found (without it, gc only lists).")
]


@command("gc")
def gc(
    config: ConfigOpt = None,
    zone: ZoneOpt = None,
    idle: IdleOpt = "2h",
    yes: DeleteOpt = False,
    json_out: JsonOpt = False,
) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.config import parse_duration
    from tpuft.core.errors import UsageError
    from tpuft.ops.gc import Leak, delete_leaks, find_leaks, zones_of

    idle_s = parse_duration(idle)
    if idle_s is None:
        raise UsageError(f"--idle {idle!r}: expected a duration like 2h, 90m or 3600s")
    cfg = load_cluster_file(config)
    zones = zones_of(cfg, list(zone or []))
    console = err_console() if json_out else out_console()
    with console.status(
        f"listing tpuft's nodes and queued resources in {cfg.gcp.project}: {', '.join(zones)} ..."
    ):
        leaks = find_leaks(cfg, zones, float(idle_s))
    if not json_out:
        if not leaks:
            console.print(
                f"nothing to collect in {cfg.gcp.project} ({', '.join(zones)}): no preempted, failed or idle "
                "capacity created by tpuft"
            )
        else:
            table = FitTable(
                Col("kind"),
                Col("name", copy=True),
                Col("zone", copy=True),
                Col("state"),
                Col("accelerator", drop=2),
                Col("pricing", drop=1),
                Col("list price/h (est.)", drop=3),
                Col("for", drop=4),
                Col("why"),
            )
            for leak in leaks:
                price = "-" if leak.price_per_hour is None else f"${leak.price_per_hour:,.2f}"
                age = (
                    "-"
                    if leak.age_s is None
                    else f"{leak.age_s / 3600:.1f} h {'idle' if leak.age_of == 'idle' else 'old'}"
                )
                table.add_row(
                    leak.kind,
                    leak.name,
                    leak.zone,
                    leak.state,
                    leak.accelerator,
                    leak.pricing,
                    price,
                    age,
                    escape(leak.reason),
                )
            console.print(table)
            billing = sum(leak.price_per_hour or 0 for leak in leaks if leak.state in ("READY", "ACTIVE"))
            if billing:
                console.print(f"the idle ones bill about ${billing:,.2f}/h at list price (an estimate)")
    if leaks and yes:

        def report(leak: Leak) -> None:
            if leak.deleted:
                console.print(f"[green]deleted[/green] {leak.kind} {leak.name} in {leak.zone}")
            else:
                err_console().print(
                    f"[red]could not delete[/red] {leak.kind} {leak.name} in {leak.zone}: "
                    f"{escape(leak.error)}",
                    soft_wrap=True,
                )

        delete_leaks(cfg, leaks, report)
    elif leaks and not json_out:
        console.print("pass --yes to delete them")
    if json_out:
        print(
            json.dumps(
                {
                    "project": cfg.gcp.project,
                    "zones": zones,
                    "idle_s": idle_s,
                    "deleting": yes,
                    "leaks": [leak.as_dict() for leak in leaks],
                },
                indent=2,
            )
        )
    if yes and any(not leak.deleted for leak in leaks):
        raise typer.Exit(1)
