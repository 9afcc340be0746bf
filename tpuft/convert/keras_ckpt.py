"""transformers 4.x TensorFlow (Keras) checkpoints -> Hugging Face PyTorch names, with NumPy and h5py only.

Supported: T5 and mT5 (``TFT5ForConditionalGeneration``, ``TFT5Model``, ``TFT5EncoderModel``), and BERT and
RoBERTa encoders (``TFBertForSequenceClassification``, ``TFBertModel``,
``TFRobertaForSequenceClassification``, ``TFRobertaModel``): a classifier fine-tuned in Keras reaches PyTorch
the same way a T5 does.

``TFT5ForConditionalGeneration.save_pretrained(dir)`` writes ``tf_model.h5`` (Keras ``save_weights`` layout),
or with ``safe_serialization=True`` a ``model.safetensors`` whose header says ``"format": "tf"``; big models
come as shards beside a ``*.index.json``. transformers 4.x loaded those into PyTorch by building the TF model,
so it needed TensorFlow; transformers 5 removed TensorFlow altogether, so users of TF fine-tunes (or of the
Keras backend) have no way left to reach PyTorch there. This module does that step by itself.

What differs from the PyTorch checkpoint:

* Names. TF weights are Keras variable names: ``tft5_for_conditional_generation/encoder/block_._0/layer_._0/
  SelfAttention/q/kernel:0``. transformers' own ``convert_tf_weight_name_to_pt_weight_name`` turns them into
  PyTorch names (drop ``:0``, ``_._`` -> a level, drop the leading model scope, ``kernel``/``embeddings``/
  ``gamma`` -> ``weight``, ``beta`` -> ``bias``); this module follows the same rules. The safetensors form is
  already written without the model scope (transformers' ``strip_model_name_and_prefix``), as are h5 shards.
* The shared embedding lives under its own scope (``shared/shared/embeddings:0`` in h5,
  ``shared/embeddings:0`` in safetensors); it becomes ``shared.weight``. The encoder and decoder
  ``embed_tokens`` are tied to it in PyTorch and are not written. An untied (v1.1-style) ``lm_head/kernel``
  becomes ``lm_head.weight``.
* Dense kernels are stored (in, out); PyTorch's ``nn.Linear`` holds (out, in), so 2-D kernels are transposed.
* BERT/RoBERTa names need no more than those rules (``bert/encoder/layer_._0/attention/self/query/kernel:0``
  -> ``bert.encoder.layer.0.attention.self.query.weight``; ``LayerNorm/gamma`` -> ``LayerNorm.weight``). TF
  stores the encoder under ``bert/`` even in ``TFBertModel``, where PyTorch's ``BertModel`` has no prefix: it
  is dropped there.

Every name must map to a parameter of the PyTorch model the config names, with the shape the config implies;
anything else is a :class:`ConvertError` naming the file and the TF weight, never a silently dropped tensor.
Tensors are planned, not loaded: the h5 file (or the mapped safetensors) stays open and each ``load`` reads
one. Finding and reading the files is :mod:`tpuft.convert.keras_weights`; this module maps what they hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpuft.convert.hf_ckpt import TOKENIZER_FILES
from tpuft.convert.keras_weights import (
    H5_INDEX,
    H5_WEIGHTS,
    TfWeight,
    open_weights,
    read_json,
    safetensors_files,
    safetensors_format,
)
from tpuft.convert.model_source import (
    ConvertError,
    ModelSource,
    SourceTensor,
    expect_shape,
)

_TOP_LEVEL = ("shared", "encoder", "decoder", "lm_head")
"""The first level of every T5 weight once the model scope is gone."""
_BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "position_embedding_type": "absolute",
}
"""BertConfig's defaults (RobertaConfig's but for its vocab_size), for a hand-written config.json."""
_TOKENIZER_FILES = (*TOKENIZER_FILES, "vocab.txt", "vocab.json", "merges.txt")
"""T5's tokenizer files, and BERT's WordPiece vocab and RoBERTa's BPE vocab, which its slow tokenizers
need."""
_T5_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "feed_forward_proj": "relu",
}
"""T5Config's defaults, for a hand-written config.json that leaves some out."""
_TIED_DEFAULT = {"t5": True, "mt5": False}
"""``tie_word_embeddings`` when config.json has none: save_pretrained leaves it out when it equals
PretrainedConfig's default (True), as in every v1.0-style T5; MT5Config's own default is an untied lm_head."""
_HEADS = {
    "ForConditionalGeneration": ("encoder", "decoder", "lm_head"),
    "Model": ("encoder", "decoder"),
    "EncoderModel": ("encoder",),
}


@dataclass(frozen=True)
class _Family:
    """What differs between the model types converted here: the rest (reading, name rules, checks) is
    shared."""

    label: str
    """For messages: T5, BERT, RoBERTa."""
    classes: str
    """The PyTorch class prefix: T5 / MT5, Bert, Roberta."""
    top_level: tuple[str, ...]
    """The first level of every weight once the model scope is gone: tells a scope from the model's own first
    level."""
    defaults: dict[str, Any]
    heads: dict[str, tuple[str, ...]]
    """Architecture suffix -> the parts the PyTorch model has."""
    encoder_scope: str | None = None
    """BERT-likes: the encoder's scope in TF and in the PyTorch heads (``bert``), absent from the bare
    ``<X>Model``."""


_FAMILIES = {
    "t5": _Family("T5", "T5", _TOP_LEVEL, _T5_DEFAULTS, _HEADS),
    "mt5": _Family("T5", "MT5", _TOP_LEVEL, _T5_DEFAULTS, _HEADS),
    "bert": _Family(
        "BERT",
        "Bert",
        ("bert", "classifier"),
        _BERT_DEFAULTS,
        {"ForSequenceClassification": ("pooler", "classifier"), "Model": ("pooler",)},
        "bert",
    ),
    "roberta": _Family(
        "RoBERTa",
        "Roberta",
        ("roberta", "classifier"),
        {**_BERT_DEFAULTS, "vocab_size": 50265},
        {"ForSequenceClassification": ("classifier",), "Model": ("pooler",)},
        "roberta",
    ),
}
"""model_type -> its family. RobertaForSequenceClassification has no pooler (its head reads the <s> token
through its own dense layer), in TF as in PyTorch."""


def is_keras_checkpoint(path: Path) -> bool:
    """A transformers-TF save_pretrained dir (or its ``.h5`` / TF-format ``.safetensors`` file).

    A dir that also holds PyTorch-format ``model.safetensors`` is not one: hub repos often ship both, and the
    PyTorch weights are used as they are.
    """
    if path.is_file():
        return path.suffix == ".h5" or (path.suffix == ".safetensors" and safetensors_format(path) == "tf")
    if not path.is_dir():
        return False
    try:
        safe = safetensors_files(path)
    except ConvertError:  # a broken index: not for this predicate to report
        return False
    if safe:
        return safetensors_format(safe[0]) == "tf"
    return (path / H5_WEIGHTS).is_file() or (path / H5_INDEX).is_file()


def open_keras_source(path: Path) -> ModelSource:
    """Plan a transformers-TF T5 checkpoint as HF PyTorch tensors (read lazily, one at a time, when
    written)."""
    if not path.exists():
        raise ConvertError(f"{path}: no such file or directory")
    ckpt = path.parent if path.is_file() else path
    config = _read_config(ckpt)
    family = _FAMILIES[config["model_type"]]
    weights, kind = open_weights(path)
    architecture = _architecture(config, weights, ckpt)
    config["architectures"] = [architecture]
    if family.encoder_scope is None:
        expected = _expected_shapes(config, architecture, ckpt)
    else:
        expected = _bert_shapes(config, family, architecture, ckpt)
    tensors = _map_weights(weights, expected, architecture, ckpt, family)
    generation = None
    if (ckpt / "generation_config.json").is_file():
        generation = read_json(ckpt / "generation_config.json")
    files: dict[str, bytes | Path] = {
        name: ckpt / name for name in _TOKENIZER_FILES if (ckpt / name).is_file()
    }
    notes = [] if files else [f"tokenizer not written: no tokenizer files in {ckpt} (pass --tokenizer)"]
    return ModelSource(
        kind=kind,
        path=ckpt,
        config=config,
        tensors=tensors,
        generation_config=generation,
        files=files,
        notes=notes,
    )


# ----------------------------------------------------------------------------------------------------------
# Config and the names it implies


def _read_config(ckpt: Path) -> dict[str, Any]:
    if not (ckpt / "config.json").is_file():
        raise ConvertError(f"{ckpt}: no config.json beside the TF weights (save_pretrained writes one)")
    config = read_json(ckpt / "config.json")
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise ConvertError(
            f"{ckpt / 'config.json'}: model_type {model_type!r}: only T5, mT5, BERT and RoBERTa "
            f"TF checkpoints are supported (model_type {', '.join(map(repr, _FAMILIES))})"
        )
    return config


def _architecture(config: dict[str, Any], weights: list[TfWeight], ckpt: Path) -> str:
    """The PyTorch class: ``TF<X>`` -> ``<X>`` (save_pretrained already writes it without ``TF``); if the
    config names none, what the weights hold (a decoder or not; a classifier or not)."""
    family = _FAMILIES[config["model_type"]]
    named = config.get("architectures") or []
    if named:
        name = str(named[0])
        name = name.removeprefix("TF")
    elif family.encoder_scope is None:
        has_decoder = any("decoder/" in w.name for w in weights)
        name = f"{family.classes}ForConditionalGeneration" if has_decoder else f"{family.classes}EncoderModel"
    else:
        has_head = any(
            pt_name(w.name, scoped=w.scoped, top_level=family.top_level)[0].startswith("classifier.")
            for w in weights
        )
        name = f"{family.classes}ForSequenceClassification" if has_head else f"{family.classes}Model"
    if _head_of(name, family) is None:
        raise ConvertError(
            f"{ckpt / 'config.json'}: architecture {named[0] if named else name!r} is not supported "
            f"(expected one of {', '.join(family.classes.removeprefix('M') + h for h in family.heads)})"
        )
    return name


def _head_of(architecture: str, family: _Family) -> tuple[str, ...] | None:
    """The parts of ``architecture`` (None: not one of the family's); T5 and mT5 accept each other's class
    names."""
    prefix = "M?T5" if family.encoder_scope is None else family.classes
    match = re.fullmatch(prefix + "(" + "|".join(family.heads) + ")", architecture)
    return family.heads[match.group(1)] if match else None


def _get(config: dict[str, Any], key: str) -> Any:
    if key == "tie_word_embeddings" and key not in config:
        return _TIED_DEFAULT[config["model_type"]]
    return config.get(key, _T5_DEFAULTS.get(key))


def _expected_shapes(config: dict[str, Any], architecture: str, ckpt: Path) -> dict[str, tuple[int, ...]]:
    """Every parameter the PyTorch model loads, with its shape from the config (tied embed_tokens left
    out)."""
    try:
        d_model, d_ff, vocab = (
            int(_get(config, "d_model")),
            int(_get(config, "d_ff")),
            int(_get(config, "vocab_size")),
        )
        inner = int(_get(config, "num_heads")) * int(_get(config, "d_kv"))
        buckets, heads = int(_get(config, "relative_attention_num_buckets")), int(_get(config, "num_heads"))
        layers = {"encoder": int(_get(config, "num_layers"))}
        layers["decoder"] = int(config.get("num_decoder_layers") or layers["encoder"])
    except (TypeError, ValueError) as exc:
        raise ConvertError(f"{ckpt / 'config.json'}: bad T5 dimensions: {exc}") from None
    gated = str(_get(config, "feed_forward_proj")).startswith("gated-")
    parts = _head_of(architecture, _FAMILIES[config["model_type"]]) or ()
    shapes: dict[str, tuple[int, ...]] = {"shared.weight": (vocab, d_model)}
    for stack in ("encoder", "decoder"):
        if stack not in parts:
            continue
        attentions = ["SelfAttention"] if stack == "encoder" else ["SelfAttention", "EncDecAttention"]
        for i in range(layers[stack]):
            block = f"{stack}.block.{i}.layer"
            for j, attention in enumerate(attentions):
                for proj in ("q", "k", "v"):
                    shapes[f"{block}.{j}.{attention}.{proj}.weight"] = (inner, d_model)
                shapes[f"{block}.{j}.{attention}.o.weight"] = (d_model, inner)
                shapes[f"{block}.{j}.layer_norm.weight"] = (d_model,)
            ff = len(attentions)
            for wi in ("wi_0", "wi_1") if gated else ("wi",):
                shapes[f"{block}.{ff}.DenseReluDense.{wi}.weight"] = (d_ff, d_model)
            shapes[f"{block}.{ff}.DenseReluDense.wo.weight"] = (d_model, d_ff)
            shapes[f"{block}.{ff}.layer_norm.weight"] = (d_model,)
        shapes[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (buckets, heads)
        shapes[f"{stack}.final_layer_norm.weight"] = (d_model,)
    if "lm_head" in parts and not _get(config, "tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, d_model)
    return shapes


def _bert_shapes(
    config: dict[str, Any], family: _Family, architecture: str, ckpt: Path
) -> dict[str, tuple[int, ...]]:
    """Every parameter of the PyTorch BERT/RoBERTa model, in its order, with the shape the config implies.

    ``<X>Model`` is the bare encoder (no ``bert.`` prefix in PyTorch); the classifiers wrap it as
    ``bert``/``roberta``.
    """

    def get(key: str) -> Any:
        return config.get(key, family.defaults.get(key))

    try:
        hidden, inner, vocab = int(get("hidden_size")), int(get("intermediate_size")), int(get("vocab_size"))
        layers, positions, types = (
            int(get("num_hidden_layers")),
            int(get("max_position_embeddings")),
            int(get("type_vocab_size")),
        )
        labels = _num_labels(config)
    except (TypeError, ValueError) as exc:
        raise ConvertError(f"{ckpt / 'config.json'}: bad {family.label} dimensions: {exc}") from None
    if (
        get("position_embedding_type") != "absolute"
    ):  # TF BERT has only absolute ones; PyTorch would add new weights
        raise ConvertError(
            f"{ckpt / 'config.json'}: position_embedding_type {get('position_embedding_type')!r}: "
            "TF BERT models have only 'absolute' position embeddings"
        )
    parts = _head_of(architecture, family) or ()
    base = "" if _bare_scope(family, architecture) else f"{family.encoder_scope}."
    shapes: dict[str, tuple[int, ...]] = {
        f"{base}embeddings.word_embeddings.weight": (vocab, hidden),
        f"{base}embeddings.position_embeddings.weight": (positions, hidden),
        f"{base}embeddings.token_type_embeddings.weight": (types, hidden),
    }
    shapes.update(_dense_shapes(f"{base}embeddings.LayerNorm", hidden))
    for i in range(layers):
        layer = f"{base}encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            shapes.update(_dense_shapes(f"{layer}.attention.self.{proj}", hidden, hidden))
        shapes.update(_dense_shapes(f"{layer}.attention.output.dense", hidden, hidden))
        shapes.update(_dense_shapes(f"{layer}.attention.output.LayerNorm", hidden))
        shapes.update(_dense_shapes(f"{layer}.intermediate.dense", inner, hidden))
        shapes.update(_dense_shapes(f"{layer}.output.dense", hidden, inner))
        shapes.update(_dense_shapes(f"{layer}.output.LayerNorm", hidden))
    if "pooler" in parts:
        shapes.update(_dense_shapes(f"{base}pooler.dense", hidden, hidden))
    if "classifier" in parts and family.classes == "Roberta":  # dense + tanh + out_proj, on the <s> token
        shapes.update(_dense_shapes("classifier.dense", hidden, hidden))
        shapes.update(_dense_shapes("classifier.out_proj", labels, hidden))
    elif "classifier" in parts:  # one Linear on the pooled output
        shapes.update(_dense_shapes("classifier", labels, hidden))
    return shapes


def _bare_scope(family: _Family, architecture: str) -> str | None:
    """``bert.`` when ``architecture`` is the bare encoder (``BertModel``), whose PyTorch names lack the scope
    TF keeps."""
    if family.encoder_scope is None or architecture != f"{family.classes}Model":
        return None
    return f"{family.encoder_scope}."


def _dense_shapes(module: str, out: int, inp: int | None = None) -> dict[str, tuple[int, ...]]:
    """A Linear's (out, in) weight and its bias; without ``inp`` a LayerNorm's weight and bias."""
    return {f"{module}.weight": (out,) if inp is None else (out, inp), f"{module}.bias": (out,)}


def _num_labels(config: dict[str, Any]) -> int:
    """As PretrainedConfig decides it: id2label (what save_pretrained writes) wins over num_labels; 2 by
    default."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return int(config.get("num_labels", 2))


# ----------------------------------------------------------------------------------------------------------
# Name mapping


def pt_name(tf_name: str, *, scoped: bool, top_level: tuple[str, ...] = _TOP_LEVEL) -> tuple[str, bool]:
    """The PyTorch name of a TF weight, and whether the array is transposed (a dense kernel).

    transformers' ``convert_tf_weight_name_to_pt_weight_name`` rules, plus T5's shared embedding scope.
    ``scoped``: the name still starts with the model's scope (h5 written by Keras ``save_weights``).
    ``top_level``: the family's first levels (T5's by default), which an unscoped name starts with.
    """
    name = tf_name.replace(":0", "")
    # '$1___$2' -> '$2' (layers duplicated or removed in TF)
    name = re.sub(r"/[^/]*___([^/]*)/", r"/\1/", name)
    name = re.sub(r"//+", "/", name.replace("_._", "/"))  # '_._' -> a level (TF lists -> nn.ModuleList)
    parts = name.strip("/").split("/")
    if len(parts) > 1 and (scoped or parts[0] not in top_level):
        parts = parts[1:]  # the model scope: tft5_for_conditional_generation, or shared's own 'shared' scope
    while "shared" in top_level and len(parts) > 2 and parts[0] == "shared" and parts[1] == "shared":
        parts = parts[1:]  # shared/shared/weight (older TFSharedEmbeddings layout)
    leaf = parts[-1]
    transpose = leaf == "kernel"
    if leaf in ("kernel", "embeddings", "gamma"):
        parts[-1] = "weight"
    elif leaf == "beta":
        parts[-1] = "bias"
    return ".".join(parts), transpose


def _map_weights(
    weights: list[TfWeight],
    expected: dict[str, tuple[int, ...]],
    architecture: str,
    ckpt: Path,
    family: _Family,
) -> list[SourceTensor]:
    tensors: dict[str, SourceTensor] = {}
    bare = _bare_scope(family, architecture)
    for weight in weights:
        origin = f"{weight.file.name}:{weight.name}"
        name, transpose = pt_name(weight.name, scoped=weight.scoped, top_level=family.top_level)
        if bare is not None:
            # TFBertModel keeps its encoder under bert/; PyTorch's BertModel is it
            name = name.removeprefix(bare)
        if (
            name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
            and "shared.weight" in expected
        ):
            continue  # tied to shared in PyTorch (and not a separate variable in transformers' TF T5 either)
        if name not in expected:
            raise ConvertError(
                f"{weight.file}: TF weight {weight.name} (-> {name}) has no place in {architecture} "
                "(config.json)"
            )
        if name in tensors:
            raise ConvertError(
                f"{weight.file}: TF weight {weight.name} maps to {name}, as {tensors[name].origin} does"
            )
        if transpose and len(weight.shape) != 2:
            raise ConvertError(
                f"{weight.file}: TF weight {weight.name}: a {len(weight.shape)}-D kernel ({family.label} has "
                "only 2-D ones)"
            )
        shape = tuple(reversed(weight.shape)) if transpose else weight.shape
        expect_shape(origin, shape, expected[name], name)
        tensors[name] = SourceTensor(
            name=name, shape=shape, dtype=weight.dtype, load=_loader(weight, transpose), origin=origin
        )
    missing = [n for n in expected if n not in tensors]
    if missing:
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise ConvertError(
            f"{ckpt}: the TF checkpoint lacks weights the config implies: {', '.join(missing[:8])}{more}"
        )
    return [tensors[n] for n in expected]


def _loader(weight: TfWeight, transpose: bool) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        array = np.asarray(weight.read())
        return np.ascontiguousarray(array.T) if transpose else array

    return load
