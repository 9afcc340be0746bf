"""T5X parameter trees -> Hugging Face T5 / UMT5 names, config and tensors.

The families T5X trains, told apart by what the checkpoint holds (no flags needed):

* T5 v1.0: ``mlp/wi`` (relu), no ``decoder/logits_dense``: logits go through the shared embedding, scaled by
  ``d_model**-0.5`` (HF does the same when ``tie_word_embeddings`` is true);
* T5 v1.1, flan-t5, mT5, ByT5: ``mlp/wi_0`` + ``mlp/wi_1`` (gated), their own ``decoder/logits_dense``
  (untied, not rescaled), any encoder/decoder depths;
* UMT5 and other "scalable" T5X models: a relative position bias in every layer (``layers_i/relpos_bias``),
  often with scanned layers: one stacked array per kind, the layer axis second
  (``encoder/encoder/mlp/wo/kernel`` is ``(mlp, layers, embed)``), attention kernels split into heads
  (``(embed, layers, heads, head_dim)``).

Sizes come from the arrays' shapes; what shapes cannot tell (the MLP activation, the vocabulary, dropout)
comes from the ``config.gin`` T5X wrote beside the checkpoints; the user's overrides win over both, and every
tensor's shape is then checked against the final config, so a wrong override is an error naming the parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpuft.convert.gin_config import GinConfig, parse_gin
from tpuft.convert.model_source import ConvertError, ModelSource, SourceTensor
from tpuft.convert.t5x_ckpt import T5xCheckpoint, T5xParam

RELATIVE_ATTENTION_MAX_DISTANCE = 128
"""Fixed in t5x/examples/t5/network.py (and the scalable_t5 network); not in any gin file."""
LAYER_NORM_EPSILON = 1e-6
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu", "gelu_new": "gelu"}
_LAYER = re.compile(r"^(encoder|decoder)/layers_(\d+)/")


@dataclass(frozen=True)
class _Piece:
    """One layer's slice of a T5X parameter: the whole array, or ``array[:, i]`` of a scanned stack."""

    param: T5xParam
    layer: int | None

    @property
    def origin(self) -> str:
        return self.param.path if self.layer is None else f"{self.param.path}[:, {self.layer}]"

    @property
    def shape(self) -> tuple[int, ...]:
        shape = self.param.shape
        return shape if self.layer is None else shape[:1] + shape[2:]

    def read(self) -> np.ndarray:
        return self.param.read(None if self.layer is None else (slice(None), self.layer))


class _Params:
    """The checkpoint's parameters, with a record of which were used, so that leftovers can be reported."""

    def __init__(self, ckpt: T5xCheckpoint) -> None:
        self.ckpt = ckpt
        self.all = ckpt.params
        self.used: set[str] = set()
        self.scanned = any(p.startswith(("encoder/encoder/", "decoder/decoder/")) for p in self.all)

    def has(self, path: str) -> bool:
        return path in self.all

    def take(self, path: str) -> T5xParam:
        if path not in self.all:
            raise ConvertError(f"{self.ckpt.path}: parameter {path} is missing from the checkpoint")
        self.used.add(path)
        return self.all[path]

    def layer_path(self, stack: str, name: str, i: int | None = None) -> str:
        return f"{stack}/{stack}/{name}" if self.scanned else f"{stack}/layers_{0 if i is None else i}/{name}"

    def has_layer(self, stack: str, name: str) -> bool:
        return self.has(self.layer_path(stack, name))

    def layer(self, stack: str, name: str, i: int) -> _Piece:
        param = self.take(self.layer_path(stack, name, i))
        return _Piece(param, i if self.scanned else None)

    def num_layers(self, stack: str) -> int:
        if self.scanned:
            norm = self.all.get(f"{stack}/{stack}/pre_mlp_layer_norm/scale")
            if norm is None or len(norm.shape) != 2:
                raise ConvertError(
                    f"{self.ckpt.path}: scanned {stack}: {stack}/{stack}/pre_mlp_layer_norm/scale (embed, "
                    "layers) is missing"
                )
            return norm.shape[1]
        indices = {int(m.group(2)) for p in self.all for m in [_LAYER.match(p)] if m and m.group(1) == stack}
        if not indices:
            return 0
        missing = sorted(set(range(max(indices) + 1)) - indices)
        if missing:
            raise ConvertError(
                f"{self.ckpt.path}: {stack} layers {missing} are missing (have up to layers_{max(indices)})"
            )
        return max(indices) + 1


def plan_t5x(ckpt: T5xCheckpoint, overrides: dict[str, Any] | None = None) -> ModelSource:
    params = _Params(ckpt)
    gin_path = ckpt.gin_file()
    gin = parse_gin(gin_path) if gin_path else None
    notes: list[str] = []
    config = _derive_config(params, gin, notes)
    config.update(overrides or {})
    _check_config(config, ckpt.path)
    tensors = _map_tensors(params, config)
    leftovers = sorted(set(params.all) - params.used)
    if leftovers:
        shown = ", ".join(leftovers[:6]) + (f" and {len(leftovers) - 6} more" if len(leftovers) > 6 else "")
        raise ConvertError(
            f"{ckpt.path}: unknown layout: parameter(s) with no Hugging Face T5 counterpart: {shown}"
        )
    files, tokenizer_notes = _tokenizer_files(gin, config)
    notes.extend(tokenizer_notes)
    if gin is None:
        notes.append(
            f"no config.gin beside {ckpt.path}: activation and vocabulary were guessed from the shapes"
        )
    return ModelSource(
        kind=ckpt.kind,
        path=ckpt.path,
        config=config,
        tensors=tensors,
        step=ckpt.step,
        files=files,
        notes=notes,
    )


# ----------------------------------------------------------------------------------------------------------
# config


def _derive_config(params: _Params, gin: GinConfig | None, notes: list[str]) -> dict[str, Any]:
    embedding = params.all.get("token_embedder/embedding")
    if embedding is None or len(embedding.shape) != 2:
        raise ConvertError(
            f"{params.ckpt.path}: parameter token_embedder/embedding (vocab, embed) is missing: not a T5X T5 "
            "checkpoint"
        )
    vocab, d_model = embedding.shape
    num_layers = params.num_layers("encoder")
    num_decoder_layers = params.num_layers("decoder")
    if num_layers == 0 or num_decoder_layers == 0:
        raise ConvertError(
            f"{params.ckpt.path}: unknown layout: no encoder or no decoder layers (encoder-decoder T5 "
            "expected)"
        )
    per_layer_bias = params.has_layer("encoder", "relpos_bias/rel_embedding")
    bias = params.all.get(
        params.layer_path("encoder", "relpos_bias/rel_embedding")
        if per_layer_bias
        else "encoder/relpos_bias/rel_embedding"
    )
    if bias is None:
        raise ConvertError(f"{params.ckpt.path}: parameter encoder/relpos_bias/rel_embedding is missing")
    num_heads, buckets = bias.shape[0], bias.shape[-1]
    query = params.all.get(params.layer_path("encoder", "attention/query/kernel"))
    if query is None:
        raise ConvertError(
            f"{params.ckpt.path}: parameter {params.layer_path('encoder', 'attention/query/kernel')} is "
            "missing"
        )
    query_shape = _Piece(query, 0 if params.scanned else None).shape
    inner = int(np.prod(query_shape[1:]))
    if inner % num_heads:
        raise ConvertError(f"{query.path}: {inner} query features do not split into {num_heads} heads")
    wo = params.all.get(params.layer_path("encoder", "mlp/wo/kernel"))
    if wo is None:
        raise ConvertError(
            f"{params.ckpt.path}: parameter {params.layer_path('encoder', 'mlp/wo/kernel')} is missing"
        )
    gated = params.has_layer("encoder", "mlp/wi_0/kernel")
    activation = _activation(gin, gated, notes)
    tied = not params.has("decoder/logits_dense/kernel")
    umt5 = per_layer_bias
    dropout = gin.get("network.T5Config.dropout_rate") if gin else None
    config: dict[str, Any] = {
        "architectures": ["UMT5ForConditionalGeneration" if umt5 else "T5ForConditionalGeneration"],
        "model_type": "umt5" if umt5 else "t5",
        "vocab_size": vocab,
        "d_model": d_model,
        "d_kv": inner // num_heads,
        "d_ff": wo.shape[0],
        "num_layers": num_layers,
        "num_decoder_layers": num_decoder_layers,
        "num_heads": num_heads,
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": RELATIVE_ATTENTION_MAX_DISTANCE,
        "feed_forward_proj": f"gated-{activation}"
        if gated
        else activation,  # is_gated_act, dense_act_fn: _check_config
        "tie_word_embeddings": tied,
        "dropout_rate": float(dropout) if isinstance(dropout, (int, float)) else 0.1,
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "initializer_factor": 1.0,
        "is_encoder_decoder": True,
        "use_cache": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }
    if umt5:
        config["scalable_attention"] = True  # the name HF's own UMT5 converter gives this layout
    return config


def _activation(gin: GinConfig | None, gated: bool, notes: list[str]) -> str:
    default = "gelu" if gated else "relu"
    if gin is None:
        return default
    activations = gin.get("network.T5Config.mlp_activations")
    if not isinstance(activations, (tuple, list)) or not activations:
        return default
    name = str(activations[0]).rsplit(".", 1)[-1]
    if name not in _ACTIVATIONS:
        raise ConvertError(
            f"{gin.where('network.T5Config.mlp_activations')}: MLP activation {name!r} has no Hugging Face "
            "T5 equivalent"
        )
    if gated != (len(activations) > 1):
        notes.append(
            f"{gin.where('network.T5Config.mlp_activations')}: {activations} does not match the checkpoint's "
            "MLP; used the checkpoint's"
        )
    return _ACTIVATIONS[name]


def _check_config(config: dict[str, Any], where: Path) -> None:
    for key in (
        "vocab_size",
        "d_model",
        "d_kv",
        "d_ff",
        "num_layers",
        "num_decoder_layers",
        "num_heads",
        "relative_attention_num_buckets",
    ):
        if not isinstance(config.get(key), int) or config[key] <= 0:
            raise ConvertError(f"{where}: config {key}={config.get(key)!r}: expected a positive integer")
    # derived here, after the overrides, so they follow an override
    proj = str(config.get("feed_forward_proj", ""))
    config["is_gated_act"] = proj.startswith("gated-")
    act = proj.split("-")[-1]
    config["dense_act_fn"] = "gelu_new" if proj == "gated-gelu" else act


# ----------------------------------------------------------------------------------------------------------
# tensors


def _map_tensors(params: _Params, config: dict[str, Any]) -> list[SourceTensor]:
    d_model, inner, d_ff = config["d_model"], config["num_heads"] * config["d_kv"], config["d_ff"]
    buckets, heads = config["relative_attention_num_buckets"], config["num_heads"]
    gated = config["is_gated_act"]
    per_layer_bias = config.get("model_type") == "umt5"
    out: list[SourceTensor] = []

    def add(
        name: str,
        piece: _Piece,
        shape: tuple[int, ...],
        transform: Callable[[np.ndarray], np.ndarray],
        source_shape: tuple[int, ...],
    ) -> None:
        if not _compatible(piece.shape, source_shape):
            raise ConvertError(
                f"{params.ckpt.path}: parameter {piece.origin}: shape {piece.shape} does not match "
                f"the config (expected {source_shape}; d_model={d_model}, num_heads={heads}, "
                f"d_kv={config['d_kv']}, d_ff={d_ff})"
            )
        out.append(
            SourceTensor(
                name, shape, "float32", lambda: transform(piece.read().reshape(source_shape)), piece.origin
            )
        )

    def whole(name: str, path: str, shape: tuple[int, ...], transposed: bool = False) -> None:
        piece = _Piece(params.take(path), None)
        source_shape = shape[::-1] if transposed else shape
        add(name, piece, shape, _transpose if transposed else _same, source_shape)

    def attention(prefix: str, stack: str, kind: str, i: int) -> None:
        for short, t5x_name in (("q", "query"), ("k", "key"), ("v", "value")):
            add(
                f"{prefix}.{short}.weight",
                params.layer(stack, f"{kind}/{t5x_name}/kernel", i),
                (inner, d_model),
                _transpose,
                (d_model, inner),
            )
        out_piece = params.layer(stack, f"{kind}/out/kernel", i)
        add(f"{prefix}.o.weight", out_piece, (d_model, inner), _transpose, (inner, d_model))

    def mlp(prefix: str, stack: str, i: int) -> None:
        names = ("wi_0", "wi_1") if gated else ("wi",)
        for n in names:
            if not params.has_layer(stack, f"mlp/{n}/kernel"):
                other = "a plain wi" if gated else "gated wi_0/wi_1"
                raise ConvertError(
                    f"{params.ckpt.path}: parameter {params.layer_path(stack, f'mlp/{n}/kernel', i)} is "
                    "missing "
                    f"(feed_forward_proj={config['feed_forward_proj']!r}, but the checkpoint has {other} MLP)"
                )
            add(
                f"{prefix}.DenseReluDense.{n}.weight",
                params.layer(stack, f"mlp/{n}/kernel", i),
                (d_ff, d_model),
                _transpose,
                (d_model, d_ff),
            )
        add(
            f"{prefix}.DenseReluDense.wo.weight",
            params.layer(stack, "mlp/wo/kernel", i),
            (d_model, d_ff),
            _transpose,
            (d_ff, d_model),
        )

    def norm(name: str, stack: str, t5x_name: str, i: int) -> None:
        add(name, params.layer(stack, f"{t5x_name}/scale", i), (d_model,), _same, (d_model,))

    def relpos(name: str, stack: str, i: int | None) -> None:
        if i is None:
            piece = _Piece(params.take(f"{stack}/relpos_bias/rel_embedding"), None)
        else:
            piece = params.layer(stack, "relpos_bias/rel_embedding", i)
        add(name, piece, (buckets, heads), _transpose, (heads, buckets))

    whole("shared.weight", "token_embedder/embedding", (config["vocab_size"], d_model))
    for i in range(config["num_layers"]):
        block = f"encoder.block.{i}"
        attention(f"{block}.layer.0.SelfAttention", "encoder", "attention", i)
        norm(f"{block}.layer.0.layer_norm.weight", "encoder", "pre_attention_layer_norm", i)
        mlp(f"{block}.layer.1", "encoder", i)
        norm(f"{block}.layer.1.layer_norm.weight", "encoder", "pre_mlp_layer_norm", i)
        if per_layer_bias or i == 0:
            relpos(
                f"{block}.layer.0.SelfAttention.relative_attention_bias.weight",
                "encoder",
                i if per_layer_bias else None,
            )
    whole("encoder.final_layer_norm.weight", "encoder/encoder_norm/scale", (d_model,))
    for i in range(config["num_decoder_layers"]):
        block = f"decoder.block.{i}"
        attention(f"{block}.layer.0.SelfAttention", "decoder", "self_attention", i)
        norm(f"{block}.layer.0.layer_norm.weight", "decoder", "pre_self_attention_layer_norm", i)
        attention(f"{block}.layer.1.EncDecAttention", "decoder", "encoder_decoder_attention", i)
        norm(f"{block}.layer.1.layer_norm.weight", "decoder", "pre_cross_attention_layer_norm", i)
        mlp(f"{block}.layer.2", "decoder", i)
        norm(f"{block}.layer.2.layer_norm.weight", "decoder", "pre_mlp_layer_norm", i)
        if per_layer_bias or i == 0:
            relpos(
                f"{block}.layer.0.SelfAttention.relative_attention_bias.weight",
                "decoder",
                i if per_layer_bias else None,
            )
    whole("decoder.final_layer_norm.weight", "decoder/decoder_norm/scale", (d_model,))
    if params.has("decoder/logits_dense/kernel"):
        if config.get("tie_word_embeddings"):
            raise ConvertError(
                f"{params.ckpt.path}: parameter decoder/logits_dense/kernel: the checkpoint has its "
                "own output layer, but the config says tie_word_embeddings=true"
            )
        # transformers 5 ties lm_head to shared.weight by default; both tensors present and different keep it
        # untied
        whole(
            "lm_head.weight", "decoder/logits_dense/kernel", (config["vocab_size"], d_model), transposed=True
        )
    elif not config.get("tie_word_embeddings"):
        raise ConvertError(
            f"{params.ckpt.path}: parameter decoder/logits_dense/kernel is missing "
            "(tie_word_embeddings=false needs it)"
        )
    return out


def _compatible(actual: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Equal, or the heads-split form of a 2-D kernel: (embed, heads, head_dim) or (heads, head_dim,
    embed)."""
    if len(actual) == len(expected):
        return tuple(actual) == tuple(expected)
    if int(np.prod(actual)) != int(np.prod(expected)) or len(actual) != 3 or len(expected) != 2:
        return False
    return actual[0] == expected[0] or actual[-1] == expected[-1]


def _same(array: np.ndarray) -> np.ndarray:
    return array


def _transpose(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.T)


# ----------------------------------------------------------------------------------------------------------
# tokenizer


def _tokenizer_files(
    gin: GinConfig | None, config: dict[str, Any]
) -> tuple[dict[str, bytes | Path], list[str]]:
    """The HF tokenizer files for the vocabulary T5X trained with, where the gin file says which one it
    was."""
    import json

    if gin is None:
        return {}, []
    vocabulary = gin.get("VOCABULARY") or gin.get("models.EncoderDecoderModel.output_vocabulary")
    if not isinstance(vocabulary, str):
        return {}, ["config.gin names no VOCABULARY: no tokenizer written"]
    if "ByteVocabulary" in vocabulary:
        extra = config["vocab_size"] - 259
        tokenizer = {
            "tokenizer_class": "ByT5Tokenizer",
            "extra_ids": max(extra, 0),
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        }
        return {"tokenizer_config.json": (json.dumps(tokenizer, indent=2) + "\n").encode()}, []
    if "SentencePieceVocabulary" in vocabulary:
        model_file = gin.get("seqio.SentencePieceVocabulary.sentencepiece_model_file")
        extra_ids = gin.get("seqio.SentencePieceVocabulary.extra_ids", 0)
        tokenizer = {
            "tokenizer_class": "T5Tokenizer",
            "extra_ids": extra_ids if isinstance(extra_ids, int) else 0,
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        }
        config_bytes = (json.dumps(tokenizer, indent=2) + "\n").encode()
        if isinstance(model_file, str) and Path(model_file).expanduser().is_file():
            return {"spiece.model": Path(model_file).expanduser(), "tokenizer_config.json": config_bytes}, []
        return {}, [
            f"tokenizer not written: {gin.where('seqio.SentencePieceVocabulary.sentencepiece_model_file')}: "
            f"{model_file} is not a local file (pass --tokenizer PATH to the spiece.model or an HF tokenizer "
            "dir)"
        ]
    return {}, [
        f"{gin.where('VOCABULARY')}: vocabulary {vocabulary} is not one tpuft knows: no tokenizer written"
    ]
