"""Pydantic's validation errors in the user's words: its error location turned into the key path the user
wrote (union and type tags dropped), its generic sentences into tpuft's ("must be >= 1 (got 0)", "unknown
key; did you mean 'steps'?", "required key is missing: <the field's description>"), and the several errors a
value that fits no member of a union gets merged into one sentence.

Apart from :mod:`tpuft.config.loader` because it is wording, not loading: it reads no file and applies no
override, and it changes whenever pydantic's error kinds or tpuft's phrasing do; the loader only prefixes each
sentence with where the key was written.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import BaseModel

from tpuft.core.config_types import KeyPath


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_models_in(arg))
    return out


def _walk_loc(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[KeyPath, type[BaseModel] | None]:
    """Turn pydantic's error location into the user's key path, dropping discriminated-union tags
    (("backend", "torch_xla", "x") -> ("backend", "x")) and type tags ("function-after[...]", "int"), and
    return the model owning the last key."""
    path: list[str | int] = []
    owner: type[BaseModel] | None = model
    parts = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    while parts:
        part = parts.pop(0)
        path.append(part)
        if not parts:
            break
        info = owner.model_fields.get(part) if owner is not None and isinstance(part, str) else None
        if info is None:
            owner = None
            continue
        candidates = _models_in(info.annotation)
        if info.discriminator is not None and parts and isinstance(parts[0], str):
            tag = parts.pop(0)
            candidates = [c for c in candidates if c.model_fields["kind"].default == tag]
        owner = candidates[0] if len(candidates) == 1 else None
    return tuple(path), owner


_TYPE_TAGS = {
    "int",
    "float",
    "str",
    "bool",
    "list",
    "dict",
    "none",
    "is-instance",
    "lax-or-strict",
    "json-or-python",
    "constrained-int",
    "constrained-float",
    "constrained-str",
}

_FRIENDLY = {
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_parsing_size": "expected a whole number of sensible size",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected text (quote it in YAML)",
    "dict_type": "expected a mapping of keys",
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
    "list_type": "expected a list",
    "path_type": "expected a file path",
    "none_required": "expected nothing (null)",
}


def _shown(value: Any) -> str:
    """A value as the user wrote it in YAML: null, true, 'text', 12."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _bound(ctx: dict[str, Any], name: str) -> str:
    value = ctx.get(name)
    return _shown(value) if not isinstance(value, float) or not value.is_integer() else f"{value:g}"


def _choices(text: str) -> list[str]:
    """pydantic's "'a', 'b' or 'c'" (or "False") as the words a user writes: a, b, c (false)."""
    words = [word.strip().strip("'") for word in re.split(r",| or ", text) if word.strip()]
    return [{"True": "true", "False": "false", "None": "null"}.get(word, word) for word in words]


_COMPARISONS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def _tpuft_words(kind: str, ctx: dict[str, Any], msg: str) -> str:
    """Pydantic's generic sentences ("Input should be greater than or equal to 1") in tpuft's: "must be >=
    1"."""
    if kind in _COMPARISONS:
        sign, name = _COMPARISONS[kind]
        return f"must be {sign} {_bound(ctx, name)}"
    if kind in {"too_short", "too_long"}:
        limit = ctx.get("min_length" if kind == "too_short" else "max_length")
        return (
            f"must have at {'least' if kind == 'too_short' else 'most'} {limit} item(s), got "
            f"{ctx.get('actual_length')}"
        )
    if kind in {"string_too_short", "string_too_long"}:
        limit = ctx.get("min_length" if kind == "string_too_short" else "max_length")
        return f"must be at {'least' if kind == 'string_too_short' else 'most'} {limit} character(s) long"
    if kind == "multiple_of":
        return f"must be a multiple of {_bound(ctx, 'multiple_of')}"
    if kind in {"literal_error", "enum"}:
        choices = _choices(str(ctx.get("expected", "")))
        return f"must be {choices[0]}" if len(choices) == 1 else f"must be one of {', '.join(choices)}"
    if kind == "string_pattern_mismatch":
        return f"must match the pattern {ctx.get('pattern')}"
    if msg.startswith(("Value error, ", "Assertion failed, ")):
        return msg.split(", ", 1)[1]
    if msg.startswith(
        "Input should be "
    ):  # the rest of pydantic's wording: "expected ..." as everywhere else
        return "expected " + msg[len("Input should be ") :]
    return msg


def describe_error(
    model: type[BaseModel], err: dict[str, Any], words: set[KeyPath] = frozenset()
) -> tuple[KeyPath, str]:
    """One pydantic error as (the user's key path, tpuft's sentence for it); ``words``: the key paths written
    as YAML 1.1 words (``no``, ``on``), by which a refused boolean is explained."""
    path, owner = _walk_loc(model, tuple(err["loc"]))
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    last = path[-1] if path else None
    if kind == "extra_forbidden":
        allowed = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(last), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return path, f"unknown key{hint} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        info = owner.model_fields.get(last) if owner is not None and isinstance(last, str) else None
        desc = info.description if info is not None and info.description else ""
        return path, "required key is missing" + (f": {desc}" if desc else "")
    if kind in {"union_tag_invalid", "union_tag_not_found"}:  # about the `kind:` line, not the section's
        tags = _choices(str(ctx.get("expected_tags", ""))) or _union_tags(owner, last)
        key = path + (str(ctx.get("discriminator", "kind")).strip("'"),)
        if kind == "union_tag_not_found":
            typo = difflib.get_close_matches(
                key[-1], [str(k) for k in got] if isinstance(got, dict) else [], n=1
            )
            if typo:
                return path + (typo[0],), f"unknown key; did you mean {key[-1]!r}? (one of {', '.join(tags)})"
            return key, f"required key is missing: one of {', '.join(tags)}"
        probe = ctx.get("tag", got.get("kind") if isinstance(got, dict) else got)
        close = difflib.get_close_matches(str(probe), tags, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return key, f"must be one of {', '.join(tags)}{hint} (got {_shown(probe)})"
    msg = _tpuft_words(kind, ctx, _FRIENDLY.get(kind) or err["msg"])
    if kind == "literal_error":
        close = difflib.get_close_matches(str(got), _choices(str(ctx.get("expected", ""))), n=1, cutoff=0.5)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    if kind in {"bool_type", "bool_parsing"} and path in words:
        return (
            path,
            f"expected true or false, got the text {got!r}: tpuft reads YAML 1.2, where only true and false "
            "are booleans",
        )
    info = owner.model_fields.get(last) if owner is not None and isinstance(last, str) else None
    if got is None and kind not in {"value_error", "assertion_error"}:
        optional = info is not None and not info.is_required()
        return path, f"{msg}, not null" + (" (leave the key out for its default)" if optional else "")
    if (
        info is not None
        and info.discriminator is not None
        and isinstance(got, str)
        and got in _union_tags(owner, last)
    ):
        return path, f"{msg}: write {last}: {{{info.discriminator}: {got}}} (got {_shown(got)})"
    if kind in _COMPARISONS:
        msg += f", got {_shown(got)}"
    elif not isinstance(got, (dict, list)) and kind not in {"value_error", "assertion_error"}:
        msg += f" (got {_shown(got)})"
    return path, msg


def _union_tags(owner: type[BaseModel] | None, key: Any) -> list[str]:
    info = owner.model_fields.get(key) if owner is not None and isinstance(key, str) else None
    models = _models_in(info.annotation) if info is not None else []
    return sorted(str(m.model_fields["kind"].default) for m in models if "kind" in m.model_fields)


def merged(problems: list[tuple[KeyPath, str]]) -> list[tuple[KeyPath, str]]:
    """One line per key: a value that fits no member of a union (a number, 'auto' or null) fails each member,
    and pydantic reports each; the user needs one sentence."""
    by_path: dict[KeyPath, list[str]] = {}
    for path, message in problems:
        by_path.setdefault(path, [])
        if message not in by_path[path]:
            by_path[path].append(message)
    out = []
    for path, messages in by_path.items():
        if len(messages) > 1:
            got = re.search(r"(?: \(got (.*)\)|, got (.*))$", messages[0])
            bare = [re.sub(r"(?: \(got .*\)|, got .*)$", "", m) for m in messages]
            rest = [re.sub(r"^(expected|must be) ", "", m) for m in bare[1:]]
            out.append(
                (
                    path,
                    ", or ".join([bare[0], *rest])
                    + (f" (got {got.group(1) or got.group(2)})" if got else ""),
                )
            )
        else:
            out += [(path, m) for m in messages]
    return out
