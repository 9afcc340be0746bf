"""recipes ls / show / cp / validate, modelled on torchtune's ``tune ls`` and ``tune cp``; ``show
--summary``."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuft.config import load_recipe
from tpuft.core.data_fetch import fetch_command
from tpuft.core.errors import ConfigError, TpuftError, UsageError
from tpuft.core.paths import no_shipped_recipes, shipped_recipe, shipped_recipes

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuft.config import Loaded, RecipeConfig
    from tpuft.data import FileCheck
    from tpuft.model.summary import Summary
    from tpuft.ops.compile_fit import FitReport

DATA_MISSING_EXIT = 3
"""``recipes validate``'s exit code when the recipe is valid but data files it names are not on this
machine."""


class DataMissing(TpuftError):
    """The recipe's keys are fine; its data is not here yet (one line per file, with the command that fetches
    it: ``problems``, as a config error's, for ``--json``)."""

    exit_code = DATA_MISSING_EXIT

    def __init__(self, message: str, problems: list[str], *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.problems = problems


@dataclass
class RecipeInfo:
    name: str
    path: Path
    backend: str
    summary: str


def _summary(path: Path) -> str:
    """The first comment line: recipes open with what they are and how to run them."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def list_recipes() -> list[RecipeInfo]:
    """The shipped recipes; none at all is an install without its package data, an error (not an empty
    table)."""
    shipped = shipped_recipes()
    if not shipped:
        raise no_shipped_recipes()
    found = []
    for path in shipped:
        loaded = load_recipe(path, check_files=False)
        found.append(RecipeInfo(path.stem, path, loaded.value.backend.kind, _summary(path)))
    return found


def missing_data(loaded: Loaded[RecipeConfig]) -> list[str]:
    """One line per local data file the recipe names that is not on this machine (``file:line: data.train:
    missing PATH; fetch it: COMMAND`` where the file's folder ships a fetch.py). ``loaded`` is loaded without
    the file check, so that the schema and the data are told apart."""
    data = loaded.value.data
    # a bucket's file is looked up by the data check
    named = [
        (("data", key), getattr(data, key))
        for key in ("train", "eval", "test")
        if not str(getattr(data, key)).startswith("gs://")
    ]
    named += [(("data", "corpus"), Path(text)) for text in data.corpus if not text.startswith("gs://")]
    lines = []
    for key, path in named:
        if path is None or path.exists():
            continue
        command = fetch_command(path)
        how = f"; fetch it: {command}" if command else "; the recipe's header says where it comes from"
        lines.append(loaded.problem(key, f"missing {path}{how}"))
    return lines


def check_data_present(loaded: Loaded[RecipeConfig]) -> None:
    """:class:`DataMissing` (exit 3) when :func:`missing_data` finds any."""
    lines = missing_data(loaded)
    if lines:
        raise DataMissing(
            f"{loaded.source}: the recipe is valid, but {len(lines)} data file(s) are not here:\n"
            + "\n".join(f"  {line}" for line in lines),
            lines,
            hint="Fetch them with the command shown, or check the rest without the data: "
            "tpuft recipes validate RECIPE --no-data-check",
        )


@dataclass
class DataRead:
    """One source of a recipe's data as ``validate`` found it: counted (a file read through here), or said
    to be read by the workers only (a Hugging Face dataset, streamed or downloaded there; a span-corruption
    corpus), so that nothing is reported as if it had been counted."""

    key: str
    """The recipe key: ``train``, ``eval``, ``test``, ``hf``, ``corpus``."""
    source: str
    examples: int | None = None
    """Counted here; None: not read here."""
    dropped: int = 0
    how: str = ""
    """For what is not read here: how the workers read it."""

    def words(self) -> str:
        if self.examples is None:
            return f"data.{self.key} {self.source}: {self.how}, not read or counted here"
        dropped = f" ({self.dropped:,} dropped by data.preprocess)" if self.dropped else ""
        return f"{self.examples:,} {self.key}{dropped}"

    def as_json(self) -> dict[str, object]:
        return {
            "key": self.key,
            "source": self.source,
            "examples": self.examples,
            "dropped": self.dropped,
            "counted": self.examples is not None,
            "how": self.how or "read through here",
        }


def data_read(recipe: RecipeConfig, checks: dict[str, FileCheck]) -> list[DataRead]:
    """What ``validate`` says of each data source: the files it read through (``checks``, by key) with their
    counts, then what only the workers read."""
    found = [DataRead(key, str(check.path), check.examples, check.dropped) for key, check in checks.items()]
    data = recipe.data
    if data.hf is not None:
        splits = [s for s in (data.hf.split, data.hf.eval_split, data.hf.test_split) if s]
        how = "streamed by the workers" if data.hf.streaming else "downloaded by the workers"
        name = f"{data.hf.path}{f' ({data.hf.name})' if data.hf.name else ''}"
        label = "split" if len(splits) == 1 else "splits"
        found.append(DataRead("hf", f"{name}, {label} {', '.join(splits)}", how=how))
    if data.corpus:
        files = f"{len(data.corpus)} file(s) or glob(s)" if len(data.corpus) > 1 else data.corpus[0]
        found.append(DataRead("corpus", files, how="read as a stream of documents by the workers"))
    return found


def recipe_file(name: str) -> Path:
    """What ``recipes show`` prints: a recipe file (a path, as every verb takes) or a shipped recipe's."""
    from tpuft.config.loader import resolve_recipe_path

    path = resolve_recipe_path(Path(name))
    return path if path.is_file() else find(name)


def find(name: str) -> Path:
    path = shipped_recipe(name)
    if path is None:
        shipped = shipped_recipes()
        if not shipped:
            raise no_shipped_recipes()
        known = ", ".join(r.stem for r in shipped)
        from tpuft.config import recipe_suggestion

        close = recipe_suggestion(name, local=False)
        raise UsageError(
            f"unknown recipe {name!r}{close or ';'} shipped recipes: {known}",
            hint="List them: tpuft recipes ls",
        )
    return path


@dataclass
class Copied:
    path: Path
    name: str
    """The copy's ``name:`` (its file's stem, what its runs' ids begin with), or the shipped one's when the
    stem is the same."""


_NAME_LINE = re.compile(
    r"^name:[ \t]*(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^#\n]*?)(?P<rest>[ \t]+#[^\n]*)?[ \t]*$", re.MULTILINE
)
"""The recipe's top-level ``name:`` line (a plain or quoted value, maybe a comment after it)."""


def renamed(text: str, name: str) -> str:
    """``text`` with its top-level ``name:`` set to ``name``, every other byte (comments, layout) kept."""
    return _NAME_LINE.sub(lambda m: f"name: {name}{m.group('rest') or ''}", text, count=1)


def name_for(path: Path) -> str:
    """A recipe name from a file's stem: the letters, digits, ``_``, ``.`` and ``-`` a recipe's name may
    have (any other character becomes ``-``), 64 at most."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip("_.-")[:64]


def copy(name: str, dest: Path, *, overwrite: bool = False) -> Copied:
    """The shipped recipe ``name`` copied to ``dest`` (a file, or a folder to put it in), its data paths made
    absolute and its ``name:`` the new file's stem: a plan or a run of ``mine.yaml`` says ``recipe mine``,
    not the shipped one's name."""
    source = find(name)
    if dest.exists() and not dest.is_dir() and not dest.is_file():
        raise UsageError(
            f"{dest} is not a file or a folder (a device or FIFO?); give a .yaml file name or a folder"
        )
    target = dest / source.name if dest.is_dir() else dest
    if target.suffix not in {".yaml", ".yml"}:
        target = target.with_suffix(".yaml")
    if target.exists() and not overwrite:
        raise UsageError(f"{target} exists; pass --overwrite to replace it")
    text = source.read_text(encoding="utf-8")
    # Data paths in shipped recipes are relative to recipes/; keep them pointing at the shipped data.
    loaded = load_recipe(source, check_files=False)
    data = loaded.value.data
    for key, value in (("train", data.train), ("eval", data.eval), ("test", data.test)):
        if value is None:
            continue
        relative = str(Path(loaded.raw["data"][key]))
        if not Path(relative).is_absolute():
            text = text.replace(f"{key}: {relative}", f"{key}: {value}", 1)
    new_name = name_for(target) or loaded.value.name
    if new_name != loaded.value.name:
        text = renamed(text, new_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    shutil.copymode(source, target)
    return Copied(target, load_recipe(target, check_files=False).value.name)


def summary(
    recipe: Path,
    overrides: list[str] | None = None,
    *,
    config: Path | None = None,
    accelerator: str | None = None,
) -> Summary:
    """The recipe's model, parameters and memory per device on the cluster's accelerator (``accelerator``
    instead: e.g. ``v4-64``); offline, nothing is created and the data is not read. A model the summary cannot
    size is a
    :class:`ConfigError` located at the recipe key to change (exit 2)."""
    from tpuft.core.accelerators import lookup
    from tpuft.model.recipe_model import ModelUnknown
    from tpuft.model.summary import summarize
    from tpuft.ops.preflight import load_files

    loaded, checked = load_files(recipe, overrides, config, check_files=False, against_cluster=False)
    cluster = checked.value
    chosen = lookup(accelerator) if accelerator is not None else lookup(cluster.accelerator)
    slices = cluster.gcp.slices if cluster.provider == "gcp" and accelerator is None else 1
    try:
        return summarize(loaded.value, chosen, slices=slices, recipe_dir=Path(loaded.source).resolve().parent)
    except ModelUnknown as exc:
        error = ConfigError([loaded.problem(exc.path, exc.message)], source=loaded.source)
        error.hint = exc.hint
        raise error from None


def compile_fit(
    recipe: Path,
    overrides: list[str] | None = None,
    *,
    config: Path | None = None,
    accelerator: str | None = None,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    notice: Callable[[str], None] | None = None,
) -> FitReport:
    """``show --summary --compile``: the recipe's real train step compiled for the accelerator (the cluster's,
    or ``accelerator``) on this machine's CPU, against the chip's HBM (:mod:`tpuft.ops.compile_fit`); a
    backend that cannot compile offline gets its paper estimate, labelled. A decisive paper estimate answers
    without a compile unless ``force`` (``--force-compile``); ``notice`` hears the compile's expected time
    and memory before it starts."""
    from tpuft.core.accelerators import lookup
    from tpuft.ops.compile_fit import fit_report
    from tpuft.ops.preflight import load_files

    loaded, checked = load_files(recipe, overrides, config, check_files=False, against_cluster=False)
    cluster = checked.value
    chosen = lookup(accelerator) if accelerator is not None else lookup(cluster.accelerator)
    return fit_report(
        loaded.value,
        chosen,
        python=cluster.local.python,
        recipe_dir=Path(loaded.source).resolve().parent,
        progress=progress,
        slices=cluster.slices if accelerator is None else 1,
        force=force,
        notice=notice,
        locate=loaded.problem,
        source=loaded.source,
    )
