"""The T5 network that a model gin of T5X's examples builds, in the architecture keys of
:mod:`tpuft.model.shapes`: the example gin named by ``backend.family`` + ``backend.size``
(``t5x/examples/t5/<family>/<size>.gin``), then the recipe's ``backend.gin_overrides`` that bind its
``T5Config`` (``network.T5Config.emb_dim: 64``), which come last in the generated run gin and so win.

Why Hugging Face's shapes count it: T5X's network has the same parameters under other names
(``token_embedder`` is ``shared``, ``logits_dense`` is ``lm_head``, one ``relpos_bias`` per stack is block 0's
relative attention bias, ``mlp_activations`` of two entries are the gated ``wi_0``/``wi_1``). The tests
compare the count with a trained T5X checkpoint's arrays.

A binding this module cannot interpret is refused with the reason (:class:`GinUnreadable`): a gin reference
where a number goes, a ``T5Config`` field it does not know, a binding that swaps the network or the model, a
scoped one. The summary then says it cannot size the model, rather than give the size of another one.
"""

from __future__ import annotations

import re
from typing import Any

FAMILY_MODELS: dict[str, str] = {
    "t5_1_0": "t5-{size}",
    "t5_1_1": "google/t5-v1_1-{size}",
    "mt5": "google/mt5-{size}",
    "byt5": "google/byt5-{size}",
}
"""``backend.family`` -> the hub checkpoint whose config.json equals the family's example gin at each size
(t5_1_0's xl and xxl gins are 3B.gin and 11B.gin: t5-3b and t5-11b). Cross-checked gin by gin (emb_dim,
num_heads, head_dim, mlp_dim, layers, vocab_size, mlp_activations, logits_via_embedding)."""

_T5_1_0_SIZES = {"xl": "3b", "xxl": "11b"}

TINY = {
    "vocab_size": 32128,
    "d_model": 8,
    "d_kv": 3,
    "d_ff": 16,
    "num_heads": 4,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
}
"""Every family's tiny.gin includes t5_1_1/base.gin and shrinks it: a T5 v1.1 of width 8 with T5's
vocabulary."""

DIMENSIONS = {
    "vocab_size": "vocab_size",
    "emb_dim": "d_model",
    "num_heads": "num_heads",
    "head_dim": "d_kv",
    "mlp_dim": "d_ff",
    "num_encoder_layers": "num_layers",
    "num_decoder_layers": "num_decoder_layers",
}
"""``T5Config`` fields that set a parameter's shape -> the architecture key they are."""

NO_PARAMETERS = ("dtype", "dropout_rate", "float32_attention_logits")
"""``T5Config`` fields that change no parameter's shape or number."""

MODEL_BUILDERS = ("network.", "layers.")
"""Configurables whose bindings (other than T5Config's known fields) build the network: not interpreted."""

_BINDING = re.compile(r"(?:(?P<scope>[\w./]+)/)?(?P<target>[\w.]+)")


class GinUnreadable(ValueError):
    """A model this module cannot size; ``key`` is the ``gin_overrides`` key to blame (None: the
    family/size)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def family_hub_id(family: str, size: str) -> str | None:
    """The hub checkpoint of the same architecture as ``family`` at ``size`` (tiny has none), or None."""
    pattern = FAMILY_MODELS.get(family)
    if pattern is None or size == "tiny":
        return None
    return pattern.format(size=_T5_1_0_SIZES.get(size, size) if family == "t5_1_0" else size)


def network_config(
    family: str, size: str, known: dict[str, Any] | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The architecture keys of the network ``family`` at ``size`` with ``overrides`` applied. ``known``: the
    hub config of :func:`family_hub_id` (the caller looks it up). Raises :class:`GinUnreadable`."""
    if size == "tiny" and family in FAMILY_MODELS:
        config = dict(TINY)
    elif known is not None:
        config = dict(known)
    else:
        raise GinUnreadable(
            None,
            f"the summary does not know the network of T5X's {family} {size} gin (it knows "
            f"{', '.join(FAMILY_MODELS)}, tiny to xxl)",
        )
    for key, value in overrides.items():
        config.update(binding_effect(key, value))
    return config


def binding_effect(key: str, value: Any) -> dict[str, Any]:
    """What one ``gin_overrides`` binding changes in the architecture keys ({} for nothing). Raises
    :class:`GinUnreadable` for a binding whose effect on the model cannot be told."""
    match = _BINDING.fullmatch(key.strip())
    if match is None:
        raise GinUnreadable(key, "not a gin binding name the summary can read")
    scope, target = match.group("scope"), match.group("target")
    configurable, _, field = target.rpartition(".")
    if configurable.rsplit(".", 1)[-1] == "T5Config":
        if scope:
            raise GinUnreadable(
                key, f"a scoped binding ({scope}/): the summary cannot tell which T5Config builds the model"
            )
        return _t5config_field(key, field, value)
    if not configurable:  # a macro
        if target == "MODEL":
            raise GinUnreadable(key, "MODEL rebound: the summary sizes the family's model, not another one")
        if (
            not target.isupper()
        ):  # T5X's macros are UPPER_CASE; a bare lowercase name is a nested key gone wrong
            raise GinUnreadable(
                key,
                "neither a MACRO nor a configurable.parameter binding: the summary cannot tell what it binds",
            )
        return {}
    if target.startswith(MODEL_BUILDERS) or (configurable.endswith("Model") and field == "module"):
        raise GinUnreadable(key, f"{target} builds the network: the summary cannot tell what it makes of it")
    return {}


def _t5config_field(key: str, field: str, value: Any) -> dict[str, Any]:
    if field in NO_PARAMETERS:
        return {}
    if field in DIMENSIONS:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GinUnreadable(key, f"{value!r} is not a positive whole number the summary can size")
        return {DIMENSIONS[field]: value}
    if field == "logits_via_embedding":
        if not isinstance(value, bool):
            raise GinUnreadable(key, f"{value!r} is not true or false")
        return {"tie_word_embeddings": value}
    if field == "mlp_activations":
        if (
            isinstance(value, str)
            or not isinstance(value, (list, tuple))
            or not 1 <= len(value) <= 2
            or not all(isinstance(v, str) and re.fullmatch(r"\w+", v) for v in value)
        ):
            raise GinUnreadable(
                key, f"{value!r}: the summary sizes one activation (relu) or two (gated: gelu, linear)"
            )
        return {"feed_forward_proj": value[0] if len(value) == 1 else f"gated-{value[0]}"}
    raise GinUnreadable(
        key,
        f"T5Config has no field {field!r} the summary knows (it knows "
        f"{', '.join([*DIMENSIONS, 'logits_via_embedding', 'mlp_activations', *NO_PARAMETERS])})",
    )
