"""What every checkpoint reader hands the writer: an HF config and a list of tensors under their HF names.

A reader (T5X, torch, Keras) never loads weights; it plans. Each :class:`SourceTensor` knows its final HF
name, shape and dtype, and how to load itself (read, slice, transpose) when the writer gets to it. That is
what keeps peak memory near the size of the largest tensor, and it lets the writer check every shape before
writing a byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class ConvertError(ValueError):
    """The checkpoint cannot be converted as asked; the message names the path and, where known, the
    parameter."""


@dataclass(frozen=True)
class SourceTensor:
    name: str
    """The Hugging Face (PyTorch) parameter name."""
    shape: tuple[int, ...]
    dtype: str
    """NumPy dtype name of what ``load`` returns ("float32", "bfloat16", "int64", ...)."""
    load: Callable[[], np.ndarray]
    origin: str
    """Where it comes from in the source checkpoint (a T5X param path, a TF weight name), for error
    messages."""


@dataclass
class ModelSource:
    kind: str
    """t5x-legacy, t5x-orbax, torch, keras-h5 or keras-safetensors."""
    path: Path
    config: dict
    """The HF config.json to write."""
    tensors: list[SourceTensor]
    step: int | None = None
    generation_config: dict | None = None
    files: dict[str, bytes | Path] = field(default_factory=dict)
    """Extra files for the output dir (tokenizer files): name -> bytes to write or a file to copy."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (a tokenizer that could not be found, a guessed activation)."""


def pick_step(found: list[tuple[int, T]], step: int | None, where: object, what: str = "checkpoint") -> T:
    """The latest of ``found`` (sorted (step, path) pairs), or the one for ``step``; an error lists the steps
    there."""
    if step is None:
        return found[-1][1]
    for number, candidate in found:
        if number == step:
            return candidate
    raise ConvertError(f"{where}: no {what} for step {step} (have: {', '.join(str(n) for n, _ in found)})")


def expect_shape(origin: str, shape: tuple[int, ...], expected: tuple[int, ...], what: str) -> None:
    if tuple(shape) != tuple(expected):
        raise ConvertError(
            f"{origin}: shape {tuple(shape)} does not match the config ({what}: expected {tuple(expected)})"
        )
