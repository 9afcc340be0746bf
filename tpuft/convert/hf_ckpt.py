"""Checkpoints already in Hugging Face layout (safetensors + config.json) -> a Hugging Face model directory.

Read with NumPy from the safetensors files, never with torch. The PyTorch/XLA trainer saves each checkpoint
with ``save_pretrained`` (HF names, safetensors) beside its optimizer state, so the source is already in HF
names: plan its tensors (re-cast or re-sharded on the way), keep the config, the generation config and the
tokenizer files, and leave out optimizer and trainer state. The run's own end-of-training export and ``tpuft
convert`` both come through here and :mod:`tpuft.convert.hf_writer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tpuft.backends.torch_xla_schema import LAYOUT
from tpuft.convert.hf_writer import WEIGHTS, WEIGHTS_INDEX, ExportResult, write_hf_model
from tpuft.convert.model_source import ConvertError, ModelSource, SourceTensor, pick_step
from tpuft.convert.safetensors_io import SafetensorsReader

TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.json",
    "spiece.model",
)
_DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

CheckpointError = ConvertError
"""The path is not a complete checkpoint of a known layout (kept under its old name for callers)."""


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (
        (path / WEIGHTS).is_file() or (path / WEIGHTS_INDEX).is_file()
    )


def find_checkpoint(path: Path, step: int | None = None) -> Path:
    """Accept a checkpoint dir, a ``checkpoints/`` folder or a run dir; pick ``step`` or the latest."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if step is None and is_checkpoint(path):
        return path
    for folder in (path, path / LAYOUT.checkpoints):  # a checkpoints/ folder, or a run dir holding one
        found = LAYOUT.local_checkpoints(folder)
        if found:
            return pick_step(found, step, path)
    raise CheckpointError(
        f"{path}: not a checkpoint (expected config.json + {WEIGHTS} or {WEIGHTS_INDEX}, "
        f"or a folder with {LAYOUT.checkpoints}/step_N inside)"
    )


def _weight_files(ckpt: Path) -> list[Path]:
    if (ckpt / WEIGHTS).is_file():
        return [ckpt / WEIGHTS]
    index = json.loads((ckpt / WEIGHTS_INDEX).read_text())
    names = sorted(set(index.get("weight_map", {}).values()))
    missing = [n for n in names if not (ckpt / n).is_file()]
    if missing:
        raise CheckpointError(f"{ckpt}: shard(s) listed in {WEIGHTS_INDEX} are missing: {', '.join(missing)}")
    return [ckpt / n for n in names]


def open_hf_checkpoint(ckpt: Path) -> ModelSource:
    """Plan an export of a save_pretrained dir: tensors are read lazily from the memory-mapped safetensors."""
    if not is_checkpoint(ckpt):
        raise CheckpointError(f"{ckpt}: not a complete checkpoint (config.json and {WEIGHTS} expected)")
    try:
        config = json.loads((ckpt / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{ckpt / 'config.json'}: not JSON: {exc}") from None
    tensors = []
    for path in _weight_files(ckpt):
        reader = SafetensorsReader(path)  # stays open (mapped) until the process ends; one per shard
        for info in reader.tensors.values():
            if info.dtype not in _DTYPE_NAMES:
                raise CheckpointError(f"{path}: tensor {info.name}: unsupported dtype {info.dtype}")
            tensors.append(
                SourceTensor(
                    name=info.name,
                    shape=info.shape,
                    dtype=_DTYPE_NAMES[info.dtype],
                    load=lambda r=reader, n=info.name: r.get(n),  # BF16 as its uint16 bits: hf_writer knows
                    origin=f"{path.name}:{info.name}",
                )
            )
    generation = None
    if (ckpt / "generation_config.json").is_file():
        generation = json.loads((ckpt / "generation_config.json").read_text())
    files = {name: ckpt / name for name in TOKENIZER_FILES if (ckpt / name).is_file()}
    step = LAYOUT.step_of(ckpt.name)
    return ModelSource(
        kind="torch",
        path=ckpt,
        config=config,
        tensors=tensors,
        step=step,
        generation_config=generation,
        files=files,
    )


def export_checkpoint(
    ckpt: Path,
    out_dir: Path,
    *,
    dtype: str = "float32",
    overwrite: bool = True,
    max_shard_bytes: int | None = None,
) -> ExportResult:
    return write_hf_model(
        open_hf_checkpoint(ckpt), out_dir, dtype=dtype, overwrite=overwrite, max_shard_bytes=max_shard_bytes
    )
