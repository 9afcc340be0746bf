"""The Typer app and its sub-app, and the decorators that register a verb with the help the command table gives.

Every panel module (cluster, training, results, recipes) registers its verbs here; :mod:`tpuft.cli` imports them
all. Help texts come from :mod:`tpuft.commands`, which the fast launcher reads too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from tpuft.commands import QUICKSTART, RECIPE_VERBS, SUMMARY, verb

app = typer.Typer(
    name="tpuft",
    help=f"{SUMMARY}\n\n{QUICKSTART}",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
recipes_app = typer.Typer(help=verb("recipes").summary, no_args_is_help=True)
app.add_typer(recipes_app, name="recipes", rich_help_panel=verb("recipes").panel)


def command(name: str, **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a verb of the command table (its panel and help come from there)."""
    spec = verb(name)
    return app.command(name, help=spec.help, rich_help_panel=spec.panel, **settings)


def recipe_command(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return recipes_app.command(name, help=verb(name, RECIPE_VERBS).help)
