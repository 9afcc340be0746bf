"""Write the recipe and cluster-file key references (docs/recipe-reference.md, docs/cluster-reference.md) from
the schema itself: every key's dotted path, type, default and its ``Field(description=...)``.

Why generated: a hand-kept key list drifts from the models the loader enforces; this one cannot, because
``tests/test_docs.py`` regenerates it and fails when the checked-in copy differs. Run it after changing a
field:

    .venv/bin/python docs/gen_reference.py           # rewrite both files
    .venv/bin/python docs/gen_reference.py --check   # exit 1 when a checked-in file is stale (what the test
    does)

Each backend's ``backend:`` section is its own table, found through the backend registry (or, failing that,
the recipe model's discriminated union), so a new backend shows up here without editing this script.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
import docgen  # docs/docgen.py, beside this script
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
RECIPE_REFERENCE = DOCS / "recipe-reference.md"
CLUSTER_REFERENCE = DOCS / "cluster-reference.md"
COMMAND = "python docs/gen_reference.py"


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    description: str


# ----------------------------------------------------------------------------------------------------------
# Types


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, m1, m2]`` -> (X, [m1, m2]), nested ones flattened."""
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        metadata += list(annotation.__metadata__)
        annotation = annotation.__origin__
    return annotation, metadata


def _union_members(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_duration(metadata: list[Any]) -> bool:
    """tpuft's Duration type: seconds, or text such as 90s / 10m / 1h30m (config_types.duration_seconds)."""
    return any(getattr(getattr(m, "func", None), "__name__", "") == "duration_seconds" for m in metadata)


_SCALARS = {str: "text", int: "integer", float: "number", bool: "boolean", Path: "path", type(None): "null"}


def type_text(annotation: Any) -> str:
    """A type as a recipe author reads it: ``integer``, ``one of a, b``, ``list of text``, ``text | null``."""
    annotation, metadata = _strip_annotated(annotation)
    if _is_duration(metadata):
        return "duration"
    members = _union_members(annotation)
    if members is not None:
        texts = [type_text(member) for member in members]
        return " | ".join(dict.fromkeys(texts))
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        values = [_value_text(value) for value in typing.get_args(annotation)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        key, value = typing.get_args(annotation) or (str, Any)
        return f"mapping of {type_text(key)} to {type_text(value)}"
    if _is_model(annotation):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(_value_text(member.value) for member in annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    """``1 ≤ x ≤ 1000`` style limits from the field's own constraints and its type's (``Count``,
    ``Duration``)."""
    annotation, type_metadata = _strip_annotated(field.annotation)
    for member in _union_members(annotation) or []:  # ``Dim | None``: the bounds of the Annotated member
        type_metadata += _strip_annotated(member)[1]
    items = [*field.metadata, *type_metadata]
    # Field() in Annotated
    items += [inner for item in items if isinstance(item, FieldInfo) for inner in item.metadata]
    low = high = None
    for item in items:
        if isinstance(item, annotated_types.Ge):
            low = f"≥ {_number(item.ge)}"
        elif isinstance(item, annotated_types.Gt):
            low = f"> {_number(item.gt)}"
        elif isinstance(item, annotated_types.Le):
            high = f"≤ {_number(item.le)}"
        elif isinstance(item, annotated_types.Lt):
            high = f"< {_number(item.lt)}"
    return ", ".join(part for part in (low, high) if part)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and abs(value) >= 100_000:
        return f"{value:,}"
    return repr(value)


# ----------------------------------------------------------------------------------------------------------
# Values


def _value_text(value: Any) -> str:
    """A value as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _value_text(value.value)
    if isinstance(value, (int, float)):
        return _number(value) if not isinstance(value, float) or not value.is_integer() else repr(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_value_text(k)}: {_value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    return _value_text(value)


# ----------------------------------------------------------------------------------------------------------
# Walking a model


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a key opens (``train:``, ``model.prompt_tuning:``), also when it may be null; None for a
    leaf."""
    annotation, _ = _strip_annotated(annotation)
    members = _union_members(annotation)
    if members is not None:
        models = [m for m in members if _is_model(_strip_annotated(m)[0])]
        others = [m for m in members if m is not type(None) and not _is_model(_strip_annotated(m)[0])]
        return _strip_annotated(models[0])[0] if len(models) == 1 and not others else None
    return annotation if _is_model(annotation) else None


def _description(name: str, field: FieldInfo, model: type[BaseModel] | None) -> str:
    text = field.description or ""
    if not text and name == "kind":
        text = "Selects this backend."
    if not text and model is not None and model.__doc__ and model.__module__.startswith("tpuft"):
        text = model.__doc__.strip().split("\n\n")[0]
    return " ".join(text.split())


def model_rows(model: type[BaseModel], prefix: str = "", skip: tuple[str, ...] = ()) -> list[Row]:
    """Every key under ``model``, depth first, sections before their keys."""
    rows: list[Row] = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        path = f"{prefix}{name}"
        section = _section_model(field.annotation)
        kind = "duration" if _is_duration(field.metadata) else type_text(field.annotation)
        bounds = _bounds(field)
        if bounds:
            kind = f"{kind} ({bounds})"
        rows.append(Row(path, kind, default_text(field), _description(name, field, section)))
        if section is not None:
            rows += model_rows(section, f"{path}.")
    return rows


# ----------------------------------------------------------------------------------------------------------
# Backends


def backend_models() -> list[type[BaseModel]]:
    """Each registered backend's recipe section. Asked of the registry; the recipe model's ``backend`` union
    is the fallback (the same models, read from the schema) should the registry's question change its name."""
    from tpuft.backends import registry

    for question in ("config_models", "section_models", "backend_sections"):
        ask = getattr(registry, question, None)
        if callable(ask):
            models = [m for m in ask() if _is_model(m)]
            if models:
                return sorted(models, key=_kind_of)
    from tpuft.config import RecipeConfig

    annotation, _ = _strip_annotated(RecipeConfig.model_fields["backend"].annotation)
    members = _union_members(annotation) or [annotation]
    return sorted(
        (_strip_annotated(m)[0] for m in members if _is_model(_strip_annotated(m)[0])), key=_kind_of
    )


def _kind_of(model: type[BaseModel]) -> str:
    field = model.model_fields.get("kind")
    if field is None:
        return model.__name__
    args = typing.get_args(_strip_annotated(field.annotation)[0])
    return str(args[0]) if args else str(field.default)


# ----------------------------------------------------------------------------------------------------------
# Markdown


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text else text


def table(rows: list[Row]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for row in rows:
        default = _code(row.default) if row.default not in ("required", "(its defaults)") else row.default
        lines.append(
            f"| {_code(row.path)} | {_cell(row.type)} | {_cell(default)} | {_cell(row.description)} |"
        )
    return lines


def _grouped(rows: list[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.path.split(".")[0], []).append(row)
    return groups


HEADER = (
    "<!-- Generated by `{command}` from the schema's field descriptions: do not edit by hand; "
    "tests/test_docs.py fails when this file is stale. -->"
)


def recipe_reference() -> str:
    from tpuft.config import RecipeConfig

    lines = [
        HEADER.format(command=COMMAND),
        "",
        "# Recipe key reference",
        "",
        "Every key a recipe (`recipes/NAME.yaml`) may hold: its dotted path (what `--set` takes), its "
        "type, its default and what it means. Unknown keys are refused at their line, with a did-you-mean. "
        "A key whose type is `section` opens a mapping of the keys below it; a `duration` is seconds, as a "
        "number or as `90s`, `10m`, `1h30m`. How to write a recipe: [recipes.md](recipes.md); what "
        "each backend does with these keys: [backends.md](backends.md).",
        "",
    ]
    rows = model_rows(RecipeConfig, skip=("backend",))
    top = [row for row in rows if "." not in row.path]
    lines += ["## Top level", "", *table([*top[:2], _backend_row(), *top[2:]]), ""]
    lines += capability_table()
    for section, group in _grouped(rows).items():
        if len(group) > 1:
            lines += [f"## `{section}`", "", *table(group[1:]), ""]
    for model in backend_models():
        kind = _kind_of(model)
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        lines += [f"## `backend` with `kind: {kind}`", ""]
        if doc:
            lines += [doc, ""]
        lines += [*table(model_rows(model, "backend.")), ""]
    return "\n".join(lines).rstrip() + "\n"


def capability_table() -> list[str]:
    """Which backend implements which optional shared key and eval metric, and why an engine cannot: the
    capability matrix of ``tpuft recipes backends`` (:mod:`tpuft.backends.matrix`, read from each backend's
    capabilities record in ``backends/<kind>_schema.py``); a key set to a non-default value is refused, with
    the same reason, by the backends without a mark."""
    from tpuft.backends.matrix import capability_matrix, markdown

    return [
        "## What each backend supports",
        "",
        "The optional shared keys and eval metrics, as each backend declares them in its capabilities "
        "record (`backends/<kind>_schema.py`); `tpuft recipes backends` prints the same matrix. A recipe "
        "that sets one of these keys to anything but its default, or asks for a metric, with a backend "
        "marked no is refused at its line, with the reason below and the backends that support it.",
        "",
        *markdown(capability_matrix()).rstrip().splitlines(),
        "",
    ]


def _backend_row() -> Row:
    kinds = ", ".join(_kind_of(model) for model in backend_models())
    return Row(
        "backend",
        "section",
        "required",
        f"The training backend: `kind` (one of {kinds}) and that backend's own keys, in the sections below.",
    )


def cluster_reference() -> str:
    from tpuft.config import ClusterConfig

    lines = [
        HEADER.format(command=COMMAND),
        "",
        "# Cluster file key reference",
        "",
        "Every key of the cluster file (`tpuft.yaml`: `--config/-c`, else `$TPUFT_CONFIG`, "
        "else `./tpuft.yaml`, else the built-in default): dotted path, type, default and meaning. Relative "
        "paths are from the file's own folder. A `duration` is seconds, as a number or as `90s`, `10m`, "
        "`1h30m`. The guide: [gcp.md](gcp.md).",
        "",
    ]
    rows = model_rows(ClusterConfig)
    top = [row for row in rows if "." not in row.path]
    lines += ["## Top level", "", *table(top), ""]
    for section, group in _grouped(rows).items():
        if len(group) > 1:
            lines += [f"## `{section}`", "", *table(group[1:]), ""]
    return "\n".join(lines).rstrip() + "\n"


def outputs() -> dict[Path, str]:
    """Each generated file and the text it must hold."""
    return {RECIPE_REFERENCE: recipe_reference(), CLUSTER_REFERENCE: cluster_reference()}


def stale() -> list[Path]:
    """The generated files whose checked-in text differs from what the sources give now."""
    return docgen.stale(outputs)


def main(argv: list[str] | None = None) -> int:
    return docgen.main(
        argv,
        description=(__doc__ or "").split("\n\n")[0],
        outputs=outputs,
        command=COMMAND,
        repo=REPO,
        wrote=lambda path, text: f"wrote {path.relative_to(REPO)} ({text.count(chr(10))} lines)",
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
