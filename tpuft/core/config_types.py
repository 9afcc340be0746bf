"""The building blocks of tpuft's config models: a strict base model and the checked string types.

Shared by :mod:`tpuft.config` (the cluster file and the recipe) and by each backend's own recipe section
(``tpuft/backends/<kind>_schema.py``), which :mod:`tpuft.config` gathers from the registry; it stays outside
the ``tpuft/config/`` package so that a backend's section imports these without running the package that
imports it. Strict: YAML ``true`` is not 1, ``1.5`` is not an int, ``"10"`` is not a number; NaN and infinity
are refused. Pydantic and the stdlib only: the worker imports it too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo

from tpuft.core import formats

KeyPath = tuple[str | int, ...]

LaxPath = Annotated[Path, Strict(False)]
"""Paths come from YAML as text."""
Count = Annotated[int, Field(ge=1, le=1_000_000_000)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, strict=True, allow_inf_nan=False)

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        """Checks that span several keys, each located at the key to change (a model validator can only point
        at the whole section)."""
        return []


def check(problem: str | None) -> None:
    if problem:
        raise ValueError(problem)


def listed_once(value: list[str]) -> list[str]:
    """A list of choices where each may appear once (``model.freeze``, ``report.to``): the repeated ones
    named."""
    twice = sorted({item for item in value if value.count(item) > 1})
    check(f"{', '.join(twice)} listed twice" if twice else None)
    return value


def path_from_file(text: str, info: ValidationInfo) -> Path:
    """A path written in a config file: checked for shape, and relative to that file's folder (``base_dir``),
    so a file means the same wherever tpuft runs from."""
    check(formats.path_text_problem(text))
    path = Path(text).expanduser()
    base = (info.context or {}).get("base_dir")
    return Path(base) / path if not path.is_absolute() and base is not None else path


def shaped(problem: Callable[[str], str | None]) -> AfterValidator:
    """A string type checked by one of :mod:`tpuft.core.formats`' rules (a refusal becomes the key's
    error)."""

    def checked(value: str) -> str:
        check(problem(value))
        return value

    return AfterValidator(checked)


ProjectId = Annotated[str, shaped(formats.project_problem)]
Zone = Annotated[str, shaped(formats.zone_problem)]
RuntimeVersion = Annotated[str, shaped(formats.runtime_version_problem)]
Network = Annotated[str, shaped(formats.network_problem)]
ServiceAccount = Annotated[str, shaped(formats.service_account_problem)]
Reservation = Annotated[str, shaped(formats.reservation_problem)]
Image = Annotated[str, shaped(formats.image_problem)]
Endpoint = Annotated[str, shaped(formats.endpoint_problem)]
Scope = Annotated[str, shaped(formats.scope_problem)]
Command = Annotated[str, shaped(formats.command_problem)]
PathText = Annotated[str, shaped(formats.path_text_problem)]
UserName = Annotated[str, shaped(formats.user_name_problem)]


def pip_version_problem(text: str) -> str | None:
    """:func:`formats.version_problem`, then pip's own parser where it is installed (the controller): a
    version pip refuses would fail the venv build on every worker, after the cluster is up."""
    problem = formats.version_problem(text)
    if problem:
        return problem
    try:
        from packaging.version import InvalidVersion
        from packaging.version import Version as Parsed
    except ImportError:  # a worker venv without packaging: the controller has checked it already
        return None
    try:
        Parsed(text)
    except InvalidVersion:
        return f"{text!r} is not a version number like 2.9.0 (PEP 440)"
    return None


Version = Annotated[str, shaped(pip_version_problem)]
"""A release number pip can pin (``2.9.0``, ``2.9.0rc1``, ``2.9.0+cpu``), checked by PEP 440's rules."""
ModelRef = Annotated[str, shaped(formats.model_ref_problem)]
Requirement = Annotated[str, shaped(formats.requirement_problem)]
"""One pip requirement (PEP 508), never a pip option."""


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


def duration_seconds(value: object) -> object:
    """``600``, ``90s``, ``10m``, ``1h30m`` -> seconds (a float); anything else is left for the type check to
    refuse."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if not value.strip() or match is None or not any(match.groups()):
            raise ValueError(f"{value!r} is not a duration: write seconds (600) or e.g. 90s, 10m, 1h30m")
        hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
        return hours * 3600 + minutes * 60 + seconds
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


Duration = Annotated[float, BeforeValidator(duration_seconds), Field(ge=1.0, le=7 * 24 * 3600.0)]
"""Seconds, written as a number or as ``90s`` / ``10m`` / ``1h30m``; between 1 s and a week."""
TimeLimit = Annotated[float, BeforeValidator(duration_seconds), Field(ge=1.0, le=366 * 24 * 3600.0)]
"""A training budget, written as a :data:`Duration`: as long as a year (a timeout is a week at most)."""
