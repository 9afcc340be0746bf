"""The PyTorch/XLA trainer's model-side parts, each small enough to test on its own in the backend's venv: which
weights train (``model.freeze``, prompt tuning), the optimizer's parameter groups, the loss, and a greedy decoder
with static shapes.

Why a decoder of our own: ``generate()`` grows the decoder input by one token per step, so XLA would compile a new
graph for every length. Here the decoder input always has the target length; step t reads position t and writes its
argmax into position t+1 through an index that is a device tensor (data, not a constant), so every step runs the same
compiled graph (on a TPU as on the CPU pod). It recomputes the decoder over the whole prefix at each step (no KV cache), which costs
``max_target_length`` decoder passes: fine for evaluation-sized decodes of short targets.
"""

from __future__ import annotations

import random
from typing import Any

import torch

FREEZABLE = {"embeddings": ("shared.", "lm_head."), "encoder": ("encoder.",), "decoder": ("decoder.",)}
"""``model.freeze`` parts by parameter name. ``shared`` is the token embedding both stacks read (HF lists it once as
``shared.weight``, not as ``encoder.embed_tokens``), so freezing the encoder leaves the embedding to "embeddings"."""

NO_DECAY = ("bias", "layer_norm", "layernorm", "final_layer_norm")
"""Parameters that get no weight decay: biases and norms (decaying a norm's scale towards 0 only hurts)."""

VOCAB_INIT_TOKENS = 5000
"""Prompt tuning's ``init: vocab`` draws from the first (most frequent, for sentencepiece vocabularies) ids."""


def freeze(model: Any, parts: list[str]) -> list[str]:
    """Turn off gradients for the named parts; returns the frozen parameter names."""
    prefixes = tuple(prefix for part in parts for prefix in FREEZABLE[part])
    frozen = []
    for name, param in model.named_parameters():
        if prefixes and name.startswith(prefixes):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def parameter_groups(named: list[tuple[str, Any]], weight_decay: float) -> list[dict[str, Any]]:
    """Two optimizer groups: decayed weights, and biases and norms without decay (an empty group is left out)."""
    decay = [p for n, p in named if not any(key in n.lower() for key in NO_DECAY)]
    keep = [p for n, p in named if any(key in n.lower() for key in NO_DECAY)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(train: Any, groups: list[dict[str, Any]]) -> Any:
    """AdamW, or Adafactor with every knob of ``train.adafactor`` (transformers' implementation, as seed 003 uses)."""
    if train.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        knobs = train.adafactor
        return Adafactor(
            groups,
            lr=None if knobs.relative_step else train.learning_rate,
            eps=tuple(knobs.eps),
            clip_threshold=knobs.clip_threshold,
            decay_rate=knobs.decay_rate,
            beta1=knobs.beta1,
            scale_parameter=knobs.scale_parameter,
            relative_step=knobs.relative_step,
            warmup_init=knobs.warmup_init,
        )
    return torch.optim.AdamW(groups, lr=train.learning_rate, foreach=False)


def token_loss_sum(logits: Any, labels: Any, smoothing: float) -> Any:
    """Summed cross-entropy over the real target tokens (labels -100 are padding), in float32 whatever the compute
    precision. Summed, not averaged: the trainer divides by the tokens of the whole optimizer step, so that
    accumulated micro-batches give the update of one big batch."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(
        flat, labels.reshape(-1), ignore_index=-100, reduction="sum", label_smoothing=smoothing
    )


class SoftPrompt(torch.nn.Module):
    """``tokens`` trainable vectors put before every input's embeddings (Lester et al., 2021)."""

    def __init__(self, embedding: Any, tokens: int, init: str, seed: int) -> None:
        super().__init__()
        weight = embedding.weight.detach().to("cpu")
        if init == "vocab":
            rng = random.Random(seed)
            ids = [rng.randrange(min(VOCAB_INIT_TOKENS, weight.shape[0])) for _ in range(tokens)]
            start = weight[ids].clone()
        else:
            generator = torch.Generator().manual_seed(seed)
            start = torch.empty(tokens, weight.shape[1]).uniform_(-0.5, 0.5, generator=generator)
        self.weight = torch.nn.Parameter(start.float())



def encoder_inputs(model: Any, prompt: Any, input_ids: Any, mask: Any) -> dict[str, Any]:
    """The encoder's keyword arguments: token ids, or embeddings with the soft prompt (a [tokens, d_model] tensor,
    e.g. a SoftPrompt's weight or the exported ``prompt.safetensors``) in front, and the mask widened to match."""
    if prompt is None:
        return {"input_ids": input_ids, "attention_mask": mask}
    embeds = model.get_input_embeddings()(input_ids)
    batch = embeds.shape[0]
    vectors = prompt.to(embeds.dtype).unsqueeze(0).expand(batch, -1, -1)
    ones = torch.ones(batch, prompt.shape[0], dtype=mask.dtype, device=mask.device)
    return {"inputs_embeds": torch.cat([vectors, embeds], dim=1), "attention_mask": torch.cat([ones, mask], dim=1)}


def greedy_decode(model: Any, prompt: Any, input_ids: Any, mask: Any, length: int, sync: Any) -> Any:
    """Greedy decodes of ``length`` tokens (the decoder start token first), in one compiled graph per step shape.
    ``prompt``: the soft prompt's vectors or None; ``sync``: the device's step barrier (``torch_xla.sync``), so each
    step's graph is cut and reused."""
    device = input_ids.device
    start = model.config.decoder_start_token_id
    inputs = encoder_inputs(model, prompt, input_ids, mask)
    encoder = model.get_encoder()(**inputs)
    enc_mask = inputs["attention_mask"]
    decoded = torch.full((input_ids.shape[0], length + 1), start, dtype=torch.long, device=device)
    for t in range(length):
        here = torch.tensor([t], device=device)  # data, not a constant: every step is the same graph
        logits = model(encoder_outputs=encoder, attention_mask=enc_mask, decoder_input_ids=decoded[:, :length],
                       use_cache=False).logits
        step = logits.index_select(1, here).squeeze(1).argmax(-1)
        decoded = decoded.index_copy(1, here + 1, step[:, None])
        sync()
    return decoded[:, 1:]
