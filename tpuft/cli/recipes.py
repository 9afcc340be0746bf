"""The Recipes panel: ``tpuft recipes ls / show / cp / validate``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tpuft.cli.app import recipe_command
from tpuft.cli.options import ConfigOpt, JsonOpt, RecipeArg, SetOpt, load_cluster_file, load_recipe_file, preflight_with_status
from tpuft.cli.render import out_console


@recipe_command("ls")
def recipes_ls(json_out: JsonOpt = False) -> None:
    from rich.table import Table

    from tpuft.ops.recipes import list_recipes

    found = list_recipes()
    if json_out:
        print(json.dumps([{"name": r.name, "backend": r.backend, "path": str(r.path), "summary": r.summary} for r in found], indent=2))
        return
    table = Table("recipe", "backend", "what it is")
    for r in found:
        table.add_row(r.name, r.backend, r.summary)
    out_console().print(table)


@recipe_command("show")
def recipes_show(name: Annotated[str, typer.Argument(help="A shipped recipe's name.")]) -> None:
    from tpuft.ops.recipes import find

    print(find(name).read_text(encoding="utf-8"), end="")


@recipe_command("cp")
def recipes_cp(
    name: Annotated[str, typer.Argument(help="A shipped recipe's name.")],
    dest: Annotated[Path, typer.Argument(help="File or folder to copy it to.")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing file.")] = False,
) -> None:
    from tpuft.ops.recipes import copy

    target = copy(name, dest, overwrite=overwrite)
    out_console().print(f"copied {name} to {target}")


@recipe_command("validate")
def recipes_validate(recipe: RecipeArg, overrides: SetOpt = None, config: ConfigOpt = None) -> None:
    loaded = load_recipe_file(recipe, overrides)
    cfg = load_cluster_file(config)
    console = out_console()
    checked = preflight_with_status(cfg, loaded, console)
    counts = ", ".join(f"{check.examples:,} {key}" for key, check in checked.files.items())
    console.print(
        f"[green]{loaded.source} is valid[/green] for cluster {cfg.name} ({cfg.num_workers} workers); "
        f"examples read: {counts}"
    )
