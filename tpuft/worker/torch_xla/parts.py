"""The PyTorch/XLA trainer's model-side parts, each small enough to test on its own in the backend's venv: the
model it loads, which weights train (``model.freeze``, prompt tuning), the optimizer's parameter groups,
batches with static shapes, the loss, the teacher-forced eval sums, a greedy decoder with static shapes, and
the scores and samples of decodes.

Why a decoder of our own: ``generate()`` grows the decoder input by one token per step, so XLA would compile a
new graph for every length. Here the decoder input always has the target length; step t reads position t and
writes its argmax into position t+1 through an index that is a device tensor (data, not a constant), so every
step runs the same compiled graph (on a TPU as on the CPU pod). It recomputes the decoder over the whole
prefix at each step (no KV cache), which costs ``max_target_length`` decoder passes: fine for evaluation-sized
decodes of short targets.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

FREEZABLE = {"embeddings": ("shared.", "lm_head."), "encoder": ("encoder.",), "decoder": ("decoder.",)}
"""``model.freeze`` parts by parameter name. ``shared`` is the token embedding both stacks read (HF lists it
once as ``shared.weight``, not as ``encoder.embed_tokens``), so freezing the encoder leaves the embedding to
"embeddings"."""

NO_DECAY = ("bias", "layer_norm", "layernorm", "final_layer_norm")
"""Parameters that get no weight decay: biases and norms (decaying a norm's scale towards 0 only hurts)."""

VOCAB_INIT_TOKENS = 5000
"""Prompt tuning's ``init: vocab`` draws from the first (most frequent, for sentencepiece vocabularies)
ids."""


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
    """Two optimizer groups: decayed weights, and biases and norms without decay (an empty group is left
    out)."""
    decay = [p for n, p in named if not any(key in n.lower() for key in NO_DECAY)]
    keep = [p for n, p in named if any(key in n.lower() for key in NO_DECAY)]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(train: Any, groups: list[dict[str, Any]]) -> Any:
    """AdamW, or Adafactor with every knob of ``train.adafactor`` (transformers' implementation, as seed 003
    uses)."""
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
    """Summed cross-entropy over the real target tokens (labels -100 are padding), in float32 whatever the
    compute precision. Summed, not averaged: the trainer divides by the tokens of the whole optimizer step, so
    that accumulated micro-batches give the update of one big batch."""
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
    """The encoder's keyword arguments: token ids, or embeddings with the soft prompt (a [tokens, d_model]
    tensor, e.g. a SoftPrompt's weight or the exported ``prompt.safetensors``) in front, and the mask widened
    to match."""
    if prompt is None:
        return {"input_ids": input_ids, "attention_mask": mask}
    embeds = model.get_input_embeddings()(input_ids)
    batch = embeds.shape[0]
    vectors = prompt.to(embeds.dtype).unsqueeze(0).expand(batch, -1, -1)
    ones = torch.ones(batch, prompt.shape[0], dtype=mask.dtype, device=mask.device)
    return {
        "inputs_embeds": torch.cat([vectors, embeds], dim=1),
        "attention_mask": torch.cat([ones, mask], dim=1),
    }


def greedy_decode(model: Any, prompt: Any, input_ids: Any, mask: Any, length: int, sync: Any) -> Any:
    """Greedy decodes of ``length`` tokens (the decoder start token first), in one compiled graph per step
    shape. ``prompt``: the soft prompt's vectors or None; ``sync``: the device's step barrier
    (``torch_xla.sync``), so each step's graph is cut and reused."""
    device = input_ids.device
    start = model.config.decoder_start_token_id
    inputs = encoder_inputs(model, prompt, input_ids, mask)
    encoder = model.get_encoder()(**inputs)
    enc_mask = inputs["attention_mask"]
    decoded = torch.full((input_ids.shape[0], length + 1), start, dtype=torch.long, device=device)
    for t in range(length):
        here = torch.tensor([t], device=device)  # data, not a constant: every step is the same graph
        logits = model(
            encoder_outputs=encoder,
            attention_mask=enc_mask,
            decoder_input_ids=decoded[:, :length],
            use_cache=False,
        ).logits
        step = logits.index_select(1, here).squeeze(1).argmax(-1)
        decoded = decoded.index_copy(1, here + 1, step[:, None])
        sync()
    return decoded[:, 1:]


def load_model(model_cfg: Any, tokenizer: Any, checkpoint: Any) -> Any:
    """The T5 to train, on the host: the checkpoint's (its config, overrides included, and weights) when
    resuming, else a random one of ``model.config``, else the pretrained ``model.name_or_path``; with
    ``model.dropout`` and gradient checkpointing applied. The caller seeds torch first (identical initial
    weights on every replica)."""
    from transformers import T5Config, T5ForConditionalGeneration

    overrides: dict[str, Any] = {}
    if model_cfg.dropout is not None:
        overrides["dropout_rate"] = model_cfg.dropout
    if checkpoint is not None:
        model = T5ForConditionalGeneration.from_pretrained(checkpoint, **overrides)
    elif model_cfg.config is not None:
        settings = {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.pad_token_id,
            **model_cfg.config.kwargs(),
            **overrides,
        }
        model = T5ForConditionalGeneration(T5Config(**settings))
    else:
        model = T5ForConditionalGeneration.from_pretrained(model_cfg.name_or_path, **overrides)
    if model_cfg.gradient_checkpointing:
        checkpoint_activations(model)
    return model


def checkpoint_activations(model: Any) -> None:
    """Recompute each block's activations in the backward pass. On XLA the checkpoint must be torch_xla's,
    which puts an optimization barrier before the saved inputs (or the compiler merges the recomputation back
    into the forward pass and nothing is saved); it is re-entrant, so the input embeddings are made to require
    grad."""
    from functools import partial

    import torch_xla.utils.checkpoint as xla_checkpoint

    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": True})
    model._set_gradient_checkpointing(
        enable=True, gradient_checkpointing_func=partial(xla_checkpoint.checkpoint, use_reentrant=True)
    )
    model.config.use_cache = False


def eval_sums(logits: Any, labels: Any, weights: Any) -> Any:
    """One eval batch's [loss x tokens, tokens, correct tokens, exact matches, examples] with teacher forcing:
    a target is matched when the argmax at every target position is the reference token (EOS included), which
    is exactly when greedy decoding would produce it. Rows of weight 0 (static-shape padding) count for
    nothing."""
    mask = (labels != -100) & (weights[:, None] > 0)
    safe_labels = labels.clamp(min=0)
    token_loss = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), safe_labels.reshape(-1), reduction="none"
    ).view_as(safe_labels)
    correct = (logits.argmax(-1) == safe_labels) & mask
    exact = ((correct | ~mask).all(-1) & (weights > 0)).float()
    return torch.stack(
        [(token_loss * mask).sum(), mask.sum().float(), correct.sum().float(), exact.sum(), weights.sum()]
    )


def sample_lines(
    export_dir: Any, tokenizer: Any, examples: list[Any], max_length: int, prompt_file: Any
) -> list[str]:
    """Greedy decodes of ``examples`` with the exported model (and the soft prompt in ``prompt_file``, when
    given), on the host CPU as a user would: ``'source' -> 'decoded' (expected 'target') ok|MISS`` each."""
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(export_dir)
    enc = tokenizer([e.source for e in examples], return_tensors="pt", padding=True)
    with torch.no_grad():
        if prompt_file is not None:
            from safetensors.torch import load_file

            prompt = load_file(str(prompt_file))["prompt"]
            enc = encoder_inputs(model, prompt, enc["input_ids"], enc["attention_mask"])
        out = model.generate(**enc, max_new_tokens=max_length)
    lines = []
    for example, text in zip(examples, tokenizer.batch_decode(out, skip_special_tokens=True)):
        mark = "ok" if text == example.target else "MISS"
        lines.append(f"{example.source!r} -> {text!r} (expected {example.target!r}) {mark}")
    return lines


@dataclass
class Batch:
    input_ids: Any
    attention_mask: Any
    labels: Any
    """Target ids, -100 at padding (no loss)."""
    weights: Any
    """1 for a real example, 0 for a row that pads a batch to its static shape."""
    tokens: int
    """Input and target tokens of the real examples (for throughput)."""


def encode_batch(
    tokenizer: Any,
    data_cfg: Any,
    examples: list[Any],
    pad_to: int | None,
    to_device: Callable[..., list[Any]],
) -> Batch:
    """Examples as fixed-shape tensors (``data.max_source_length`` / ``max_target_length``), padded with
    weight-0 rows to ``pad_to`` examples (static shapes: one compiled graph per batch size), placed by
    ``to_device``."""
    real = len(examples)
    sources = [e.source for e in examples]
    targets = [e.target for e in examples]
    if pad_to is not None and real < pad_to:
        sources += [""] * (pad_to - real)
        targets += [""] * (pad_to - real)
    from tpuft.data import encode_texts

    ids, mask = encode_texts(tokenizer, sources, data_cfg.max_source_length, data_cfg.truncation)
    enc = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
    dec = tokenizer(
        targets,
        max_length=data_cfg.max_target_length,
        padding="max_length",
        truncation=True,
        return_tensors="pt",
    )
    labels = dec["input_ids"].clone()
    labels[dec["attention_mask"] == 0] = -100
    weights = torch.zeros(len(sources))
    weights[:real] = 1.0
    tokens = int(enc["attention_mask"][:real].sum() + dec["attention_mask"][:real].sum())
    input_ids, attention_mask, labels_on, weights_on = to_device(
        enc["input_ids"], enc["attention_mask"], labels, weights
    )
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        labels=labels_on,
        weights=weights_on,
        tokens=tokens,
    )


def text_scores(
    decoded: list[str], references: list[str], sum_over_replicas: Callable[[Any], Any], device: Any
) -> dict[str, float]:
    """Corpus BLEU and mean ROUGE-L over every replica's decodes, from sufficient statistics summed across
    replicas (a corpus BLEU is not the mean of per-replica BLEUs)."""
    from tpuft.scoring import text_metrics

    local = [
        *text_metrics.bleu_statistics(decoded, references),
        text_metrics.rouge_l_sum(decoded, references),
        float(len(decoded)),
    ]
    totals = [
        float(x) for x in sum_over_replicas(torch.tensor(local, dtype=torch.float64, device="cpu").to(device))
    ]
    return {
        "eval_bleu": round(text_metrics.bleu_from_statistics(totals[:-2]), 4),
        "eval_rouge_l": round(100.0 * totals[-2] / max(totals[-1], 1.0), 4),
        "eval_decoded": int(totals[-1]),
    }
