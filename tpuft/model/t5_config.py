"""The T5 model settings a recipe may give under ``model.config`` (random init), checked on the controller.

transformers' ``T5Config`` silently keeps any unknown keyword (``d_modle: 128`` trains the default 512-wide
model) and checks types only when the worker builds the model, minutes after launch. tpuft owns this schema so
that the CLI can check a recipe without importing transformers; ``tests/config/test_t5_schema.py`` compares it
with the installed ``T5Config`` (its fields, their defaults and the activation functions) so it stays true.

Only the keys set in the recipe reach ``T5Config``: the rest keep transformers' defaults (listed here for the
error messages and the comparison test).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

ACTIVATIONS = (
    "gelu",
    "gelu_10",
    "gelu_accurate",
    "gelu_fast",
    "gelu_new",
    "gelu_python",
    "gelu_python_tanh",
    "gelu_pytorch_tanh",
    "hardswish",
    "laplace",
    "leaky_relu",
    "linear",
    "mish",
    "prelu",
    "quick_gelu",
    "relu",
    "relu2",
    "relu6",
    "sigmoid",
    "silu",
    "sqrtsoftplus",
    "swish",
    "tanh",
    "xielu",
)
"""transformers.activations.ACT2FN's names (transformers 5.23): ``feed_forward_proj`` is ACT or gated-ACT."""

TRANSFORMERS_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_decoder_layers": None,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "initializer_factor": 1.0,
    "feed_forward_proj": "relu",
    "is_encoder_decoder": True,
    "use_cache": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "classifier_dropout": 0.0,
    "is_decoder": False,
}
"""T5Config's own fields and defaults. Keys a user may set beyond these: ``GENERAL_KEYS``."""

GENERAL_KEYS = ("tie_word_embeddings", "decoder_start_token_id")
"""PretrainedConfig keywords that mean something for a T5 trained from scratch."""

Dim = Annotated[int, Field(ge=1, le=262_144)]
TokenId = Annotated[int, Field(ge=0, le=4_194_304)]
Rate = Annotated[float, Field(ge=0.0, lt=1.0)]


class T5Settings(BaseModel):
    """Keyword arguments for ``transformers.T5Config``; every key optional, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    vocab_size: int | None = Field(
        None, ge=1, le=4_194_304, description="Vocabulary size (default: the tokenizer's)."
    )
    d_model: Dim | None = Field(None, description="Hidden size.")
    d_kv: Dim | None = Field(None, description="Size of each attention head.")
    d_ff: Dim | None = Field(None, description="Feed-forward inner size.")
    num_layers: int | None = Field(None, ge=1, le=1024, description="Encoder layers.")
    num_decoder_layers: int | None = Field(
        None, ge=1, le=1024, description="Decoder layers (default: num_layers)."
    )
    num_heads: int | None = Field(None, ge=1, le=1024, description="Attention heads.")
    relative_attention_num_buckets: int | None = Field(
        None, ge=1, le=4096, description="Buckets of relative position bias."
    )
    relative_attention_max_distance: int | None = Field(
        None, ge=1, le=1_048_576, description="Distance beyond which relative positions share a bucket."
    )
    dropout_rate: Rate | None = Field(None, description="Dropout probability, 0 <= p < 1.")
    layer_norm_epsilon: float | None = Field(
        None, gt=0.0, le=0.1, description="Epsilon of the RMS layer norms."
    )
    initializer_factor: float | None = Field(
        None, gt=0.0, le=1000.0, description="Scale of the random initialisation (1.0: T5's)."
    )
    feed_forward_proj: str | None = Field(
        None, description="relu, gelu_new, ..., or gated-ACT (T5 v1.1: gated-gelu)."
    )
    is_encoder_decoder: Literal[True] | None = Field(
        None, description="Always true for T5ForConditionalGeneration."
    )
    use_cache: bool | None = Field(
        None, description="Keep past key/values while decoding (faster generation)."
    )
    pad_token_id: TokenId | None = Field(None, description="Default: the tokenizer's.")
    eos_token_id: TokenId | None = Field(None, description="Default: the tokenizer's.")
    classifier_dropout: Rate | None = Field(None, description="Dropout before a classification head.")
    is_decoder: Literal[False] | None = Field(
        None, description="Always false for T5ForConditionalGeneration."
    )
    tie_word_embeddings: bool | None = Field(
        None, description="true: T5 v1.0 (shared, rescaled output layer)."
    )
    decoder_start_token_id: TokenId | None = Field(None, description="Default: the tokenizer's pad id.")

    @field_validator("feed_forward_proj")
    @classmethod
    def _activation_known(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = value.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or parts[-1] not in ACTIVATIONS:
            import difflib

            options = [*ACTIVATIONS, *(f"gated-{a}" for a in ACTIVATIONS)]
            close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"expected ACT or gated-ACT with ACT one of {', '.join(ACTIVATIONS)}{hint} (got {value!r})"
            )
        return value

    @model_validator(mode="after")
    def _ids_in_vocabulary(self) -> T5Settings:
        if self.vocab_size is None:
            return self
        for key in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, key)
            if value is not None and value >= self.vocab_size:
                raise ValueError(f"{key} {value} is outside the vocabulary (vocab_size {self.vocab_size})")
        return self

    @model_serializer(mode="wrap")
    def _only_what_was_set(self, handler: Any) -> dict[str, Any]:
        """The resolved recipe carries the user's keys only: transformers keeps its own defaults for the
        rest."""
        return {key: value for key, value in handler(self).items() if key in self.model_fields_set}

    def kwargs(self) -> dict[str, Any]:
        return self.model_dump()


BYT5_VOCAB = 384
"""len(ByT5Tokenizer()): 3 specials + 256 bytes + 125 sentinels."""
