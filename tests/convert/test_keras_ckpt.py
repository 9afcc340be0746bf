"""transformers 4.x TF (Keras) T5 -> Hugging Face PyTorch, without TensorFlow in the converter.

The slow tests build real checkpoints with ``TFT5ForConditionalGeneration.save_pretrained`` in a TF venv (h5 and
safetensors, whole and sharded, v1.1-style untied and v1.0-style tied), convert them here with NumPy + h5py, and
load the result with transformers 5 in the PyTorch/XLA venv: the logits must match TF's. The fast tests write
TF-named files by hand to check the name mapping, the transposes and the error messages.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from tpuft.convert.hf_writer import write_hf_model
from tpuft.convert.keras_ckpt import is_keras_checkpoint, open_keras_source, pt_name
from tpuft.convert.model_source import ConvertError
from tpuft.convert.safetensors_io import (
    PlannedTensor,
    SafetensorsReader,
    write_streaming,
)

# The Keras backend's stack (the backend itself is a later issue): TF with Keras 2 as tf-keras, since transformers'
# TF models do not run on Keras 3, and the last transformers line that still has TF models. tf-keras depends on
# the full `tensorflow` wheel, so that is what is pinned: adding `tensorflow-cpu` as well would install both.
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}
"""transformers' TF code with Keras 3 installed: use tf-keras, and keep TF's C++ start-up chatter out of the log."""

TINY = {"vocab_size": 64, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4}
VARIANTS = {
    "v1_1": {**TINY, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    "v1_0": {**TINY, "feed_forward_proj": "relu", "tie_word_embeddings": True},
}
INPUTS = {
    "input_ids": [[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]],
    "attention_mask": [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]],
    "decoder_input_ids": [[0, 5, 6, 7], [0, 9, 10, 11]],
}

# Runs in the TF venv: a tiny random TFT5 per variant, built by one call, saved every way save_pretrained can.
MAKE_TF_MODELS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, tensorflow as tf
    from transformers import T5Config, TFT5ForConditionalGeneration
    out, variants, inputs = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    feed = {k: tf.constant(np.array(v, np.int32)) for k, v in inputs.items()}
    names = {}
    for variant, config in variants.items():
        tf.random.set_seed(len(variant))
        model = TFT5ForConditionalGeneration(T5Config(**config))
        logits = model(**feed, training=False).logits.numpy()
        np.savez(out / f"{variant}.npz", logits=logits, **{k: np.array(v) for k, v in inputs.items()})
        model.save_pretrained(out / f"{variant}-h5")
        model.save_pretrained(out / f"{variant}-safetensors", safe_serialization=True)
        model.save_pretrained(out / f"{variant}-h5-sharded", max_shard_size="2KB")
        model.save_pretrained(out / f"{variant}-safetensors-sharded", max_shard_size="2KB", safe_serialization=True)
        names[variant] = {w.name: list(w.shape) for w in model.weights}
    (out / "names.json").write_text(json.dumps(names, indent=1))
    import transformers
    print(json.dumps({"tensorflow": tf.__version__, "transformers": transformers.__version__}))
    """
)

# Runs in the torch venv (transformers 5): load each converted dir and compare its logits with TF's.
CHECK_LOGITS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch, transformers
    out = {}
    for model_dir, reference in json.loads(sys.argv[1]):
        ref = np.load(reference)
        model, info = transformers.T5ForConditionalGeneration.from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
        feed = {k: torch.from_numpy(ref[k].astype(np.int64)) for k in ("input_ids", "attention_mask", "decoder_input_ids")}
        with torch.no_grad():
            logits = model.eval()(**feed).logits.numpy()
        out[model_dir] = {"diff": float(np.abs(logits - ref["logits"]).max()), "missing": sorted(info["missing_keys"]),
                          "unexpected": sorted(info["unexpected_keys"]), "mismatched": [str(m) for m in info["mismatched_keys"]],
                          "tied": model.lm_head.weight is model.shared.weight}
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="session")
def tf_models(keras_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tf-t5")
    script = folder / "make_tf_models.py"
    script.write_text(MAKE_TF_MODELS)
    proc = subprocess.run(
        [keras_python, str(script), str(folder), json.dumps(VARIANTS), json.dumps(INPUTS)],
        check=False, capture_output=True, text=True, timeout=900, env={**os.environ, **TF_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return folder


def check_logits(python: str, jobs: list[tuple[Path, Path]], tmp_path: Path) -> dict[str, dict]:
    script = tmp_path / "check_logits.py"
    script.write_text(CHECK_LOGITS)
    argv = [python, str(script), json.dumps([[str(m), str(r)] for m, r in jobs])]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------
# slow: real TF checkpoints, logits in transformers 5


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tf_checkpoints_convert_to_the_same_logits(variant: str, tf_models: Path, torch_python: str, tmp_path: Path) -> None:
    jobs, kinds = [], {}
    for layout in ("h5", "safetensors", "h5-sharded", "safetensors-sharded"):
        ckpt = tf_models / f"{variant}-{layout}"
        assert is_keras_checkpoint(ckpt), layout
        source = open_keras_source(ckpt)
        kinds[layout] = source.kind
        assert source.config["architectures"] == ["T5ForConditionalGeneration"]
        names = {t.name for t in source.tensors}
        assert ("lm_head.weight" in names) is (not VARIANTS[variant]["tie_word_embeddings"])
        assert not any("embed_tokens" in n for n in names)
        out = tmp_path / layout
        write_hf_model(source, out)
        jobs.append((out, tf_models / f"{variant}.npz"))
    assert kinds == {"h5": "keras-h5", "safetensors": "keras-safetensors", "h5-sharded": "keras-h5",
                     "safetensors-sharded": "keras-safetensors"}

    results = check_logits(torch_python, jobs, tmp_path)
    for out, _ in jobs:
        result = results[str(out)]
        assert result["missing"] == [] and result["unexpected"] == [] and result["mismatched"] == [], (out.name, result)
        assert result["tied"] is VARIANTS[variant]["tie_word_embeddings"], (out.name, result)
        assert result["diff"] < 1e-4, (out.name, result)
    print({out.name: results[str(out)]["diff"] for out, _ in jobs})


@pytest.mark.slow
def test_the_h5_file_itself_converts_like_its_dir(tf_models: Path) -> None:
    by_dir = open_keras_source(tf_models / "v1_1-h5")
    by_file = open_keras_source(tf_models / "v1_1-h5" / "tf_model.h5")
    assert by_file.path == by_dir.path
    assert [(t.name, t.shape) for t in by_file.tensors] == [(t.name, t.shape) for t in by_dir.tensors]
    for a, b in zip(by_dir.tensors, by_file.tensors, strict=True):
        np.testing.assert_array_equal(a.load(), b.load())


# ---------------------------------------------------------------------------------------------------------------
# fast: hand-written TF-named files


def tf_weights(config: dict, rng: np.random.Generator, *, scope: str | None = None) -> dict[str, np.ndarray]:
    """What transformers' TFT5ForConditionalGeneration holds for ``config``, under its TF names and TF layouts
    (kernels as (in, out)). Without ``scope`` the names are as in TF safetensors (model scope stripped)."""
    d, inner, ff = config["d_model"], config["num_heads"] * config["d_kv"], config["d_ff"]
    gated = config["feed_forward_proj"].startswith("gated-")
    shapes: dict[str, tuple[int, ...]] = {"shared/embeddings:0": (config["vocab_size"], d)}
    for stack, layers in (("encoder", config["num_layers"]), ("decoder", config["num_decoder_layers"])):
        attentions = ["SelfAttention"] if stack == "encoder" else ["SelfAttention", "EncDecAttention"]
        for i in range(layers):
            for j, attention in enumerate(attentions):
                prefix = f"{stack}/block_._{i}/layer_._{j}"
                if i == 0 and j == 0:
                    shapes[f"{prefix}/{attention}/relative_attention_bias/embeddings:0"] = (32, config["num_heads"])
                shapes.update({f"{prefix}/{attention}/{p}/kernel:0": (d, inner) for p in "qkv"})
                shapes[f"{prefix}/{attention}/o/kernel:0"] = (inner, d)
                shapes[f"{prefix}/layer_norm/weight:0"] = (d,)
            prefix = f"{stack}/block_._{i}/layer_._{len(attentions)}"
            shapes.update({f"{prefix}/DenseReluDense/{w}/kernel:0": (d, ff) for w in (("wi_0", "wi_1") if gated else ("wi",))})
            shapes[f"{prefix}/DenseReluDense/wo/kernel:0"] = (ff, d)
            shapes[f"{prefix}/layer_norm/weight:0"] = (d,)
        shapes[f"{stack}/final_layer_norm/weight:0"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head/kernel:0"] = (d, config["vocab_size"])
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if scope is None:
        return weights
    return {(f"shared/{n}" if n.startswith("shared/") else f"{scope}/{n}"): w for n, w in weights.items()}


def write_tf_safetensors(ckpt: Path, config: dict, weights: dict[str, np.ndarray]) -> Path:
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["TFT5ForConditionalGeneration"], **config}))
    plan = [PlannedTensor(name, "F32", array.shape, lambda a=array: a) for name, array in weights.items()]
    write_streaming(ckpt / "model.safetensors", plan, {"format": "tf"})
    return ckpt


def write_keras_h5(ckpt: Path, config: dict, weights: dict[str, np.ndarray]) -> Path:
    """Keras ``save_weights`` layout: one group per top-level layer listing its (scoped) weight names."""
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "t5", **config}))
    layers: dict[str, list[str]] = {}
    for name in weights:
        layer = "shared" if name.startswith("shared/") else name.split("/")[1]
        layers.setdefault(layer, []).append(name)
    layers["encoder"].insert(0, "shared/shared/embeddings:0")  # Keras lists the shared embedding under both stacks
    with h5py.File(ckpt / "tf_model.h5", "w") as handle:
        handle.attrs["layer_names"] = [n.encode() for n in layers]
        for layer, names in layers.items():
            group = handle.create_group(layer)
            group.attrs["weight_names"] = [n.encode() for n in names]
            for name in names:
                group.create_dataset(name, data=weights[name])
    return ckpt


SMALL = {**TINY, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}


@pytest.mark.parametrize("fmt", ["safetensors", "h5"])
def test_names_and_transposes(fmt: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    if fmt == "h5":
        weights = tf_weights(SMALL, rng, scope="tft5_for_conditional_generation")
        ckpt = write_keras_h5(tmp_path / "ckpt", SMALL, weights)
    else:
        weights = tf_weights(SMALL, rng)
        ckpt = write_tf_safetensors(tmp_path / "ckpt", SMALL, weights)
    (ckpt / "spiece.model").write_bytes(b"sp")
    source = open_keras_source(ckpt)
    assert source.kind == f"keras-{fmt}"
    assert source.files == {"spiece.model": ckpt / "spiece.model"} and source.notes == []
    assert source.config["architectures"] == ["T5ForConditionalGeneration"] and source.config["d_model"] == 16
    by_name = {t.name: t for t in source.tensors}
    assert len(by_name) == len(weights) == 38

    prefix = "tft5_for_conditional_generation/" if fmt == "h5" else ""
    q = weights[f"{prefix}encoder/block_._1/layer_._0/SelfAttention/q/kernel:0"]
    np.testing.assert_array_equal(by_name["encoder.block.1.layer.0.SelfAttention.q.weight"].load(), q.T)
    head = by_name["lm_head.weight"]
    assert head.shape == (64, 16) and head.origin.endswith("lm_head/kernel:0")
    np.testing.assert_array_equal(head.load(), weights[f"{prefix}lm_head/kernel:0"].T)
    shared = weights["shared/shared/embeddings:0" if fmt == "h5" else "shared/embeddings:0"]
    np.testing.assert_array_equal(by_name["shared.weight"].load(), shared)
    bias = by_name["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    np.testing.assert_array_equal(bias.load(), weights[f"{prefix}decoder/block_._0/layer_._0/SelfAttention/relative_attention_bias/embeddings:0"])

    out = tmp_path / "hf"
    write_hf_model(source, out)
    with SafetensorsReader(out / "model.safetensors") as reader:
        assert set(reader.tensors) == set(by_name)
        np.testing.assert_array_equal(reader.get("encoder.block.1.layer.0.SelfAttention.q.weight"), q.T)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["T5ForConditionalGeneration"]


def test_pt_name_follows_transformers_rules() -> None:
    assert pt_name("shared/shared/embeddings:0", scoped=True) == ("shared.weight", False)
    assert pt_name("shared/embeddings:0", scoped=False) == ("shared.weight", False)
    assert pt_name("tf_t5for_conditional_generation/shared/weight:0", scoped=True) == ("shared.weight", False)
    assert pt_name("shared/shared/weight:0", scoped=False) == ("shared.weight", False)
    assert pt_name("tft5_for_conditional_generation/decoder/block_._3/layer_._2/DenseReluDense/wo/kernel:0", scoped=True) == (
        "decoder.block.3.layer.2.DenseReluDense.wo.weight", True)
    assert pt_name("encoder/final_layer_norm/weight:0", scoped=False) == ("encoder.final_layer_norm.weight", False)
    assert pt_name("some_model/encoder/final_layer_norm/weight:0", scoped=False) == ("encoder.final_layer_norm.weight", False)


def test_unknown_tf_weight_is_named(tmp_path: Path) -> None:
    weights = tf_weights(SMALL, np.random.default_rng(1))
    weights["encoder/block_._0/layer_._0/SelfAttention/adapter/kernel:0"] = np.zeros((16, 16), np.float32)
    ckpt = write_tf_safetensors(tmp_path / "ckpt", SMALL, weights)
    with pytest.raises(ConvertError, match=r"model\.safetensors: TF weight encoder/block_\._0/layer_\._0/SelfAttention/adapter/kernel:0"):
        open_keras_source(ckpt)


def test_missing_and_misshapen_weights_are_named(tmp_path: Path) -> None:
    weights = tf_weights(SMALL, np.random.default_rng(2))
    del weights["decoder/block_._0/layer_._1/EncDecAttention/k/kernel:0"]
    with pytest.raises(ConvertError, match=r"lacks .*decoder\.block\.0\.layer\.1\.EncDecAttention\.k\.weight"):
        open_keras_source(write_tf_safetensors(tmp_path / "a", SMALL, weights))

    weights = tf_weights(SMALL, np.random.default_rng(2))
    weights["encoder/block_._0/layer_._1/DenseReluDense/wo/kernel:0"] = np.zeros((16, 32), np.float32)  # not transposed
    with pytest.raises(ConvertError, match=r"DenseReluDense/wo/kernel:0: shape \(32, 16\) does not match .*expected \(16, 32\)"):
        open_keras_source(write_tf_safetensors(tmp_path / "b", SMALL, weights))

    tied = {**SMALL, "tie_word_embeddings": True}  # a config that says tied, with an lm_head in the file
    with pytest.raises(ConvertError, match=r"TF weight lm_head/kernel:0 \(-> lm_head\.weight\) has no place"):
        open_keras_source(write_tf_safetensors(tmp_path / "c", tied, tf_weights(SMALL, np.random.default_rng(3))))


def test_what_counts_as_a_keras_checkpoint(tmp_path: Path) -> None:
    ckpt = write_tf_safetensors(tmp_path / "tf", SMALL, tf_weights(SMALL, np.random.default_rng(4)))
    assert is_keras_checkpoint(ckpt) and is_keras_checkpoint(ckpt / "model.safetensors")
    assert not is_keras_checkpoint(tmp_path / "nothing")

    both = tmp_path / "hub-repo"  # PyTorch safetensors beside a tf_model.h5: the PyTorch weights win
    both.mkdir()
    write_streaming(both / "model.safetensors", [PlannedTensor("shared.weight", "F32", (2, 2), lambda: np.zeros((2, 2), np.float32))], {"format": "pt"})
    (both / "tf_model.h5").write_bytes(b"")
    (both / "config.json").write_text(json.dumps({"model_type": "t5", **SMALL}))
    assert not is_keras_checkpoint(both)
    assert not is_keras_checkpoint(both / "model.safetensors")

    with pytest.raises(ConvertError, match="not a TensorFlow safetensors file"):
        open_keras_source(both / "model.safetensors")
