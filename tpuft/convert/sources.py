"""Tell what a checkpoint path holds and open the matching reader; the single entry point ``tpuft convert``
uses.

Accepted: a T5X model dir or one ``checkpoint_N`` in it (legacy or Orbax), a PyTorch/XLA run dir, its
``checkpoints/`` or one ``step_N`` (HF names already), and a transformers 4.x Keras/TF save_pretrained dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpuft.convert.hf_ckpt import TOKENIZER_FILES
from tpuft.convert.model_source import ConvertError, ModelSource


def open_source(
    path: Path, *, step: int | None = None, overrides: dict[str, Any] | None = None
) -> ModelSource:
    path = Path(os.path.abspath(path))  # readers such as tensorstore refuse `..` in a path
    if not path.exists():
        raise ConvertError(f"{path}: no such file or directory")
    from tpuft.convert.t5x_ckpt import find_t5x_checkpoint, open_t5x_checkpoint

    t5x = find_t5x_checkpoint(path, step)
    if t5x is not None:
        from tpuft.convert.t5x_to_hf import plan_t5x

        return plan_t5x(open_t5x_checkpoint(t5x), overrides)
    from tpuft.convert import keras_ckpt

    if keras_ckpt.is_keras_checkpoint(path):
        source = keras_ckpt.open_keras_source(path)
    else:
        from tpuft.convert.hf_ckpt import find_checkpoint, open_hf_checkpoint

        try:
            ckpt = find_checkpoint(path, step)
        except ConvertError as exc:
            raise ConvertError(
                f"{exc}\n(also not a T5X checkpoint: no checkpoint_N/ with a 'checkpoint' file or "
                "Orbax state/, and not a Keras/TF save_pretrained dir: no tf_model.h5)"
            ) from None
        source = open_hf_checkpoint(ckpt)
    if overrides:
        source.config.update(overrides)
    return source


def apply_tokenizer(source: ModelSource, tokenizer: Path) -> None:
    """``--tokenizer``: a SentencePiece model file, or a dir holding HF tokenizer files, replaces what was
    found."""
    if tokenizer.is_file():
        extra = 0
        if source.files.get("tokenizer_config.json") is not None:
            current = source.files["tokenizer_config.json"]
            data = json.loads(current.read_text() if isinstance(current, Path) else current)
            extra = int(data.get("extra_ids", 0) or 0)
        config = {
            "tokenizer_class": "T5Tokenizer",
            "extra_ids": extra,
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        }
        source.files = {
            "spiece.model": tokenizer,
            "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode(),
        }
    elif tokenizer.is_dir():
        found = {name: tokenizer / name for name in TOKENIZER_FILES if (tokenizer / name).is_file()}
        if not found:
            raise ConvertError(
                f"--tokenizer {tokenizer}: no tokenizer files in it (expected one of "
                f"{', '.join(TOKENIZER_FILES)})"
            )
        source.files = dict(found)
    else:
        raise ConvertError(f"--tokenizer {tokenizer}: no such file or directory")
    source.notes[:] = [n for n in source.notes if not n.startswith("tokenizer not written")]
