"""The Typer app and its sub-app, and the decorators that register a verb with the help the command table
gives.

Every panel module (cluster, training, results, recipes) registers its verbs here; :mod:`tpuft.cli` imports
them all. Help texts come from :mod:`tpuft.commands`, which the fast launcher reads too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from tpuft.commands import QUICKSTART, RECIPE_VERBS, SUMMARY, verb


class Option(TyperOption):
    """A flag shows no value at all (Typer would print ``<bool>`` beside ``--json``, as if it took one); an
    option that takes a value shows it in capitals, as Click writes them: ``--config PATH``, ``--set
    KEY=VALUE``."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        # Typer's <path>, <int>, <int range>, <list[str]>, <a|b> (choices)
        label = self.display_type(ctx).strip("<>")
        # the range is shown after
        label = label.removeprefix("list[").removesuffix("]").removesuffix(" range")
        if "|" in label:
            return label  # the values themselves, as typed
        return _CLICK_NAMES.get(label, label.upper()) + ("..." if self.nargs != 1 else "")


_CLICK_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "FLOAT",
    "path": "PATH",
    "file": "PATH",
    "directory": "PATH",
}


class Argument(TyperArgument):
    """An argument is its name in capitals (``RECIPE``, ``[RUN_ID]`` when it may be left out), in the usage
    line and in the list of arguments alike, with no type beside it (Typer mixes ``{RECIPE}``, ``[recipe]``
    and ``<path>``)."""

    @property
    def display_name_raw(self) -> str:
        return (self.metavar or self.name or "").upper()

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _restyle(param: Any) -> None:
    """Typer builds its own parameter classes: give them the house style, whatever verb or module declared
    them."""
    if type(param) is TyperOption:
        param.__class__ = Option
    elif type(param) is TyperArgument:
        param.__class__ = Argument


class _HouseStyle:
    def get_params(self, ctx: Any) -> Any:
        params = super().get_params(ctx)  # type: ignore[misc]  # the help option and Typer's completion ones too
        for param in params:
            _restyle(param)
        return params


class Command(_HouseStyle, TyperCommand):
    """Every verb's class: its options and arguments in the house style."""


class Group(_HouseStyle, TyperGroup):
    """``tpuft`` and ``tpuft recipes``: their own options in the house style."""


app = typer.Typer(
    name="tpuft",
    cls=Group,
    help=f"{SUMMARY}\n\n{QUICKSTART}",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
recipes_app = typer.Typer(cls=Group, help=verb("recipes").summary, no_args_is_help=True)
app.add_typer(recipes_app, name="recipes", rich_help_panel=verb("recipes").panel)


def command(name: str, **settings: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a verb of the command table (its panel and help come from there)."""
    spec = verb(name)
    return app.command(name, cls=Command, help=spec.help, rich_help_panel=spec.panel, **settings)


def recipe_command(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return recipes_app.command(name, cls=Command, help=verb(name, RECIPE_VERBS).help)
