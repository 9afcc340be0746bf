"""PyTorch/XLA checkpoints -> Hugging Face model directory.

The torch_xla trainer saves each checkpoint with ``save_pretrained`` (HF names, safetensors) beside its optimizer
state, so exporting is: check it is complete, copy the weights (or stream-cast them to bfloat16), the config, the
generation config and the tokenizer files, and leave out optimizer and trainer state. The run's own end-of-training
export and ``tpuft convert`` both come through here.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tpuft import rundir
from tpuft.convert.safetensors_io import (
    PlannedTensor,
    SafetensorsReader,
    float32_to_bfloat16_bits,
    read_header,
    write_streaming,
)

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.json",
    "spiece.model",
)


class CheckpointError(ValueError):
    """The path is not a complete checkpoint of a known layout."""


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    checkpoint: Path
    tensors: int
    weight_bytes: int
    dtype: str


def is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and ((path / WEIGHTS).is_file() or (path / WEIGHTS_INDEX).is_file())


def find_checkpoint(path: Path, step: int | None = None) -> Path:
    """Accept a checkpoint dir, a ``checkpoints/`` folder or a run dir; pick ``step`` or the latest."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if step is None and is_checkpoint(path):
        return path
    for folder in (path, path / rundir.CHECKPOINTS_DIR):  # a checkpoints/ folder, or a run dir holding one
        found = rundir.list_step_dirs(folder)
        if not found:
            continue
        if step is None:
            return found[-1][1]
        for number, candidate in found:
            if number == step:
                return candidate
        raise CheckpointError(f"{path}: no checkpoint for step {step} (have: {', '.join(str(n) for n, _ in found)})")
    raise CheckpointError(
        f"{path}: not a checkpoint (expected config.json + {WEIGHTS} or {WEIGHTS_INDEX}, "
        f"or a folder with {rundir.CHECKPOINTS_DIR}/step_N inside)"
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


def export_checkpoint(ckpt: Path, out_dir: Path, *, dtype: str = "float32", overwrite: bool = True) -> ExportResult:
    if not is_checkpoint(ckpt):
        raise CheckpointError(f"{ckpt}: not a complete checkpoint (config.json and {WEIGHTS} expected)")
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise CheckpointError(f"{out_dir}: exists and is not empty (pass --overwrite to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tensors, size = _export_weights(ckpt, tmp, dtype)
        config = json.loads((ckpt / "config.json").read_text())
        if dtype == "bfloat16":
            config["torch_dtype"] = "bfloat16"
            config["dtype"] = "bfloat16"
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        if (ckpt / "generation_config.json").is_file():
            shutil.copyfile(ckpt / "generation_config.json", tmp / "generation_config.json")
        else:
            generation = {k: config[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id") if k in config}
            (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        for name in TOKENIZER_FILES:
            if (ckpt / name).is_file():
                shutil.copyfile(ckpt / name, tmp / name)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out_dir=out_dir, checkpoint=ckpt, tensors=tensors, weight_bytes=size, dtype=dtype)


def _export_weights(ckpt: Path, tmp: Path, dtype: str) -> tuple[int, int]:
    files = _weight_files(ckpt)
    if (ckpt / WEIGHTS_INDEX).is_file():
        shutil.copyfile(ckpt / WEIGHTS_INDEX, tmp / WEIGHTS_INDEX)
    tensors = 0
    total = 0
    for path in files:
        if dtype == "float32":
            shutil.copyfile(path, tmp / path.name)
            tensors += len(read_header(path)[0])
            total += path.stat().st_size
            continue
        with SafetensorsReader(path) as reader:
            plan = []
            for info in reader.tensors.values():
                if info.dtype == "F32":
                    plan.append(PlannedTensor(info.name, "BF16", info.shape, lambda n=info.name: float32_to_bfloat16_bits(reader.get(n))))
                else:
                    plan.append(PlannedTensor(info.name, info.dtype, info.shape, lambda n=info.name: reader.get(n)))
            total += write_streaming(tmp / path.name, plan, {**reader.metadata, "format": "pt"})
            tensors += len(plan)
    return tensors, total


def _replace_dir(new: Path, final: Path) -> None:
    """Put ``new`` at ``final`` so that ``final`` is never seen half-written."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, final)
