"""The Training panel: setup, train, up."""

from __future__ import annotations

import json

from tpuft.cli.app import command
from tpuft.cli.cluster import confirm_cost
from tpuft.cli.options import ConfigOpt, JsonOpt, RecipeArg, SetOpt, YesOpt, load_cluster_file, load_recipe_file, preflight_with_status
from tpuft.cli.render import err_console, fmt_seconds, line_printer, out_console, print_train_summary


@command("setup")
def setup(recipe: RecipeArg, config: ConfigOpt = None, overrides: SetOpt = None, json_out: JsonOpt = False) -> None:
    from tpuft.ops.setup import setup as setup_op

    loaded = load_recipe_file(recipe, overrides)
    cfg = load_cluster_file(config)
    console = err_console() if json_out else out_console()
    console.print(f"setting up [bold]{loaded.value.backend.kind}[/bold] on the workers of {cfg.name}")
    result = setup_op(cfg, loaded.value, on_line=line_printer(console))
    if json_out:
        payload = {"backend": result.backend, "venv": result.venv, "python": f"{result.venv}/bin/python", "seconds": round(result.seconds, 2)}
        print(json.dumps(payload, indent=2))
        return
    console.print(f"[green]setup done[/green] on {result.workers} worker(s) in {fmt_seconds(result.seconds)}: {result.venv}")


@command("train")
def train(recipe: RecipeArg, config: ConfigOpt = None, overrides: SetOpt = None, json_out: JsonOpt = False) -> None:
    from tpuft.ops.train import train as train_op

    loaded = load_recipe_file(recipe, overrides)
    cfg = load_cluster_file(config)
    console = err_console() if json_out else out_console()  # stdout carries only the JSON
    preflight_with_status(cfg, loaded, console)
    result = train_op(
        cfg,
        loaded,
        on_line=line_printer(console),
        on_start=lambda run_id, run_dir: console.print(f"run [bold]{run_id}[/bold] -> {run_dir}"),
        checked=True,
    )
    print_train_summary(console, result, json_out)


@command("up")
def up(
    recipe: RecipeArg,
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    json_out: JsonOpt = False,
    yes: YesOpt = False,
) -> None:
    from tpuft.ops.cluster import CreateResult
    from tpuft.ops.setup import SetupResult
    from tpuft.ops.up import STEPS
    from tpuft.ops.up import up as up_op

    loaded = load_recipe_file(recipe, overrides)
    cfg = load_cluster_file(config)
    console = err_console() if json_out else out_console()  # stdout carries only the JSON

    def step(index: int, title: str, previous: object) -> None:
        if isinstance(previous, CreateResult):
            state = "created" if previous.created else "reused"
            console.print(f"{len(previous.cluster.workers)} worker(s), {state}; runs in {previous.cluster.bucket}")
        elif isinstance(previous, SetupResult):
            console.print(f"environment ready in {fmt_seconds(previous.seconds)}: {previous.venv}")
        console.rule(f"{index + 1}/{len(STEPS)} {title}")

    preflight_with_status(cfg, loaded, console)
    result = up_op(
        cfg, loaded, confirm=confirm_cost(cfg, yes, console), on_step=step, on_line=line_printer(console),
        on_start=lambda rid, rdir: console.print(f"run [bold]{rid}[/bold] -> {rdir}"), checked=True,
    )
    print_train_summary(console, result.train, json_out)
    if not json_out:
        console.print(f"total time {fmt_seconds(result.seconds)}")
        if result.train.export_dir:
            console.print(f"load it: T5ForConditionalGeneration.from_pretrained({str(result.train.export_dir)!r})")
