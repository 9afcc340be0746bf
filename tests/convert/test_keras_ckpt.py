"""transformers 4.x TF (Keras) T5 and BERT-likes -> Hugging Face PyTorch, without TensorFlow in the converter.

The slow tests build real checkpoints with ``TFT5ForConditionalGeneration.save_pretrained`` in a TF venv (h5
and safetensors, whole and sharded, v1.1-style untied and v1.0-style tied), and likewise
``TFBertForSequenceClassification``, ``TFBertModel`` and ``TFRobertaForSequenceClassification``; convert them
here with NumPy + h5py, and load the result with transformers 5 in the PyTorch/XLA venv: the outputs must
match TF's. The fast tests write TF-named files by hand to check the name mapping, the transposes and the
error messages.
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

# The TF checkpoints are written in the Keras backend's own venv (tpuft/backends/keras.py says why its pins).
TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}
"""transformers' TF code with Keras 3 installed: use tf-keras, and keep TF's C++ start-up chatter out of the
log."""

TINY = {
    "vocab_size": 64,
    "d_model": 16,
    "d_kv": 4,
    "d_ff": 32,
    "num_layers": 2,
    "num_decoder_layers": 1,
    "num_heads": 4,
}
VARIANTS = {
    "v1_1": {**TINY, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    "v1_0": {**TINY, "feed_forward_proj": "relu", "tie_word_embeddings": True},
}
INPUTS = {
    "input_ids": [[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]],
    "attention_mask": [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]],
    "decoder_input_ids": [[0, 5, 6, 7], [0, 9, 10, 11]],
}

LABELS = {
    "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
    "label2id": {"negative": 0, "neutral": 1, "positive": 2},
}
BERT = {
    "vocab_size": 100,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 24,
    "type_vocab_size": 2,
    **LABELS,
}
BERT_INPUTS = {
    "input_ids": [[2, 5, 6, 7, 3], [2, 9, 10, 3, 0]],
    "attention_mask": [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]],
    "token_type_ids": [[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]],
}
ROBERTA_INPUTS = {**BERT_INPUTS, "input_ids": [[0, 5, 6, 7, 2], [0, 9, 10, 2, 1]]}  # <s> 0, </s> 2, <pad> 1

# What the slow tests build: the PyTorch class (the TF one is TF + it), its config, its inputs and the output
# compared. BERT's initialiser draws weights too small (and LayerNorms, biases exactly 1 and 0) for a
# comparison to catch a swapped or untransposed square matrix, so those models get every weight redrawn with
# `redraw_std`.
MODELS: dict[str, dict] = {
    **{
        variant: {
            "class": "T5ForConditionalGeneration",
            "config_class": "T5Config",
            "config": config,
            "inputs": INPUTS,
            "output": "logits",
        }
        for variant, config in VARIANTS.items()
    },
    "bert": {
        "class": "BertForSequenceClassification",
        "config_class": "BertConfig",
        "config": BERT,
        "inputs": BERT_INPUTS,
        "output": "logits",
        "redraw_std": 0.3,
    },
    "bert-bare": {
        "class": "BertModel",
        "config_class": "BertConfig",
        "config": BERT,
        "inputs": BERT_INPUTS,
        "output": "pooler_output",
        "redraw_std": 0.3,
    },
    "roberta": {
        "class": "RobertaForSequenceClassification",
        "config_class": "RobertaConfig",
        "config": {**BERT, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2},
        "inputs": ROBERTA_INPUTS,
        "output": "logits",
        "redraw_std": 0.3,
    },
}
BERT_MODELS = [name for name, spec in MODELS.items() if spec["config_class"] != "T5Config"]
LAYOUTS = ("h5", "safetensors", "h5-sharded", "safetensors-sharded")

# Runs in the TF venv: a tiny random TF model per entry of MODELS, built by one call, saved every way
# save_pretrained can; its output on the entry's inputs goes beside it as <name>.npz (inputs + "expected").
MAKE_TF_MODELS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np, tensorflow as tf, transformers
    out, models = Path(sys.argv[1]), json.loads(sys.argv[2])
    names = {}
    for variant, spec in models.items():
        tf.random.set_seed(len(variant))
        config = getattr(transformers, spec["config_class"])(**spec["config"])
        model = getattr(transformers, "TF" + spec["class"])(config)
        feed = {k: tf.constant(np.array(v, np.int32)) for k, v in spec["inputs"].items()}
        model(**feed, training=False)  # builds the weights
        if spec.get("redraw_std"):
            for weight in model.weights:
                weight.assign(tf.random.normal(weight.shape, stddev=spec["redraw_std"]))
        expected = getattr(model(**feed, training=False), spec["output"]).numpy()
        np.savez(out / f"{variant}.npz", expected=expected, **{k: np.array(v) for k, v in spec["inputs"].items()})
        model.save_pretrained(out / f"{variant}-h5")
        model.save_pretrained(out / f"{variant}-safetensors", safe_serialization=True)
        model.save_pretrained(out / f"{variant}-h5-sharded", max_shard_size="2KB")
        model.save_pretrained(out / f"{variant}-safetensors-sharded", max_shard_size="2KB", safe_serialization=True)
        names[variant] = {w.name: list(w.shape) for w in model.weights}
    (out / "names.json").write_text(json.dumps(names, indent=1))
    print(json.dumps({"tensorflow": tf.__version__, "transformers": transformers.__version__}))
    """  # noqa: E501 (a script run in another interpreter)
)

# Runs in the torch venv (transformers 5): load each converted dir as the given class and compare its output
# (the attribute named) with TF's, on the inputs saved beside it.
CHECK_LOGITS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch, transformers
    out = {}
    for model_dir, reference, cls, output in json.loads(sys.argv[1]):
        ref = np.load(reference)
        model, info = getattr(transformers, cls).from_pretrained(model_dir, output_loading_info=True, dtype=torch.float32)
        feed = {k: torch.from_numpy(ref[k].astype(np.int64)) for k in ref.files if k != "expected"}
        with torch.no_grad():
            got = getattr(model.eval()(**feed), output).numpy()
        head = model.get_output_embeddings()
        out[model_dir] = {"diff": float(np.abs(got - ref["expected"]).max()), "scale": float(np.abs(ref["expected"]).max()),
                          "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                          "mismatched": [str(m) for m in info["mismatched_keys"]],
                          "tied": head is not None and head.weight is model.get_input_embeddings().weight,
                          "id2label": {str(k): v for k, v in model.config.id2label.items()}}
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="session")
def tf_models(keras_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tf-models")
    script = folder / "make_tf_models.py"
    script.write_text(MAKE_TF_MODELS)
    proc = subprocess.run(
        [keras_python, str(script), str(folder), json.dumps(MODELS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **TF_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return folder


def check_logits(python: str, jobs: list[tuple[Path, Path, dict]], tmp_path: Path) -> dict[str, dict]:
    """Each job: a converted dir, the TF reference (.npz), the MODELS entry it was built from."""
    script = tmp_path / "check_logits.py"
    script.write_text(CHECK_LOGITS)
    argv = [
        python,
        str(script),
        json.dumps([[str(m), str(r), spec["class"], spec["output"]] for m, r, spec in jobs]),
    ]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------
# slow: real TF checkpoints, logits in transformers 5


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tf_checkpoints_convert_to_the_same_logits(
    variant: str, tf_models: Path, torch_python: str, tmp_path: Path
) -> None:
    jobs, kinds = [], {}
    for layout in LAYOUTS:
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
        jobs.append((out, tf_models / f"{variant}.npz", MODELS[variant]))
    assert kinds == {
        "h5": "keras-h5",
        "safetensors": "keras-safetensors",
        "h5-sharded": "keras-h5",
        "safetensors-sharded": "keras-safetensors",
    }

    results = check_logits(torch_python, jobs, tmp_path)
    for out, _, _ in jobs:
        result = results[str(out)]
        assert result["missing"] == [] and result["unexpected"] == [] and result["mismatched"] == [], (
            out.name,
            result,
        )
        assert result["tied"] is VARIANTS[variant]["tie_word_embeddings"], (out.name, result)
        assert result["diff"] < 1e-4, (out.name, result)
    print({out.name: results[str(out)]["diff"] for out, _, _ in jobs})


@pytest.mark.slow
@pytest.mark.parametrize("variant", BERT_MODELS)
def test_tf_bert_checkpoints_convert_to_the_same_outputs(
    variant: str, tf_models: Path, torch_python: str, tmp_path: Path
) -> None:
    spec = MODELS[variant]
    classifier = spec["class"].endswith("ForSequenceClassification")
    jobs = []
    for layout in LAYOUTS:
        ckpt = tf_models / f"{variant}-{layout}"
        assert is_keras_checkpoint(ckpt), layout
        source = open_keras_source(ckpt)
        assert source.kind == ("keras-h5" if layout.startswith("h5") else "keras-safetensors")
        assert source.config["architectures"] == [spec["class"]]
        names = [t.name for t in source.tensors]
        # the bare BertModel has no bert. prefix
        scope = f"{source.config['model_type']}." if classifier else ""
        assert names[0] == f"{scope}embeddings.word_embeddings.weight"
        assert any(n.startswith("classifier.") for n in names) is classifier
        out = tmp_path / layout
        write_hf_model(source, out)
        if classifier:
            assert json.loads((out / "config.json").read_text())["id2label"] == LABELS["id2label"]
        jobs.append((out, tf_models / f"{variant}.npz", spec))

    results = check_logits(torch_python, jobs, tmp_path)
    for out, _, _ in jobs:
        result = results[str(out)]
        assert result["missing"] == [] and result["unexpected"] == [] and result["mismatched"] == [], (
            out.name,
            result,
        )
        # outputs big enough for the comparison to mean something
        assert result["scale"] > 0.1, (
            out.name,
            result,
        )
        assert result["diff"] < 1e-4, (out.name, result)
        if classifier:
            assert result["id2label"] == LABELS["id2label"], (out.name, result)
    print({out.name: (results[str(out)]["diff"], results[str(out)]["scale"]) for out, _, _ in jobs})


@pytest.mark.slow
def test_the_h5_file_itself_converts_like_its_dir(tf_models: Path) -> None:
    by_dir = open_keras_source(tf_models / "v1_1-h5")
    by_file = open_keras_source(tf_models / "v1_1-h5" / "tf_model.h5")
    assert by_file.path == by_dir.path
    assert [(t.name, t.shape) for t in by_file.tensors] == [(t.name, t.shape) for t in by_dir.tensors]
    for a, b in zip(by_dir.tensors, by_file.tensors, strict=True):
        np.testing.assert_array_equal(a.load(), b.load())


# ----------------------------------------------------------------------------------------------------------
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
                    shapes[f"{prefix}/{attention}/relative_attention_bias/embeddings:0"] = (
                        32,
                        config["num_heads"],
                    )
                shapes.update({f"{prefix}/{attention}/{p}/kernel:0": (d, inner) for p in "qkv"})
                shapes[f"{prefix}/{attention}/o/kernel:0"] = (inner, d)
                shapes[f"{prefix}/layer_norm/weight:0"] = (d,)
            prefix = f"{stack}/block_._{i}/layer_._{len(attentions)}"
            shapes.update(
                {
                    f"{prefix}/DenseReluDense/{w}/kernel:0": (d, ff)
                    for w in (("wi_0", "wi_1") if gated else ("wi",))
                }
            )
            shapes[f"{prefix}/DenseReluDense/wo/kernel:0"] = (ff, d)
            shapes[f"{prefix}/layer_norm/weight:0"] = (d,)
        shapes[f"{stack}/final_layer_norm/weight:0"] = (d,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head/kernel:0"] = (d, config["vocab_size"])
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if scope is None:
        return weights
    return {(f"shared/{n}" if n.startswith("shared/") else f"{scope}/{n}"): w for n, w in weights.items()}


def bert_tf_weights(
    config: dict,
    rng: np.random.Generator,
    *,
    model_type: str = "bert",
    head: bool = True,
    scope: str | None = None,
) -> dict[str, np.ndarray]:
    """What transformers' TF<Bert|Roberta>ForSequenceClassification (or, without ``head``, TF<...>Model)
    holds, under its TF names and layouts. Without ``scope`` the names are as in TF safetensors (model scope
    stripped)."""
    hidden, inner, labels = config["hidden_size"], config["intermediate_size"], len(config["id2label"])
    emb = f"{model_type}/embeddings"
    shapes: dict[str, tuple[int, ...]] = {
        f"{emb}/word_embeddings/weight:0": (config["vocab_size"], hidden),
        f"{emb}/token_type_embeddings/embeddings:0": (config["type_vocab_size"], hidden),
        f"{emb}/position_embeddings/embeddings:0": (config["max_position_embeddings"], hidden),
        f"{emb}/LayerNorm/gamma:0": (hidden,),
        f"{emb}/LayerNorm/beta:0": (hidden,),
    }

    def dense(name: str, inp: int, out: int) -> None:
        shapes.update({f"{name}/kernel:0": (inp, out), f"{name}/bias:0": (out,)})

    for i in range(config["num_hidden_layers"]):
        layer = f"{model_type}/encoder/layer_._{i}"
        for proj in ("query", "key", "value"):
            dense(f"{layer}/attention/self/{proj}", hidden, hidden)
        dense(f"{layer}/attention/output/dense", hidden, hidden)
        dense(f"{layer}/intermediate/dense", hidden, inner)
        dense(f"{layer}/output/dense", inner, hidden)
        for norm in (f"{layer}/attention/output/LayerNorm", f"{layer}/output/LayerNorm"):
            shapes.update({f"{norm}/gamma:0": (hidden,), f"{norm}/beta:0": (hidden,)})
    if not head or model_type == "bert":  # TFRobertaForSequenceClassification has no pooler
        dense(f"{model_type}/pooler/dense", hidden, hidden)
    if head and model_type == "bert":
        dense("classifier", hidden, labels)
    elif head:
        dense("classifier/dense", hidden, hidden)
        dense("classifier/out_proj", hidden, labels)
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    return weights if scope is None else {f"{scope}/{n}": w for n, w in weights.items()}


def write_tf_safetensors(
    ckpt: Path,
    config: dict,
    weights: dict[str, np.ndarray],
    *,
    model_type: str = "t5",
    architecture: str = "TFT5ForConditionalGeneration",
) -> Path:
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(
        json.dumps({"model_type": model_type, "architectures": [architecture], **config})
    )
    plan = [PlannedTensor(name, "F32", array.shape, lambda a=array: a) for name, array in weights.items()]
    write_streaming(ckpt / "model.safetensors", plan, {"format": "tf"})
    return ckpt


def write_keras_h5(
    ckpt: Path, config: dict, weights: dict[str, np.ndarray], *, model_type: str = "t5"
) -> Path:
    """Keras ``save_weights`` layout: one group per top-level layer listing its (scoped) weight names."""
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps({"model_type": model_type, **config}))
    layers: dict[str, list[str]] = {}
    for name in weights:
        layer = "shared" if name.startswith("shared/") else name.split("/")[1]
        layers.setdefault(layer, []).append(name)
    if "shared" in layers:  # Keras lists T5's shared embedding under both stacks
        layers["encoder"].insert(0, "shared/shared/embeddings:0")
    layers["dropout_7"] = []  # TFBertForSequenceClassification's dropout: a layer without weights
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
    np.testing.assert_array_equal(
        bias.load(),
        weights[f"{prefix}decoder/block_._0/layer_._0/SelfAttention/relative_attention_bias/embeddings:0"],
    )

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
    assert pt_name(
        "tft5_for_conditional_generation/decoder/block_._3/layer_._2/DenseReluDense/wo/kernel:0", scoped=True
    ) == ("decoder.block.3.layer.2.DenseReluDense.wo.weight", True)
    assert pt_name("encoder/final_layer_norm/weight:0", scoped=False) == (
        "encoder.final_layer_norm.weight",
        False,
    )
    assert pt_name("some_model/encoder/final_layer_norm/weight:0", scoped=False) == (
        "encoder.final_layer_norm.weight",
        False,
    )


def test_unknown_tf_weight_is_named(tmp_path: Path) -> None:
    weights = tf_weights(SMALL, np.random.default_rng(1))
    weights["encoder/block_._0/layer_._0/SelfAttention/adapter/kernel:0"] = np.zeros((16, 16), np.float32)
    ckpt = write_tf_safetensors(tmp_path / "ckpt", SMALL, weights)
    with pytest.raises(
        ConvertError,
        match=r"model\.safetensors: TF weight encoder/block_\._0/layer_\._0/SelfAttention/adapter/kernel:0",
    ):
        open_keras_source(ckpt)


def test_missing_and_misshapen_weights_are_named(tmp_path: Path) -> None:
    weights = tf_weights(SMALL, np.random.default_rng(2))
    del weights["decoder/block_._0/layer_._1/EncDecAttention/k/kernel:0"]
    with pytest.raises(
        ConvertError, match=r"lacks .*decoder\.block\.0\.layer\.1\.EncDecAttention\.k\.weight"
    ):
        open_keras_source(write_tf_safetensors(tmp_path / "a", SMALL, weights))

    weights = tf_weights(SMALL, np.random.default_rng(2))
    # not transposed
    weights["encoder/block_._0/layer_._1/DenseReluDense/wo/kernel:0"] = np.zeros((16, 32), np.float32)
    with pytest.raises(
        ConvertError,
        match=r"DenseReluDense/wo/kernel:0: shape \(32, 16\) does not match .*expected \(16, 32\)",
    ):
        open_keras_source(write_tf_safetensors(tmp_path / "b", SMALL, weights))

    tied = {**SMALL, "tie_word_embeddings": True}  # a config that says tied, with an lm_head in the file
    with pytest.raises(ConvertError, match=r"TF weight lm_head/kernel:0 \(-> lm_head\.weight\) has no place"):
        open_keras_source(
            write_tf_safetensors(tmp_path / "c", tied, tf_weights(SMALL, np.random.default_rng(3)))
        )


def test_what_counts_as_a_keras_checkpoint(tmp_path: Path) -> None:
    ckpt = write_tf_safetensors(tmp_path / "tf", SMALL, tf_weights(SMALL, np.random.default_rng(4)))
    assert is_keras_checkpoint(ckpt) and is_keras_checkpoint(ckpt / "model.safetensors")
    assert not is_keras_checkpoint(tmp_path / "nothing")

    both = tmp_path / "hub-repo"  # PyTorch safetensors beside a tf_model.h5: the PyTorch weights win
    both.mkdir()
    write_streaming(
        both / "model.safetensors",
        [PlannedTensor("shared.weight", "F32", (2, 2), lambda: np.zeros((2, 2), np.float32))],
        {"format": "pt"},
    )
    (both / "tf_model.h5").write_bytes(b"")
    (both / "config.json").write_text(json.dumps({"model_type": "t5", **SMALL}))
    assert not is_keras_checkpoint(both)
    assert not is_keras_checkpoint(both / "model.safetensors")

    with pytest.raises(ConvertError, match="not a TensorFlow safetensors file"):
        open_keras_source(both / "model.safetensors")


# ----------------------------------------------------------------------------------------------------------
# fast: hand-written BERT / RoBERTa files

TINY_BERT = {
    "vocab_size": 50,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 12,
    "max_position_embeddings": 20,
    "type_vocab_size": 2,
    **LABELS,
}


@pytest.mark.parametrize("fmt", ["safetensors", "h5"])
def test_bert_names_and_transposes(fmt: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    prefix = "tf_bert_for_sequence_classification/" if fmt == "h5" else ""
    weights = bert_tf_weights(TINY_BERT, rng, scope=prefix.rstrip("/") or None)
    if fmt == "h5":  # save_pretrained writes the PyTorch class name; a hand-made config may name none
        ckpt = write_keras_h5(tmp_path / "ckpt", TINY_BERT, weights, model_type="bert")
    else:
        ckpt = write_tf_safetensors(
            tmp_path / "ckpt",
            TINY_BERT,
            weights,
            model_type="bert",
            architecture="BertForSequenceClassification",
        )
    (ckpt / "vocab.txt").write_text("[PAD]\n")
    source = open_keras_source(ckpt)
    assert source.kind == f"keras-{fmt}" and "vocab.txt" in source.files
    assert source.config["architectures"] == ["BertForSequenceClassification"]
    by_name = {t.name: t for t in source.tensors}
    assert len(by_name) == len(weights) == 5 + 16 * 2 + 2 + 2
    # PyTorch's order, not the file's
    assert source.tensors[0].name == "bert.embeddings.word_embeddings.weight"

    def tf(name: str) -> np.ndarray:
        return weights[prefix + name]

    query = by_name["bert.encoder.layer.1.attention.self.query.weight"]
    assert query.shape == (8, 8) and query.origin.endswith(
        "bert/encoder/layer_._1/attention/self/query/kernel:0"
    )
    np.testing.assert_array_equal(query.load(), tf("bert/encoder/layer_._1/attention/self/query/kernel:0").T)
    intermediate = tf("bert/encoder/layer_._0/intermediate/dense/kernel:0")
    np.testing.assert_array_equal(
        by_name["bert.encoder.layer.0.intermediate.dense.weight"].load(), intermediate.T
    )
    assert by_name["bert.encoder.layer.0.output.dense.weight"].shape == (8, 12)
    np.testing.assert_array_equal(
        by_name["bert.embeddings.LayerNorm.weight"].load(), tf("bert/embeddings/LayerNorm/gamma:0")
    )
    np.testing.assert_array_equal(
        by_name["bert.encoder.layer.1.output.LayerNorm.bias"].load(),
        tf("bert/encoder/layer_._1/output/LayerNorm/beta:0"),
    )
    positions = tf("bert/embeddings/position_embeddings/embeddings:0")
    np.testing.assert_array_equal(by_name["bert.embeddings.position_embeddings.weight"].load(), positions)
    np.testing.assert_array_equal(
        by_name["bert.embeddings.word_embeddings.weight"].load(),
        tf("bert/embeddings/word_embeddings/weight:0"),
    )
    np.testing.assert_array_equal(
        by_name["bert.pooler.dense.weight"].load(), tf("bert/pooler/dense/kernel:0").T
    )
    classifier = by_name["classifier.weight"]
    assert classifier.shape == (3, 8)
    np.testing.assert_array_equal(classifier.load(), tf("classifier/kernel:0").T)
    np.testing.assert_array_equal(by_name["classifier.bias"].load(), tf("classifier/bias:0"))

    out = tmp_path / "hf"
    write_hf_model(source, out)
    config = json.loads((out / "config.json").read_text())
    assert (
        config["architectures"] == ["BertForSequenceClassification"]
        and config["id2label"] == LABELS["id2label"]
    )
    with SafetensorsReader(out / "model.safetensors") as reader:
        assert set(reader.tensors) == set(by_name)


def test_bare_bert_and_roberta_names(tmp_path: Path) -> None:
    weights = bert_tf_weights(TINY_BERT, np.random.default_rng(6), head=False)
    source = open_keras_source(
        write_tf_safetensors(
            tmp_path / "bare", TINY_BERT, weights, model_type="bert", architecture="BertModel"
        )
    )
    names = {t.name for t in source.tensors}
    assert source.config["architectures"] == ["BertModel"]
    assert "embeddings.word_embeddings.weight" in names and "pooler.dense.weight" in names
    assert not any(n.startswith(("bert.", "classifier.")) for n in names)

    weights = bert_tf_weights(
        TINY_BERT,
        np.random.default_rng(7),
        model_type="roberta",
        scope="tf_roberta_for_sequence_classification",
    )
    source = open_keras_source(write_keras_h5(tmp_path / "roberta", TINY_BERT, weights, model_type="roberta"))
    by_name = {t.name: t for t in source.tensors}
    assert source.config["architectures"] == ["RobertaForSequenceClassification"]
    assert len(by_name) == len(weights) and not any("pooler" in n for n in by_name)
    head = by_name["classifier.out_proj.weight"]
    assert head.shape == (3, 8)
    np.testing.assert_array_equal(
        head.load(), weights["tf_roberta_for_sequence_classification/classifier/out_proj/kernel:0"].T
    )


def test_pt_name_for_bert() -> None:
    bert = ("bert", "classifier")
    assert pt_name(
        "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/query/kernel:0",
        scoped=True,
        top_level=bert,
    ) == ("bert.encoder.layer.0.attention.self.query.weight", True)
    assert pt_name("bert/embeddings/LayerNorm/beta:0", scoped=False, top_level=bert) == (
        "bert.embeddings.LayerNorm.bias",
        False,
    )
    assert pt_name("bert/embeddings/token_type_embeddings/embeddings:0", scoped=False, top_level=bert) == (
        "bert.embeddings.token_type_embeddings.weight",
        False,
    )
    assert pt_name("bert/embeddings/word_embeddings/weight:0", scoped=False, top_level=bert) == (
        "bert.embeddings.word_embeddings.weight",
        False,
    )
    assert pt_name("classifier/kernel:0", scoped=False, top_level=bert) == ("classifier.weight", True)
    assert pt_name("tf_bert_for_sequence_classification/classifier/bias:0", scoped=True, top_level=bert) == (
        "classifier.bias",
        False,
    )


def test_misshapen_or_stray_bert_weights_are_named(tmp_path: Path) -> None:
    weights = bert_tf_weights(TINY_BERT, np.random.default_rng(8))
    weights["classifier/kernel:0"] = np.zeros((8, 4), np.float32)  # 4 labels; config.json says 3
    with pytest.raises(
        ConvertError,
        match=r"model\.safetensors:classifier/kernel:0: shape \(4, 8\) does not match the config "
        r"\(classifier\.weight: expected \(3, 8\)\)",
    ):
        open_keras_source(
            write_tf_safetensors(
                tmp_path / "a",
                TINY_BERT,
                weights,
                model_type="bert",
                architecture="BertForSequenceClassification",
            )
        )

    # a classifier's weights under a bare BertModel
    weights = bert_tf_weights(TINY_BERT, np.random.default_rng(8))
    with pytest.raises(
        ConvertError,
        match=r"model\.safetensors: TF weight classifier/kernel:0 \(-> classifier\.weight\) has no place in "
        r"BertModel",
    ):
        open_keras_source(
            write_tf_safetensors(
                tmp_path / "b", TINY_BERT, weights, model_type="bert", architecture="TFBertModel"
            )
        )

    expected = (
        r"architecture 'BertForMaskedLM' is not supported \(expected one of "
        r"BertForSequenceClassification, BertModel\)"
    )
    with pytest.raises(ConvertError, match=expected):
        open_keras_source(
            write_tf_safetensors(
                tmp_path / "c", TINY_BERT, weights, model_type="bert", architecture="BertForMaskedLM"
            )
        )

    with pytest.raises(
        ConvertError, match=r"model_type 'gpt2': only T5, mT5, BERT and RoBERTa TF checkpoints are supported"
    ):
        open_keras_source(
            write_tf_safetensors(
                tmp_path / "d", TINY_BERT, weights, model_type="gpt2", architecture="GPT2Model"
            )
        )
