"""The FSDP sharding plan (tpuft/model/fsdp_plan.py): one dimension of each large matrix split over the mesh,
the rest whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuft.core.accelerators import lookup
from tpuft.model.fsdp_plan import AXIS, partition_spec, plan, sharded_dim
from tpuft.model.shapes import count, known_config, numel, t5_shapes

GiB = 2**30


@pytest.mark.parametrize(
    ("name", "shape", "mesh", "spec"),
    [
        ("encoder.block.0.layer.0.SelfAttention.q.weight", (16384, 1024), 32, (AXIS, None)),
        ("encoder.block.0.layer.0.SelfAttention.o.weight", (1024, 16384), 32, (None, AXIS)),  # the larger dim
        ("x.weight", (1024, 1024), 32, (AXIS, None)),  # a tie: dim 0
        ("x.weight", (96, 64), 32, (AXIS, None)),  # 96 divides, 64 divides: the larger
        ("x.weight", (100, 64), 32, (None, AXIS)),  # only 64 divides
        ("x.weight", (100, 30), 32, (None, None)),  # nothing divides: replicated
        ("x.weight", (16, 1024), 32, (None, AXIS)),  # 16 < 32 never divides evenly over 32
        ("encoder.final_layer_norm.weight", (1024,), 32, (None,)),  # vectors stay whole
        ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", (32, 128), 32, (None, None)),
        ("scalar", (), 8, ()),
        ("x.weight", (5, 7), 1, (None, AXIS)),  # one device: trivially "sharded" on the larger dim
        ("x.weight", (4, 6, 8), 2, (None, None, AXIS)),
    ],
)
def test_partition_spec(name: str, shape: tuple[int, ...], mesh: int, spec: tuple) -> None:
    assert partition_spec(name, shape, mesh) == spec


def test_partition_spec_takes_any_sequence_of_ints_and_refuses_an_empty_mesh() -> None:
    class Size(tuple):  # torch.Size is a tuple subclass
        pass

    assert partition_spec("w", Size((64, 32)), 8) == (AXIS, None)
    assert partition_spec("w", [64, 32], 8) == (AXIS, None)
    with pytest.raises(ValueError, match="mesh_size"):
        partition_spec("w", (8, 8), 0)


def test_t5_11b_on_a_v4_64() -> None:
    chips = lookup("v4-64").chips
    assert chips == 32  # v4 names count TensorCores: 64 cores = 32 chips, one device each
    shapes = t5_shapes(known_config("t5-11b"))
    layout = plan(shapes, chips)

    for name, p in layout.params.items():
        if len(p.shape) == 2 and "relative_attention_bias" not in name:
            assert p.sharded, name  # every matrix of t5-11b has a dimension that 32 divides
            assert numel(p.local_shape) * 32 == numel(p.shape)
        else:
            assert not p.sharded, name
    assert set(layout.replicated) == {
        n for n in shapes if "layer_norm" in n or "relative_attention_bias" in n
    }
    # block layer norms, final ones, two relative biases
    assert len(layout.replicated) == 24 * 2 + 24 * 3 + 2 + 2

    assert layout.specs["shared.weight"] == (AXIS, None)  # 32128 = 32 x 1004
    assert layout.specs["encoder.block.3.layer.1.DenseReluDense.wi.weight"] == (AXIS, None)  # (65536, 1024)
    assert layout.specs["encoder.block.3.layer.1.DenseReluDense.wo.weight"] == (None, AXIS)  # (1024, 65536)
    assert layout.params["decoder.block.5.layer.1.EncDecAttention.o.weight"].local_shape == (1024, 512)

    total = count(shapes) * 4
    assert layout.total_bytes == total
    replicated = layout.replicated_bytes
    assert replicated < 1 << 20  # half a MiB of layer norms and biases
    assert layout.bytes_per_chip == (total - replicated) // 32 + replicated
    assert layout.bytes_per_chip == pytest.approx(total / 32, rel=0.01)
    assert 1.3 * GiB < layout.bytes_per_chip < 1.35 * GiB  # 45.2 GB of float32 weights / 32

    dumped = json.loads(json.dumps(layout.to_json()))
    assert dumped["mesh_size"] == 32 and dumped["specs"]["shared.weight"] == ["fsdp", None]


def test_a_mesh_that_divides_nothing_replicates_and_says_so() -> None:
    shapes = t5_shapes(known_config("t5-small"))
    layout = plan(shapes, 3)  # 32128, 512, 2048, 64 x 8: none divisible by 3
    assert layout.sharded == [] and layout.bytes_per_chip == layout.total_bytes
    assert "shared.weight" in layout.replicated
    assert all(sharded_dim(spec) is None for spec in layout.specs.values())


T5_11B_RECIPE = """\
name: t5-11b-fsdp
backend:
  kind: torch_xla
model:
  name_or_path: t5-11b
  tokenizer: t5-11b
  gradient_checkpointing: true
data:
  train: train.jsonl
  max_source_length: 512
  max_target_length: 128
train:
  steps: 100
  batch_size: 128
  optimizer: adafactor
  precision: bf16
  sharding: fsdp
"""


def test_t5_11b_fits_a_v4_64_with_fsdp_and_not_data_parallel(tmp_path: Path) -> None:
    from tpuft.ops.recipes import summary

    recipe = tmp_path / "t5_11b.yaml"
    recipe.write_text(T5_11B_RECIPE)  # the data file need not exist: the summary reads no data

    fsdp = summary(recipe, accelerator="v4-64")
    assert (fsdp.devices, fsdp.device_word, fsdp.hbm_bytes) == (32, "chip", 32 * GiB)
    assert fsdp.examples_per_device == 4  # 128 / 32 chips / 1 micro-batch
    rows = {row.what: row.bytes for row in fsdp.memory}
    assert rows["weights"] == fsdp.plan.bytes_per_chip and rows["gradients"] == rows["weights"]
    assert rows["optimizer"] < 10 * 2**20  # factored, no first moment, sharded
    assert fsdp.fits and fsdp.margin_bytes > 8 * GiB

    data = summary(recipe, ["train.sharding=data"], accelerator="v4-64")
    assert {row.what: row.bytes for row in data.memory}["weights"] == count(
        t5_shapes(known_config("t5-11b"))
    ) * 4
    # 42 GiB of weights alone, and as much again of gradients
    assert not data.fits and data.margin_bytes < -40 * GiB

    adamw = summary(recipe, ["train.optimizer=adamw"], accelerator="v4-64")
    assert {row.what: row.bytes for row in adamw.memory}["optimizer"] == 2 * rows["weights"]
