"""Checkpoint -> HF dir without torch: streaming safetensors I/O, bfloat16 cast, atomic output, clear
errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tpuft.backends.torch_xla import LAYOUT
from tpuft.convert.hf_ckpt import CheckpointError, export_checkpoint, find_checkpoint
from tpuft.convert.safetensors_io import (
    PlannedTensor,
    SafetensorsReader,
    float32_to_bfloat16_bits,
    write_streaming,
)


def make_checkpoint(root: Path, step: int, tensors: dict[str, np.ndarray]) -> Path:
    ckpt = root / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    (ckpt / "config.json").write_text(
        json.dumps(
            {
                "model_type": "t5",
                "d_model": 4,
                "decoder_start_token_id": 0,
                "eos_token_id": 1,
                "pad_token_id": 0,
            }
        )
    )
    (ckpt / "tokenizer_config.json").write_text("{}")
    (ckpt / "optimizer.pt").write_bytes(b"not exported")
    LAYOUT.write_manifest(ckpt)  # as the trainer does: without it the checkpoint is incomplete
    return ckpt


def test_streaming_writer_round_trips_through_the_safetensors_library(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": np.arange(7, dtype=np.int64),
        "c": np.zeros((0, 2), np.float32),
    }
    plan = [
        PlannedTensor(k, {"float32": "F32", "int64": "I64"}[str(v.dtype)], v.shape, lambda v=v: v)
        for k, v in arrays.items()
    ]
    write_streaming(tmp_path / "x.safetensors", plan, {"format": "pt"})
    loaded = load_file(str(tmp_path / "x.safetensors"))
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value)
    with SafetensorsReader(tmp_path / "x.safetensors") as reader:
        np.testing.assert_array_equal(reader.get("a"), arrays["a"])
        assert reader.metadata == {"format": "pt"}


def test_bfloat16_rounding() -> None:
    values = np.array([1.0, -2.5, 3.14159265, 1e-3, 65504.0, np.inf], dtype=np.float32)
    bits = float32_to_bfloat16_bits(values)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(back[:-1], values[:-1], rtol=2**-8)
    assert back[0] == 1.0 and back[1] == -2.5 and np.isinf(back[-1])
    assert float32_to_bfloat16_bits(np.array([np.nan], np.float32))[0] == 0x7FC0


def test_export_latest_and_by_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    make_checkpoint(run, 10, {"w": np.ones((2, 2), np.float32)})
    latest = make_checkpoint(run, 20, {"w": np.full((2, 2), 2.0, np.float32)})
    assert find_checkpoint(run) == latest
    assert find_checkpoint(run / "checkpoints") == latest
    assert find_checkpoint(run, step=10).name == "step_00000010"
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 15 \(have: 10, 20\)"):
        find_checkpoint(run, step=15)

    out = tmp_path / "hf"
    result = export_checkpoint(latest, out)
    assert result.tensors == 1
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer_config.json",
    ]
    assert json.loads((out / "generation_config.json").read_text())["decoder_start_token_id"] == 0
    np.testing.assert_array_equal(load_file(str(out / "model.safetensors"))["w"], np.full((2, 2), 2.0))


def test_export_bfloat16(tmp_path: Path) -> None:
    ckpt = make_checkpoint(
        tmp_path, 1, {"w": np.array([[1.0, 3.0]], np.float32), "ids": np.array([1, 2], np.int64)}
    )
    export_checkpoint(ckpt, tmp_path / "hf", dtype="bfloat16")
    with SafetensorsReader(tmp_path / "hf" / "model.safetensors") as reader:
        assert reader.tensors["w"].dtype == "BF16" and reader.tensors["ids"].dtype == "I64"
        np.testing.assert_array_equal(
            reader.get("w"), float32_to_bfloat16_bits(np.array([[1.0, 3.0]], np.float32))
        )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_errors_leave_nothing_half_written(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        find_checkpoint(tmp_path)
    ckpt = make_checkpoint(tmp_path, 1, {"w": np.ones(2, np.float32)})
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_checkpoint(ckpt, out, overwrite=False)
    assert (out / "keep.txt").read_text() == "user data"
    (ckpt / "model.safetensors").write_bytes(b"\x01")  # truncated weights
    with pytest.raises(ValueError):
        export_checkpoint(ckpt, tmp_path / "hf2")
    assert not (tmp_path / "hf2").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".hf2")] == []


def test_cli_convert(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make_checkpoint(tmp_path / "run", 5, {"w": np.ones(3, np.float32)})
    result = cli("convert", str(tmp_path / "run"), str(tmp_path / "out"))
    assert result.code == 0, result.err
    assert (tmp_path / "out" / "model.safetensors").is_file()
    missing = cli("convert", str(tmp_path / "nope"), str(tmp_path / "out2"))
    assert missing.code == 2 and "no such file or directory" in missing.err
