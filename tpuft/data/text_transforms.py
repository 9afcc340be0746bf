"""Named text transforms (``data.source_transforms`` / ``data.target_transforms``) and the ``data.preprocess``
hook.

The transforms are the one-liners the seeds' scripts wrote by hand; seed 003's task, restoring Romanian
diacritics, is ``source_field: target`` + ``source_transforms: [strip_diacritics]``: the input is the target
without its marks. The hook is for anything else: a function that gets each JSON record and returns the record
to use, or None to drop the example. Both run wherever examples are built (the controller's data check and
every worker), so a hook that fails is reported at the data line before anything is launched. Stdlib only:
this runs in every backend's venv.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any


def strip_diacritics(text: str) -> str:
    """Letters without their marks: NFD splits ``ș`` into ``s`` + combining comma below, which is dropped;
    Romanian's cedilla forms (ş ţ, common in older text) go the same way."""
    decomposed = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFC", "".join(c for c in decomposed if not unicodedata.combining(c)))


_SPACES = re.compile(r"\s+")

TRANSFORMS: dict[str, Callable[[str], str]] = {
    "strip_diacritics": strip_diacritics,
    "lowercase": str.lower,
    "nfc": lambda text: unicodedata.normalize("NFC", text),
    "nfkc": lambda text: unicodedata.normalize("NFKC", text),
    "collapse_whitespace": lambda text: _SPACES.sub(" ", text).strip(),
    "strip": str.strip,
}
"""Every name ``tpuft.config.TransformName`` allows (a test keeps the two lists equal)."""


def text_transform(names: list[str] | tuple[str, ...]) -> Callable[[str], str] | None:
    """The named transforms applied in order, or None for none (the example builder's hot path stays
    untouched)."""
    if not names:
        return None
    steps = [TRANSFORMS[name] for name in names]

    def apply(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return apply


class HookError(ValueError):
    """The ``data.preprocess`` hook cannot be loaded (a usage error, named by its spec)."""


def load_preprocess(spec: str) -> Callable[[dict[str, Any]], Any]:
    """``/abs/file.py:function`` (config resolves a relative file against the recipe) or
    ``package.module:function`` (importable in the worker's venv)."""
    target, _, name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise HookError(f"data.preprocess {spec!r}: file not found: {path}")
            module_spec = importlib.util.spec_from_file_location(f"tpuft_preprocess_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise HookError(f"data.preprocess {spec!r}: cannot load {path} as Python")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except HookError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import: say which and why
        raise HookError(
            f"data.preprocess {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}"
        ) from None
    function = getattr(module, name, None)
    if function is None:
        raise HookError(f"data.preprocess {spec!r}: {target} has no {name!r}")
    if not callable(function):
        raise HookError(f"data.preprocess {spec!r}: {name!r} is not a function")
    return function
