"""``tpuft drill maintenance|preempt --worker I``: what maintenance or a preemption would do to one worker, on
purpose (:mod:`tpuft.ops.drill`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tpuft.cli.app import command
from tpuft.cli.options import ConfigOpt, JsonOpt, YesOpt, confirm_or_refuse, load_cluster_file
from tpuft.cli.render import out_console


@command("drill")
def drill(
    kind: Annotated[str, typer.Argument(help="maintenance or preempt.", metavar="maintenance|preempt")],
    worker: Annotated[
        int, typer.Option("--worker", "-w", help="The worker (flat index, as in tpuft status).")
    ] = 0,
    notice: Annotated[
        float, typer.Option("--notice", help="Local pod: seconds from now to the window's start.")
    ] = 60.0,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    yes: YesOpt = False,
) -> None:
    """On GCP the drill acts on the TPU node (a simulated maintenance event; a stopped node), so it is
    confirmed as ``delete`` is (--yes, or the question on a terminal); every provider refuses (exit 2) a
    cluster with no live run, where there is nothing to drill."""
    from tpuft.ops.drill import DrillPlan
    from tpuft.ops.drill import drill as drill_op

    cfg = load_cluster_file(config)

    def confirm(plan: DrillPlan) -> None:
        runs = ", ".join(plan.runs)
        confirm_or_refuse(
            yes,
            f"Drill {plan.kind} on cluster {plan.cluster} (run {runs}): {plan.what}?",
            f"refusing to drill {plan.kind} on cluster {plan.cluster} (run {runs}: {plan.what}) "
            "without confirmation",
        )

    result = drill_op(cfg, kind, worker, notice=notice, confirm=confirm)
    if json_out:
        print(json.dumps(result.as_dict(), indent=2))
        return
    console = out_console()
    console.print(
        f"[yellow]drill {result.kind}[/yellow] on worker {result.worker} ({result.provider}): {result.action}"
    )
    for key, value in result.detail.items():
        console.print(f"  {key}: {value}")
    if result.kind == "maintenance":
        console.print(
            "a run watched with --recover checkpoints before the window, stops, and resumes after it"
        )
    else:
        console.print("a run watched with --recover is recovered from its last checkpoint")
