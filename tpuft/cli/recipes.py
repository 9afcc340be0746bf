"""The Recipes panel: ``tpuft recipes ls / show / cp / validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tpuft.cli.app import recipe_command
from tpuft.cli.options import (
    ConfigOpt,
    JsonOpt,
    RecipeArg,
    SetOpt,
    load_files,
    load_recipe_file,
    preflight_with_status,
)
from tpuft.cli.render import err_console, out_console

if TYPE_CHECKING:
    from tpuft.model.summary import Summary
    from tpuft.ops.compile_fit import FitReport


@recipe_command("ls")
def recipes_ls(json_out: JsonOpt = False) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.ops.recipes import list_recipes

    found = list_recipes()
    if json_out:
        print(
            json.dumps(
                [
                    {"name": r.name, "backend": r.backend, "path": str(r.path), "summary": r.summary}
                    for r in found
                ],
                indent=2,
            )
        )
        return
    table = FitTable(Col("recipe", copy=True), Col("backend"), Col("what it is"))
    for r in found:
        table.add_row(r.name, r.backend, r.summary)
    out_console().print(table)


@recipe_command("backends")
def recipes_backends(json_out: JsonOpt = False) -> None:
    from rich.text import Text

    from tpuft.backends.matrix import capability_matrix, marked
    from tpuft.cli.tables import Col, FitTable

    matrix = capability_matrix()
    if json_out:
        print(json.dumps(matrix.as_json(), indent=2))
        return
    rows, notes = marked(matrix)
    table = FitTable(
        Col("shared key", copy=True),
        *(Col(kind) for kind in matrix.backends),
        title="What each backend implements of the shared recipe",
    )
    for name, marks in rows:
        table.add_row(name, *(f"[green]{mark}[/]" if mark == "yes" else f"[red]{mark}[/]" for mark in marks))
    counts = matrix.counts()
    table.add_row(
        Text("supported", style="bold"), *(f"{counts[k]} of {len(matrix.rows)}" for k in matrix.backends)
    )
    console = out_console()
    console.print(table)
    if notes:
        console.print("Why not:")
        for number, note in enumerate(notes, 1):
            console.print(f"  {number}. {note}", markup=False, highlight=False)


@recipe_command("show")
def recipes_show(
    name: Annotated[
        str, typer.Argument(help="A recipe file, or the name of a shipped recipe.", metavar="RECIPE")
    ],
    summary: Annotated[
        bool,
        typer.Option("--summary", help="The model's parameters per module and the memory per chip instead."),
    ] = False,
    json_out: JsonOpt = False,
    overrides: SetOpt = None,
    config: ConfigOpt = None,
    accelerator: Annotated[
        str | None,
        typer.Option(
            "--accelerator",
            "-a",
            help="Size for this accelerator type (e.g. v4-64), not the cluster's.",
            show_default=False,
        ),
    ] = None,
    compile_step: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="Also compile the real train step for the accelerator on this machine's CPU "
            "(T5X; builds the backend's venv and libtpu once) and report its bytes per chip against HBM.",
        ),
    ] = False,
    force_compile: Annotated[
        bool,
        typer.Option(
            "--force-compile",
            help="--compile even when the paper estimate alone already says the step does not fit.",
        ),
    ] = False,
) -> None:
    from tpuft.core.errors import UsageError

    if not summary:
        given = [
            (flag, value)
            for flag, value in (
                ("--json", json_out),
                ("--set", overrides),
                ("--config", config),
                ("--accelerator", accelerator),
                ("--compile", compile_step),
                ("--force-compile", force_compile),
            )
            if value
        ]
        if given:
            flags = [flag for flag, _ in given]
            goes = "goes" if len(flags) == 1 else "go"
            problems = [f"{', '.join(flags)} only {goes} with --summary (without it, show prints the recipe)"]
            if accelerator is not None:  # every problem at once: the type too
                from tpuft.core.accelerators import lookup, suggestions

                try:
                    lookup(accelerator)
                except UsageError as exc:
                    problems.append(f"--accelerator: {exc.message}")
                    meant = suggestions(accelerator)  # the hint's command is one that runs
                    given = [(f, meant[0] if f == "--accelerator" and meant else v) for f, v in given]
            raise UsageError("\n".join(problems), hint=f"Size it: {_with_summary(name, given)}")
        from tpuft.ops.recipes import recipe_file

        print(recipe_file(name).read_text(encoding="utf-8"), end="")
        return
    from tpuft.ops.recipes import summary as summarize

    compile_step = compile_step or force_compile
    if not compile_step:
        found = summarize(Path(name), overrides, config=config, accelerator=accelerator)
        if json_out:
            print(json.dumps(found.to_json(), indent=2))
        else:
            _print_summary(found)
        return
    from tpuft.core.errors import ConfigError
    from tpuft.ops.recipes import compile_fit

    paper: Summary | None = None
    problem = ""
    try:  # a model the paper summary cannot size (e.g. from the user's own gin files) may still compile
        paper = summarize(Path(name), overrides, config=config, accelerator=accelerator)
    except ConfigError as exc:
        problem = str(exc)
    if not json_out:
        if paper is not None:
            _print_summary(paper)
        else:
            err_console().print(f"no paper summary: {problem}", soft_wrap=True)
    fit = compile_fit(
        Path(name),
        overrides,
        config=config,
        accelerator=accelerator,
        force=force_compile,
        notice=lambda line: err_console().print(line, soft_wrap=True, markup=False, highlight=False),
    )
    if json_out:
        head = paper.to_json() if paper is not None else {"summary_error": problem}
        print(json.dumps({**head, "compile": fit.to_json()}, indent=2))
    else:
        _print_fit(fit)


def _with_summary(name: str, given: list[tuple[str, object]]) -> str:
    """The command the user typed, with ``--summary``: what to run instead."""
    import shlex

    words = ["tpuft", "recipes", "show", name, "--summary"]
    for flag, value in given:
        if isinstance(value, bool):
            words.append(flag)
        else:
            for one in value if isinstance(value, list) else [value]:
                words += [flag, str(one)]
    return shlex.join(words)


def _print_fit(fit: FitReport) -> None:
    from tpuft.cli.tables import Col, FitTable
    from tpuft.ops.compile_fit import gib

    console = out_console()
    step = fit.step
    if step is None:
        console.print(f"{'[green]' if fit.fits else '[red]'}{fit.verdict()}[/]", soft_wrap=True)
        return
    mesh = " x ".join(f"{size} {axis}" for axis, size in step.mesh.items())
    table = FitTable(
        Col(""),
        Col(f"per {fit.device_word}", justify="right"),
        Col("what"),
        title=f"Compiled for {fit.accelerator}: {step.devices} {fit.device_word}s ({mesh}), "
        f"XLA's TPU compiler on this CPU in {step.compile_s:.0f} s",
        more=None,
    )
    for what, size, how in fit.rows():
        table.add_row(what, gib(size), how)
    table.add_row(
        "[bold]total[/bold]", f"[bold]{gib(step.total_bytes)}[/bold]", f"of {gib(fit.hbm_bytes)} HBM"
    )
    console.print(table)
    console.print(f"{'[green]' if fit.fits else '[red]'}{fit.verdict()}[/]", soft_wrap=True)
    if fit.step_time_s is not None:
        flops = step.flops_per_device * step.devices
        cost = (
            f"; {fit.steps:,} steps at least {_dollars(fit.cost_usd)} at list price"
            if fit.cost_usd is not None
            else ""
        )
        console.print(
            f"{flops:.3g} FLOPs per step: at least {_seconds(fit.step_time_s)} per step at peak bf16{cost} "
            "(lower bounds: real steps reach a fraction of peak)",
            soft_wrap=True,
        )


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"


def _dollars(value: float | None) -> str:
    return "$0" if not value else f"${value:,.2f}" if value >= 0.01 else f"${value:.2g}"


def _print_summary(found: Summary) -> None:
    from rich.markup import escape
    from rich.text import Text

    from tpuft.cli.tables import Col, FitTable
    from tpuft.model.summary import fmt_bytes, fmt_count

    console = out_console()
    model = found.model
    console.print(
        f"[bold]{escape(found.recipe)}[/bold] ({found.backend}): {escape(model.name)} "
        f"({escape(model.origin)})\n  {model.describe()}",
        soft_wrap=True,
    )
    params = FitTable(
        Col("module", copy=True),
        Col("parameters", justify="right"),
        Col("trainable", justify="right"),
        Col(""),
        title="Parameters",
        more=None,
    )
    for row in found.modules:
        params.add_row(row.module, f"{row.params:,}", f"{row.trainable:,}", row.note)
    share = found.trainable_params / found.total_params if found.total_params else 0.0
    params.add_row(
        Text("total", style="bold"),
        f"[bold]{found.total_params:,}[/bold]",
        f"[bold]{found.trainable_params:,}[/bold]",
        f"{fmt_count(found.total_params)}, {share:.{1 if share == 0 or share >= 0.001 else 4}%} trainable",
    )
    console.print(params)
    setup, dev = found.setup, found.device_word
    title = (
        f"Memory per {dev}: {found.accelerator}, {found.devices} {dev}s of {fmt_bytes(found.hbm_bytes)} HBM; "
        f"sharding {setup.sharding}, {setup.optimizer}, {setup.precision}, {found.examples_per_device} "
        f"example{'s' if found.examples_per_device != 1 else ''} per {dev} per micro-batch"
    )
    memory = FitTable(Col(""), Col(f"per {dev}", justify="right"), Col("how"), title=title, more=None)
    for row in found.memory:
        memory.add_row(row.what, fmt_bytes(row.bytes), row.how)
    verdict = ("[green]fits[/green]", "to spare") if found.fits else ("[red]does not fit[/red]", "short")
    memory.add_row(
        "[bold]total[/bold]",
        f"[bold]{fmt_bytes(found.total_bytes)}[/bold]",
        f"of {fmt_bytes(found.hbm_bytes)}: {verdict[0]}, {fmt_bytes(abs(found.margin_bytes))} {verdict[1]}",
    )
    console.print(memory)
    for note in found.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True)


@recipe_command("cp")
def recipes_cp(
    name: Annotated[str, typer.Argument(help="A shipped recipe's name.")],
    dest: Annotated[Path, typer.Argument(help="File or folder to copy it to.")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing file.")] = False,
) -> None:
    from tpuft.ops.recipes import copy

    copied = copy(name, dest, overwrite=overwrite)
    renamed = f"; its name is {copied.name} (its runs are {copied.name}-...)" if copied.name != name else ""
    out_console().print(f"copied {name} to {copied.path}{renamed}", soft_wrap=True)


@recipe_command("validate")
def recipes_validate(
    recipe: RecipeArg,
    overrides: SetOpt = None,
    config: ConfigOpt = None,
    no_data_check: Annotated[
        bool,
        typer.Option(
            "--no-data-check", help="Check the recipe and the cluster, not whether its data is here."
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Exit 0: valid and its data read through; 2: a problem in the recipe or the cluster file; 3: valid, but
    data files it names are not on this machine (one line each, with the command that fetches it). With
    ``--json`` the same exit codes; a refusal is the entry point's JSON error (``problems``: one located line
    each), a pass is :func:`_validated`."""
    from tpuft.ops.recipes import check_data_present, data_read

    schema, cfg = load_files(recipe, overrides, config, check_files=False)  # and against the cluster
    console = out_console()
    if no_data_check:
        if json_out:
            print(json.dumps(_validated(schema, cfg, None), indent=2))
            return
        console.print(
            f"[green]{schema.source} is valid[/green] for cluster {cfg.name} ({cfg.num_workers} workers); "
            "data not checked (--no-data-check)"
        )
        return
    check_data_present(schema)
    loaded = load_recipe_file(recipe, overrides)
    # with --json stdout is the JSON's alone: the spinner goes to stderr
    checked = preflight_with_status(cfg, loaded, err_console() if json_out else console)
    found = data_read(loaded.value, checked.files)
    if json_out:
        print(json.dumps(_validated(loaded, cfg, [d.as_json() for d in found], checked.workers), indent=2))
        return
    console.print(
        f"[green]{loaded.source} is valid[/green] for cluster {cfg.name} ({cfg.num_workers} workers); "
        + ("; ".join(_data_words(found)) or "no data files to read"),
        soft_wrap=True,
    )


def _data_words(found: list) -> list[str]:  # type: ignore[type-arg]
    """``examples read: 9,499 train, 500 eval``, then what only the workers read, each said as such."""
    counted = [d.words() for d in found if d.examples is not None]
    words = [f"examples read: {', '.join(counted)}"] if counted else []
    return words + [d.words() for d in found if d.examples is None]


def _validated(
    loaded: Any, cfg: Any, data: list[dict[str, Any]] | None, launched: int | None = None
) -> dict[str, Any]:
    """``validate --json``'s answer when the recipe passes: what was checked against what, and its data
    (``data``: None with ``--no-data-check``)."""
    recipe = loaded.value
    return {
        "valid": True,
        "exit_code": 0,
        "recipe": str(loaded.source),
        "name": recipe.name,
        "backend": recipe.backend.kind,
        "cluster": cfg.name,
        "provider": cfg.provider,
        "accelerator": cfg.accelerator,
        "workers": cfg.num_workers,
        "launched_workers": launched,
        "data_checked": data is not None,
        "data": data,
        "problems": [],
    }
