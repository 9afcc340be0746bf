"""Which parts of the Keras trainer's Hugging Face TF model train (``model.freeze``) and which recompute their
activations in the backward pass (``model.gradient_checkpointing``), in Keras's own terms: ``trainable =
False`` on layers, and ``tf.recompute_grad`` around each T5 block. TensorFlow is passed in: this module
imports without it.

Freezing sets ``trainable = False`` on the T5 blocks and final norms of a stack, not on the stack itself: a
stack holds the shared token embedding as its ``embed_tokens``, and Keras propagates ``trainable`` to every
layer a layer holds, so freezing the encoder stack would freeze the embedding too. As in the PyTorch/XLA
trainer (``torch_parts.FREEZABLE``), "embeddings" is the shared embedding and an untied ``lm_head``, and
"encoder" / "decoder" leave it alone. A frozen variable is not in ``trainable_variables``: the train step
takes no gradient for it and the optimizer keeps no state for it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

BLOCK_TENSORS = (
    "hidden_states",
    "attention_mask",
    "position_bias",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "encoder_decoder_position_bias",
)
"""The arguments of a T5 block that are tensors the gradient flows through: passed to ``tf.recompute_grad``
positionally (it differentiates its positional inputs only; the decoder's cross-attention needs the gradient
of ``encoder_hidden_states``, block 0's relative position bias the gradient of ``position_bias``)."""


def freeze(hf: Any, parts: list[str], *, classify: bool) -> list[str]:
    """``trainable = False`` on the named parts; returns the frozen variables' names. A classifier (a
    BERT-like encoder) has "embeddings" and "encoder" (its main layer's), its head always trains."""
    layers: list[Any] = []
    for part in parts:
        layers += part_layers(hf, part, classify=classify)
    for layer in layers:
        layer.trainable = False
    return sorted({v.name for layer in layers for v in layer.weights})


def part_layers(hf: Any, part: str, *, classify: bool) -> list[Any]:
    if classify:
        main = hf.layers[0]  # TFBertMainLayer and its kin: embeddings, encoder, pooler
        found = getattr(main, part, None)
        if found is None:
            raise RuntimeError(f"model.freeze: {type(hf).__name__} has no {part}")
        return [found]
    if part == "embeddings":
        head = getattr(hf, "lm_head", None) if not hf.config.tie_word_embeddings else None
        return [hf.shared] + ([head] if head is not None else [])
    stack = hf.encoder if part == "encoder" else hf.decoder
    return [*stack.block, stack.final_layer_norm]


def checkpoint_blocks(tf: Any, hf: Any, *, recompute: bool = True) -> int:
    """Wrap every T5 block of both stacks in ``tf.recompute_grad``: the forward pass keeps only each block's
    inputs, the backward pass runs the block again. Returns the blocks wrapped. Call before the model is
    traced. ``recompute=False`` keeps everything but the recomputation (the replayable dropout): the tests'
    reference."""
    blocks = [*hf.encoder.block, *hf.decoder.block]
    for block in blocks:
        block.call = recomputed_call(tf, block, block.call, recompute=recompute)
    return len(blocks)


def recomputed_call(tf: Any, block: Any, original: Any, *, recompute: bool = True) -> Any:
    """``original`` (a T5 block's ``call``) with its training forward pass under ``tf.recompute_grad``.
    Inference, decoding with a cache and attention outputs take the plain call.

    Dropout: ``tf.recompute_grad`` does not replay random ops, so a block recomputed with fresh dropout masks
    would give the gradient of another network than the one whose loss was computed. The block's Dropout
    layers draw stateless masks instead, from a seed drawn once per call that the recomputation reads again,
    so that the forward pass and its recomputation drop the same units."""
    dropouts = [
        layer
        for layer in block._flatten_layers(include_self=False)
        if isinstance(layer, tf.keras.layers.Dropout)
    ]
    seed_box: list[Any] = [None]
    for index, layer in enumerate(dropouts):
        layer.call = replayable_dropout(tf, layer, layer.call, seed_box, index)

    @functools.wraps(original)
    def call(
        hidden_states: Any,
        attention_mask: Any = None,
        position_bias: Any = None,
        encoder_hidden_states: Any = None,
        encoder_attention_mask: Any = None,
        encoder_decoder_position_bias: Any = None,
        layer_head_mask: Any = None,
        encoder_layer_head_mask: Any = None,
        past_key_value: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        training: bool = False,
    ) -> Any:
        given = {
            "hidden_states": hidden_states,
            "attention_mask": attention_mask,
            "position_bias": position_bias,
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": encoder_attention_mask,
            "encoder_decoder_position_bias": encoder_decoder_position_bias,
        }
        if (
            not training
            or past_key_value is not None
            or output_attentions
            or layer_head_mask is not None
            or encoder_layer_head_mask is not None
        ):
            return original(
                **given,
                layer_head_mask=layer_head_mask,
                encoder_layer_head_mask=encoder_layer_head_mask,
                past_key_value=past_key_value,
                use_cache=use_cache,
                output_attentions=output_attentions,
                training=training,
            )
        names = [name for name in BLOCK_TENSORS if given[name] is not None]
        cross = block.is_decoder and encoder_hidden_states is not None

        # one per call, the same in the recomputation
        seed = tf.random.uniform([2], 0, 2**31 - 1, dtype=tf.int32)

        def run(*values: Any) -> Any:
            with replay(seed_box, seed):
                outputs = original(**dict(zip(names, values)), use_cache=False, training=True)
            # hidden states, (no cache), self-attention position bias, (cross-attention position bias)
            return (outputs[0], outputs[2], outputs[3]) if cross else (outputs[0], outputs[2])

        result = (tf.recompute_grad(run) if recompute else run)(*(given[name] for name in names))
        return (result[0], None, *result[1:])

    return call


def replayable_dropout(tf: Any, layer: Any, original: Any, seed_box: list[Any], index: int) -> Any:
    """A Dropout layer's call that, inside a recomputed block, draws its mask statelessly from the block's
    seed."""

    @functools.wraps(original)
    def call(inputs: Any, training: Any = None) -> Any:
        seed = seed_box[0]
        if seed is None or not training or not layer.rate:
            return original(inputs, training=training)
        return tf.nn.experimental.stateless_dropout(inputs, rate=layer.rate, seed=seed + [0, index])

    return call


@contextlib.contextmanager
def replay(seed_box: list[Any], seed: Any) -> Iterator[None]:
    seed_box[0] = seed
    try:
        yield
    finally:
        seed_box[0] = None


def apply(tf: Any, hf: Any, model_cfg: Any, *, classify: bool, say: Any) -> None:
    """The recipe's ``model.freeze`` and ``model.gradient_checkpointing`` on the freshly built model."""
    if model_cfg.freeze:
        frozen = freeze(hf, model_cfg.freeze, classify=classify)
        say(f"frozen: {', '.join(model_cfg.freeze)} ({len(frozen)} variables)")
    if model_cfg.gradient_checkpointing:
        say(f"gradient checkpointing: {checkpoint_blocks(tf, hf)} T5 blocks recompute their activations")
