"""The named parameter shapes of a Hugging Face ``T5ForConditionalGeneration``, computed from its config
alone.

T5, mT5 and ByT5 share one architecture (``MT5ForConditionalGeneration`` is the same module tree), so a
handful of config numbers give every parameter's name and shape, in the order ``model.named_parameters()``
lists them, without torch or transformers. ``tests/test_model_summary.py`` compares this with the real model
built in the PyTorch/XLA backend's venv. Pure Python: the CLI (``recipes show --summary``) and the trainer
(the FSDP plan) both use it.

Tying. ``shared.weight`` is the input embedding of both stacks (``encoder.embed_tokens`` and
``decoder.embed_tokens`` are the same tensor and ``named_parameters()`` lists it once). A tied model (T5 v1.0:
``tie_word_embeddings`` true, the default) also uses it as the output layer; an untied one (T5 v1.1, mT5,
ByT5) has its own ``lm_head.weight``. transformers 5 builds every *fresh* T5 tied (``T5Config`` keeps
``tie_word_embeddings: false`` only as "do not rescale the decoder output") and unties it only when a
checkpoint brings a different ``lm_head.weight``, as the v1.1, mT5 and ByT5 checkpoints do. So a random-init
model with ``tie_word_embeddings: false`` has no ``lm_head`` under transformers 5, and has one under
transformers 4: these shapes follow the config, as transformers 4 and checkpoints do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuft.model.t5_config import TRANSFORMERS_DEFAULTS

Shape = tuple[int, ...]

ARCHITECTURE_KEYS = (
    "vocab_size",
    "d_model",
    "d_kv",
    "d_ff",
    "num_layers",
    "num_decoder_layers",
    "num_heads",
    "relative_attention_num_buckets",
    "feed_forward_proj",
)
T5_DEFAULTS: dict[str, Any] = {
    **{key: TRANSFORMERS_DEFAULTS[key] for key in ARCHITECTURE_KEYS},
    "tie_word_embeddings": True,  # PretrainedConfig's
}
"""The architecture keys and transformers' defaults for them (from
``tpuft.model.t5_config.TRANSFORMERS_DEFAULTS``)."""

MODEL_TYPES = ("t5", "mt5")
"""``model_type`` values of config.json that this module describes (ByT5's config.json says t5)."""


def architecture(config: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture keys of a T5 config (a config.json, or ``T5Config`` keyword arguments), defaults
    filled in and ``num_decoder_layers`` resolved. Raises ValueError for a config of another architecture or a
    bad number."""
    model_type = config.get("model_type")
    if model_type is not None and model_type not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not T5 or mT5 ({', '.join(MODEL_TYPES)})")
    arch = {key: config.get(key, default) for key, default in T5_DEFAULTS.items()}
    for key in (
        "vocab_size",
        "d_model",
        "d_kv",
        "d_ff",
        "num_layers",
        "num_heads",
        "relative_attention_num_buckets",
    ):
        if not isinstance(arch[key], int) or isinstance(arch[key], bool) or arch[key] < 1:
            raise ValueError(f"{key} must be a positive integer (got {arch[key]!r})")
    if arch["num_decoder_layers"] is None:
        arch["num_decoder_layers"] = arch["num_layers"]
    if not isinstance(arch["num_decoder_layers"], int) or arch["num_decoder_layers"] < 1:
        raise ValueError(
            f"num_decoder_layers must be a positive integer (got {arch['num_decoder_layers']!r})"
        )
    if not isinstance(arch["feed_forward_proj"], str):
        raise ValueError(
            "feed_forward_proj must be a string such as relu or gated-gelu (got "
            f"{arch['feed_forward_proj']!r})"
        )
    arch["tie_word_embeddings"] = bool(arch["tie_word_embeddings"])
    return arch


def is_gated(config: Mapping[str, Any]) -> bool:
    """``gated-gelu`` / ``gated-silu`` (T5 v1.1, mT5, ByT5): two input projections ``wi_0``, ``wi_1``; else
    one ``wi``."""
    return str(config.get("feed_forward_proj", "relu")).startswith("gated-")


def t5_shapes(config: Mapping[str, Any]) -> dict[str, Shape]:
    """``{name: shape}`` of ``T5ForConditionalGeneration(T5Config(**config)).named_parameters()``, in that
    order.

    ``config``: a config.json's content or T5Config keyword arguments (missing keys take transformers'
    defaults). The relative attention bias lives in block 0's self-attention of each stack only (shared by the
    other blocks).
    """
    arch = architecture(config)
    d_model, inner = arch["d_model"], arch["num_heads"] * arch["d_kv"]
    d_ff, heads, buckets = arch["d_ff"], arch["num_heads"], arch["relative_attention_num_buckets"]
    wi = ("wi_0", "wi_1") if is_gated(arch) else ("wi",)

    def attention(prefix: str, kind: str, relative_bias: bool) -> dict[str, Shape]:
        at = f"{prefix}.{kind}"
        out: dict[str, Shape] = {f"{at}.{m}.weight": (inner, d_model) for m in ("q", "k", "v")}
        out[f"{at}.o.weight"] = (d_model, inner)
        if relative_bias:
            out[f"{at}.relative_attention_bias.weight"] = (buckets, heads)
        out[f"{prefix}.layer_norm.weight"] = (d_model,)
        return out

    def feed_forward(prefix: str) -> dict[str, Shape]:
        out: dict[str, Shape] = {f"{prefix}.DenseReluDense.{name}.weight": (d_ff, d_model) for name in wi}
        out[f"{prefix}.DenseReluDense.wo.weight"] = (d_model, d_ff)
        out[f"{prefix}.layer_norm.weight"] = (d_model,)
        return out

    shapes: dict[str, Shape] = {"shared.weight": (arch["vocab_size"], d_model)}
    for i in range(arch["num_layers"]):
        block = f"encoder.block.{i}.layer"
        shapes.update(attention(f"{block}.0", "SelfAttention", i == 0))
        shapes.update(feed_forward(f"{block}.1"))
    shapes["encoder.final_layer_norm.weight"] = (d_model,)
    for i in range(arch["num_decoder_layers"]):
        block = f"decoder.block.{i}.layer"
        shapes.update(attention(f"{block}.0", "SelfAttention", i == 0))
        shapes.update(attention(f"{block}.1", "EncDecAttention", False))
        shapes.update(feed_forward(f"{block}.2"))
    shapes["decoder.final_layer_norm.weight"] = (d_model,)
    if not arch["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (arch["vocab_size"], d_model)
    return shapes


def numel(shape: Shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def count(shapes: Mapping[str, Shape]) -> int:
    """Parameters in all."""
    return sum(numel(shape) for shape in shapes.values())


# ----------------------------------------------------------------------------------------------------------
# Known models

_V1_0 = {"feed_forward_proj": "relu", "tie_word_embeddings": True, "vocab_size": 32128, "d_kv": 64}
_V1_1 = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "vocab_size": 32128, "d_kv": 64}
_MT5 = {**_V1_1, "model_type": "mt5", "vocab_size": 250112}
_BYT5 = {**_V1_1, "vocab_size": 384}


def _dims(
    d_model: int,
    d_ff: int,
    num_heads: int,
    num_layers: int,
    num_decoder_layers: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "d_model": d_model,
        "d_ff": d_ff,
        "num_heads": num_heads,
        "num_layers": num_layers,
        "num_decoder_layers": num_decoder_layers or num_layers,
        **extra,
    }


KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "t5-small": {**_V1_0, **_dims(512, 2048, 8, 6)},
    "t5-base": {**_V1_0, **_dims(768, 3072, 12, 12)},
    "t5-large": {**_V1_0, **_dims(1024, 4096, 16, 24)},
    "t5-3b": {**_V1_0, **_dims(1024, 16384, 32, 24, d_kv=128)},
    "t5-11b": {**_V1_0, **_dims(1024, 65536, 128, 24, d_kv=128)},
    "google/t5-v1_1-small": {**_V1_1, **_dims(512, 1024, 6, 8)},
    "google/t5-v1_1-base": {**_V1_1, **_dims(768, 2048, 12, 12)},
    "google/t5-v1_1-large": {**_V1_1, **_dims(1024, 2816, 16, 24)},
    "google/t5-v1_1-xl": {**_V1_1, **_dims(2048, 5120, 32, 24)},
    "google/t5-v1_1-xxl": {**_V1_1, **_dims(4096, 10240, 64, 24)},
    "google/mt5-small": {**_MT5, **_dims(512, 1024, 6, 8)},
    "google/mt5-base": {**_MT5, **_dims(768, 2048, 12, 12)},
    "google/mt5-large": {**_MT5, **_dims(1024, 2816, 16, 24)},
    "google/mt5-xl": {**_MT5, **_dims(2048, 5120, 32, 24)},
    "google/mt5-xxl": {**_MT5, **_dims(4096, 10240, 64, 24)},
    "google/byt5-small": {**_BYT5, **_dims(1472, 3584, 6, 12, 4)},
    "google/byt5-base": {**_BYT5, **_dims(1536, 3968, 12, 18, 6)},
    "google/byt5-large": {**_BYT5, **_dims(1536, 3840, 16, 36, 12)},
    "google/byt5-xl": {**_BYT5, **_dims(2560, 6720, 32, 36, 12)},
    "google/byt5-xxl": {**_BYT5, **_dims(4672, 12352, 64, 36, 12)},
}
"""Architecture keys of the public checkpoints' config.json on the Hugging Face hub (all with 32 relative
attention buckets), written down so that the summary works offline. Cross-checked with the T5X model gins of
the same models (t5x/examples/t5/{t5_1_0,t5_1_1,mt5,byt5}/*.gin: emb_dim, mlp_dim, num_heads, head_dim,
layers, vocab_size, logits_via_embedding = tie_word_embeddings) and with the published parameter counts
(tests/test_model_summary.py)."""

_ALIASES = {f"google-t5/{name}": name for name in KNOWN_CONFIGS if name.startswith("t5-")}
"""The hub moved the original checkpoints under google-t5/; the old ids still resolve."""

TOKENIZER_SIZES: dict[str, int] = {"t5": 32100, "mt5": 250100, "byt5": 384}
"""``len(tokenizer)`` by family: the SentencePiece pieces plus 100 sentinels (32,000 / 250,000), or ByT5's 384
ids. A model's vocab_size is rounded up past it (32128, 250112): a random-init model takes the tokenizer's
length."""


def known_config(name: str) -> dict[str, Any] | None:
    """The architecture of a known hub id (``t5-11b``, ``google-t5/t5-11b``, ``google/mt5-base``, ...), or
    None."""
    key = name.strip().rstrip("/")
    key = _ALIASES.get(key, key)
    found = KNOWN_CONFIGS.get(key)
    return None if found is None else {"model_type": "t5", **found}


def tokenizer_size(name: str) -> int | None:
    """``len(tokenizer)`` of ``byt5`` or a known hub id's tokenizer, or None when only loading it would
    tell."""
    if name == "byt5":
        return TOKENIZER_SIZES["byt5"]
    key = _ALIASES.get(name.strip().rstrip("/"), name.strip().rstrip("/"))
    if key not in KNOWN_CONFIGS:
        encoder = known_encoder(key)
        # BERT's WordPiece: len(tokenizer) = vocab_size
        return None if encoder is None else encoder["vocab_size"]
    family = "mt5" if "/mt5-" in key else "byt5" if "/byt5-" in key else "t5"
    return TOKENIZER_SIZES[family]


# ----------------------------------------------------------------------------------------------------------
# BERT encoders (sequence classification)

BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
"""``transformers.BertConfig``'s defaults for the keys that set a parameter's shape."""

KNOWN_ENCODERS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": {},
    "bert-base-cased": {"vocab_size": 28996},
    "bert-large-uncased": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
    "bert-large-cased": {
        "vocab_size": 28996,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}
"""The hub's original BERT checkpoints (also under google-bert/), as config keys over BERT_DEFAULTS."""


def known_encoder(name: str) -> dict[str, Any] | None:
    """The config of a known BERT checkpoint (``bert-base-uncased``, ``google-bert/bert-large-cased``), or
    None."""
    key = name.strip().rstrip("/").removeprefix("google-bert/")
    found = KNOWN_ENCODERS.get(key)
    return None if found is None else {"model_type": "bert", **BERT_DEFAULTS, **found}


def encoder_architecture(config: Mapping[str, Any]) -> dict[str, Any]:
    """The shape keys of a BERT config, defaults filled in. Raises ValueError for another model type or a bad
    number (the summary counts BERT only: RoBERTa, ALBERT, ELECTRA... are laid out differently)."""
    model_type = config.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"model_type {model_type!r}: the summary counts BERT encoders only")
    arch = {key: config.get(key, default) for key, default in BERT_DEFAULTS.items()}
    for key, value in arch.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive integer (got {value!r})")
    return arch


def bert_classifier_shapes(config: Mapping[str, Any], num_labels: int) -> dict[str, Shape]:
    """``{name: shape}`` of ``BertForSequenceClassification`` (the TF one has the same tensors): embeddings,
    the layers, the pooler and the classifier head; names without the ``bert.`` prefix so that the first part
    is the module (``embeddings``, ``encoder``, ``pooler``, ``classifier``)."""
    arch = encoder_architecture(config)
    hidden, inner = arch["hidden_size"], arch["intermediate_size"]
    shapes: dict[str, Shape] = {
        "embeddings.word_embeddings.weight": (arch["vocab_size"], hidden),
        "embeddings.position_embeddings.weight": (arch["max_position_embeddings"], hidden),
        "embeddings.token_type_embeddings.weight": (arch["type_vocab_size"], hidden),
        "embeddings.LayerNorm.weight": (hidden,),
        "embeddings.LayerNorm.bias": (hidden,),
    }
    for i in range(arch["num_hidden_layers"]):
        at = f"encoder.layer.{i}"
        for name in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
        ):
            shapes[f"{at}.{name}.weight"] = (hidden, hidden)
            shapes[f"{at}.{name}.bias"] = (hidden,)
        shapes[f"{at}.attention.output.LayerNorm.weight"] = (hidden,)
        shapes[f"{at}.attention.output.LayerNorm.bias"] = (hidden,)
        shapes[f"{at}.intermediate.dense.weight"] = (inner, hidden)
        shapes[f"{at}.intermediate.dense.bias"] = (inner,)
        shapes[f"{at}.output.dense.weight"] = (hidden, inner)
        shapes[f"{at}.output.dense.bias"] = (hidden,)
        shapes[f"{at}.output.LayerNorm.weight"] = (hidden,)
        shapes[f"{at}.output.LayerNorm.bias"] = (hidden,)
    shapes["pooler.dense.weight"] = (hidden, hidden)
    shapes["pooler.dense.bias"] = (hidden,)
    shapes["classifier.weight"] = (num_labels, hidden)
    shapes["classifier.bias"] = (num_labels,)
    return shapes
