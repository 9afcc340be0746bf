"""Options every verb shares, and loading the two files a user writes (with the data check that ``train``,
``up`` and ``recipes validate`` run before anything else)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from tpuft.config import ClusterConfig, Loaded, RecipeConfig


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="Cluster file (default: $TPUFT_CONFIG, ./tpuft.yaml, then the built-in local one).",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override a recipe key, e.g. --set train.steps=50 (repeatable).",
        show_default=False,
    ),
]
RecipeArg = Annotated[
    Path, typer.Argument(help="Recipe file, or the name of a shipped recipe (see: tpuft recipes ls).")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]


def confirm_or_refuse(yes: bool, question: str, refusal: str) -> None:
    """What ``delete`` and the cloud drills ask before they act: nothing with ``--yes``; on a terminal, the
    question (no: ``aborted``, exit 1); with nobody to answer (a script, CI), ``refusal`` as a usage error
    (exit 2) naming ``--yes``, before anything is done."""
    import sys

    from tpuft.core.errors import UsageError

    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{refusal}: pass --yes to confirm")
    typer.confirm(question, abort=True)


def load_cluster_file(config: Path | None) -> ClusterConfig:
    from tpuft.config import load_cluster
    from tpuft.storage.network import CLOCK

    cluster = load_cluster(config).value
    # every Google Cloud call of this command (a gs:// path too) shares one budget
    CLOCK.arm(cluster.gcp.timeout)
    return cluster


def load_recipe_file(recipe: Path, overrides: list[str] | None) -> Loaded[RecipeConfig]:
    from tpuft.config import load_recipe

    return load_recipe(recipe, overrides or [])


def load_files(
    recipe: Path,
    overrides: list[str] | None,
    config: Path | None,
    *,
    check_files: bool = True,
    against_cluster: bool = True,
) -> tuple[Loaded[RecipeConfig], ClusterConfig]:
    """The recipe and the cluster file for a verb that takes both: every problem of both (and, with
    ``against_cluster``, of the recipe against the cluster's workers) in one error, exit code 2."""
    from tpuft.ops.preflight import load_files as load_both
    from tpuft.storage.network import CLOCK

    loaded, cluster = load_both(
        recipe, overrides, config, check_files=check_files, against_cluster=against_cluster
    )
    CLOCK.arm(cluster.value.gcp.timeout)  # as load_cluster_file does
    return loaded, cluster.value


def preflight_with_status(cfg: ClusterConfig, loaded: Loaded[RecipeConfig], console: Console) -> Any:
    """The recipe against the cluster and its data read through, with a spinner that counts bytes on big
    files."""
    from tpuft.ops.preflight import preflight

    with console.status(f"checking the data of {loaded.value.name} ...") as spinner:

        def progress(path: Path, done: int, total: int) -> None:
            spinner.update(f"checking {path.name}: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB")

        return preflight(cfg, loaded, progress)
