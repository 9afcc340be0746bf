"""One file validated as far as it goes, so that every problem of it is found in one pass.

Pydantic stops at the schema: when any key is unknown or any value wrong, no model is built and the checks
that span several keys (each model's ``cross_problems``: ``local.workers`` on a gcp cluster, a capability the
backend lacks, a ``${VAR}`` that is not set) never run; the user fixes the first batch and meets the next.
Here, after the schema's problems are described, the keys they point at are left out of a copy of the file (an
unknown key is dropped, a wrong value falls back to its default) and the rest is validated again, a few rounds
at most, until a model is built from what is valid. Its checks then run and report too, except on the keys
that were left out (their own problem is already reported; a check that read the default in their place would
be about a value the user did not write). When no model can be built (a required key is missing), each section
of the file that validates on its own still gets its own checks, so a problem in one section never hides
another section's.

Only the first pass's schema problems and the checks' problems are reported: the later rounds' errors are the
consequences of leaving keys out. What is left out is recorded (:attr:`Validated.pruned`), so a check that
spans both files (a batch against the cluster's workers: :mod:`tpuft.ops.preflight`) can run on the model and
drop its findings about a key that was left out, the same way (:func:`affected`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, Generic, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError, create_model

from tpuft.config.wording import describe_error, merged
from tpuft.core.config_types import KeyPath, StrictModel

M = TypeVar("M", bound=BaseModel)

MAX_ROUNDS = 8
"""Rounds of leaving keys out before giving up on building a model (each leaves out one key at least)."""


@dataclass
class Validated(Generic[M]):
    """What validating one file found: every problem, each at its key path, and the model built from the valid
    parts (``None`` when none could be: a required key missing or wrong)."""

    value: M | None
    problems: list[tuple[KeyPath, str]] = field(default_factory=list)
    pruned: frozenset[KeyPath] = frozenset()
    """The keys written in the file that ``value`` was built without (dropped, or back to their default)."""


def affected(path: KeyPath, pruned: frozenset[KeyPath]) -> bool:
    """Whether a check's finding at ``path`` is about a key that was left out: the key itself or a key inside
    it. (A finding about the section that holds it is kept: ``gcp: provider gcp needs gcp.project`` is as
    true with ``gcp.valid_until`` left out.)"""
    return any(path[: len(key)] == key for key in pruned)


def reads_pruned(path: KeyPath, message: str, pruned: frozenset[KeyPath]) -> bool:
    """Whether a check's finding is about a left-out key: at it (:func:`affected`), or in the section that
    holds it and naming it (``backend.family: required: ... or gin_files`` with ``backend.gin_files`` left
    out read the default in place of the user's list: the user wrote one, only a wrong one)."""
    if affected(path, pruned):
        return True
    for key in pruned:
        section, name = key[:-1], str(key[-1])
        if path[: len(section)] == section and re.search(rf"\b{re.escape(name)}\b", message):
            return True
    return False


def validate(
    model: type[M], data: dict[str, Any], context: dict[str, Any], words: set[KeyPath] = frozenset()
) -> Validated[M]:
    """Every problem of ``data`` against ``model``: the schema's, then every model check on what is valid.
    ``words``: the key paths written as YAML 1.1 words (``no``, ``on``), which are explained where they
    fail and refused where the schema takes a boolean and text alike."""
    value, errors = _attempt(model, data, context, words)
    if value is not None:
        return Validated(value, _checks(value, words))
    value, pruned = _recover(model, model, data, context, words, errors)
    if value is not None:
        found = [
            (path, message)
            for path, message in _checks(value, words)
            if not reads_pruned(path, message, pruned)
        ]
    else:
        found = _section_checks(model, data, context, words)
    return Validated(value, errors + found, pruned)


def _attempt(
    model: type[M],
    data: dict[str, Any],
    context: dict[str, Any],
    words: set[KeyPath],
    described_by: type[BaseModel] | None = None,
) -> tuple[M | None, list[tuple[KeyPath, str]]]:
    try:
        return model.model_validate(data, context=context), []
    except ValidationError as exc:
        owner = described_by or model
        return None, merged([describe_error(owner, err, words) for err in exc.errors(include_url=False)])


def _recover(
    model: type[M],
    described_by: type[BaseModel],
    data: dict[str, Any],
    context: dict[str, Any],
    words: set[KeyPath],
    errors: list[tuple[KeyPath, str]],
) -> tuple[M | None, frozenset[KeyPath]]:
    """The model built from a copy of ``data`` without the keys the errors point at, round after round."""
    trimmed = copy.deepcopy(data)
    pruned: set[KeyPath] = set()
    for _ in range(MAX_ROUNDS):
        removed = {
            key
            for key in (
                _stand_in(model, trimmed, path, pruned) or _leave_out(trimmed, path) for path, _ in errors
            )
            if key is not None
        }
        if not removed:
            break
        pruned |= removed
        value, errors = _attempt(model, trimmed, context, words, described_by)
        if value is not None:
            return value, frozenset(pruned)
    return None, frozenset(pruned)


def _stand_in(
    model: type[BaseModel], data: dict[str, Any], path: KeyPath, pruned: set[KeyPath]
) -> KeyPath | None:
    """A required whole number that is missing from a section the file has (``train.steps``, misspelt
    ``stpes``) gets its least valid value in the copy, rather than the whole section leaving with it: the
    section's other keys are then checked against the workers too (``batch_size: 33``). The key counts as left
    out, so no check reports about the stand-in (:func:`reads_pruned`). Once per key; None when it does not
    apply."""
    if path in pruned or not path or not isinstance(path[-1], str):
        return None
    owner: Any = data
    for part in path[:-1]:
        owner = owner.get(part) if isinstance(owner, dict) else None
    if not isinstance(owner, dict) or path[-1] in owner:
        return None
    info = _field_at(model, path)
    if info is None or info.annotation is not int or not info.is_required():
        return None
    floor = 1
    for bound in info.metadata:
        floor = max(floor, int(getattr(bound, "ge", floor)), int(getattr(bound, "gt", floor - 1)) + 1)
    owner[path[-1]] = floor
    return path


def _field_at(model: type[BaseModel], path: KeyPath) -> Any:
    """The pydantic field at ``path`` through nested models (not through unions or containers), or None."""
    info: Any = None
    current: Any = model
    for part in path:
        if (
            not (isinstance(current, type) and issubclass(current, BaseModel))
            or part not in current.model_fields
        ):
            return None
        info = current.model_fields[part]
        current = info.annotation
    return info


def _leave_out(data: dict[str, Any], path: KeyPath) -> KeyPath | None:
    """Delete the deepest key of ``path`` that ``data`` has (for a missing key: the section that lacks it), up
    to the first list index (the whole list goes: indices would shift); the key path deleted, or None."""
    if any(isinstance(part, int) for part in path):
        path = path[: next(i for i, part in enumerate(path) if isinstance(part, int))]
    node: Any = data
    depth = 0
    while depth < len(path) and isinstance(node, dict) and path[depth] in node:
        if depth == len(path) - 1:
            del node[path[depth]]
            return path
        node = node[path[depth]]
        depth += 1
    if depth == 0:
        return None
    owner: Any = data
    for part in path[: depth - 1]:
        owner = owner[part]
    del owner[path[depth - 1]]
    return path[:depth]


def _checks(value: BaseModel, words: set[KeyPath]) -> list[tuple[KeyPath, str]]:
    own = value.cross_problems() if isinstance(value, StrictModel) else []
    return _yaml11_words(value, words) + own


def _section_checks(
    model: type[BaseModel], data: dict[str, Any], context: dict[str, Any], words: set[KeyPath]
) -> list[tuple[KeyPath, str]]:
    """No model of the whole file: each section (a key whose value is a model of its own) validated alone, as
    far as it goes, and its own checks run, so that one section's problem hides no other's. The schema
    problems of a section are the first pass's (already reported); only its checks are added here."""
    found: list[tuple[KeyPath, str]] = []
    for name, info in model.model_fields.items():
        section = data.get(name)
        if not isinstance(section, dict) or not _holds_models(info.annotation):
            continue
        alone = create_model(  # type: ignore[call-overload]
            f"{model.__name__}_{name}", __config__=model.model_config, **{name: (info.annotation, info)}
        )
        value, errors = _attempt(alone, {name: section}, context, words, model)
        pruned: frozenset[KeyPath] = frozenset()
        if value is None:
            value, pruned = _recover(alone, model, {name: section}, context, words, errors)
        if value is None:
            continue
        part = getattr(value, name)
        own = part.cross_problems() if isinstance(part, StrictModel) else []
        checks = [p for p in _yaml11_words(value, words) if p[0][:1] == (name,)]
        checks += [((name, *path), message) for path, message in own]
        found += [(path, message) for path, message in checks if not reads_pruned(path, message, pruned)]
    return found


def _holds_models(annotation: Any) -> bool:
    return any(isinstance(leaf, type) and issubclass(leaf, StrictModel) for leaf in _leaves(annotation))


def _yaml11_words(value: BaseModel, words: set[KeyPath]) -> list[tuple[KeyPath, str]]:
    """A plain ``no``/``yes``/``on``/``off`` where the schema takes text only is the text (what it says);
    where it takes booleans and text alike (a gin binding, an encoder's config), YAML 1.1 readers and the user
    may mean false and tpuft would pass the text on: refused, with the two ways to say it."""
    found = []
    for path in sorted(words, key=lambda p: tuple(map(str, p))):
        annotation = _annotation_at(value, path)
        if annotation is not _NOT_FOUND and _admits_bool(annotation):
            word = _value_at(value, path)
            meant = "true" if str(word).lower() in {"y", "yes", "on"} else "false"
            found.append(
                (
                    path,
                    f"{word!r} is ambiguous here (YAML 1.1 reads it as {meant}, YAML 1.2 and tpuft as "
                    f"text): write {meant} for the boolean, or quote it ('{word}') for the text",
                )
            )
    return found


_NOT_FOUND = object()


def _annotation_at(value: Any, path: KeyPath) -> Any:
    """The declared type of the value at ``path`` in a validated model (into dicts and lists by their item
    type)."""
    annotation: Any = _NOT_FOUND
    for part in path:
        if isinstance(value, BaseModel) and isinstance(part, str) and part in type(value).model_fields:
            annotation = type(value).model_fields[part].annotation
            value = getattr(value, part)
            continue
        if annotation is _NOT_FOUND:
            return _NOT_FOUND
        annotation = _item_type(annotation, part)
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            value = None
    return annotation


def _value_at(value: Any, path: KeyPath) -> Any:
    for part in path:
        value = getattr(value, str(part)) if isinstance(value, BaseModel) else value[part]
    return value


def _leaves(annotation: Any) -> list[Any]:
    if getattr(annotation, "__metadata__", None) is not None:  # Annotated[T, ...]
        return _leaves(annotation.__origin__)
    args = getattr(annotation, "__args__", None)
    if get_origin(annotation) in (Union, UnionType):
        return [leaf for arg in args for leaf in _leaves(arg)]
    return [annotation]


def _item_type(annotation: Any, part: str | int) -> Any:
    items = []
    for leaf in _leaves(annotation):
        origin, args = get_origin(leaf), get_args(leaf)
        if origin is dict and len(args) == 2 and isinstance(part, str):
            items.append(args[1])
        elif origin is list and args and isinstance(part, int):
            items.append(args[0])
        elif leaf is Any:
            items.append(Any)
    return Union[tuple(items)] if len(items) > 1 else (items[0] if items else _NOT_FOUND)  # noqa: UP007


def _admits_bool(annotation: Any) -> bool:
    return any(leaf is Any or leaf is bool for leaf in _leaves(annotation))
