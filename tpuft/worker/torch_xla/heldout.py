"""The PyTorch/XLA trainer's held-out decodes (:class:`tpuft.worker.torch_xla.train.Trainer`'s): the
evaluation the sequencer asks for (teacher-forced sums on the device, greedy decodes scored on the host), the
decodes the test evaluation reuses, and the samples the export shows. Split from the trainer so that it reads
as the engine's set-up and step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.data import Example


def evaluate(trainer: Any) -> dict[str, Any]:
    """Teacher-forced loss, token accuracy and exact match over every replica's eval shard; BLEU and
    ROUGE-L of greedy decodes of the first ``eval.generate_examples`` held-out examples, decoded on the
    device (TPU or the CPU pod's XLA device) with static shapes and scored on the host."""
    from tpuft.worker.torch_xla import parts as torch_parts

    torch = trainer.torch
    if trainer.eval_shard is None:
        return {}
    trainer.model.eval()
    sums = torch.zeros(5, device=trainer.device)  # loss*tokens, tokens, correct tokens, exact, examples
    with torch.no_grad():
        for start in range(0, len(trainer.eval_shard), trainer.local_eval_batch):
            chunk = trainer.eval_shard[start : start + trainer.local_eval_batch]
            batch = trainer._encode(chunk, pad_to=trainer.local_eval_batch)
            sums = sums + torch_parts.eval_sums(trainer._logits(batch), batch.labels, batch.weights)
            trainer.torch_xla.sync()
        decoded = decode(trainer, trainer.generate_shard) if trainer.recipe.eval.generate_examples else None
    totals = trainer.replicas.sum(sums)
    loss_sum, tokens, correct_tokens, exact_sum, examples = (float(x) for x in totals)
    result = {
        "eval_loss": round(loss_sum / max(tokens, 1.0), 6),
        "eval_token_accuracy": round(correct_tokens / max(tokens, 1.0), 6),
        "eval_exact_match": round(exact_sum / max(examples, 1.0), 6),
        "eval_examples": int(examples),
    }
    if decoded is not None:
        result.update(text_scores(trainer, decoded))
    trainer.model.train()
    return result


def decode(trainer: Any, examples: list[Example]) -> list[str]:
    """Greedy decodes of ``examples`` (this replica's share), as text, in batches of the eval batch."""
    from tpuft.worker.torch_xla import parts as torch_parts

    texts: list[str] = []
    eos = trainer.tokenizer.eos_token_id
    for start in range(0, len(examples), trainer.local_eval_batch):
        chunk = examples[start : start + trainer.local_eval_batch]
        batch = trainer._encode(chunk, pad_to=trainer.local_eval_batch)
        with trainer._autocast():
            ids = torch_parts.greedy_decode(
                trainer.model,
                trainer._prompt_vectors(),
                batch.input_ids,
                batch.attention_mask,
                trainer.recipe.data.max_target_length,
                trainer.torch_xla.sync,
            )
        for row in ids[: len(chunk)].to("cpu").tolist():
            row = row[: row.index(eos)] if eos in row else row
            texts.append(trainer.tokenizer.decode(row, skip_special_tokens=True))
    return texts


def text_scores(trainer: Any, decoded: list[str]) -> dict[str, float]:
    from tpuft.worker.torch_xla import parts as torch_parts

    trainer.last_decodes = list(zip(trainer.generate_shard, decoded))
    return torch_parts.text_scores(
        decoded, [e.target for e in trainer.generate_shard], trainer.replicas.sum, trainer.device
    )


def show_samples(trainer: Any, export_dir: Path, prompt_file: Path | None, count: int = 3) -> None:
    """Greedy-decode a few held-out inputs with the exported model (and the soft prompt), on the host CPU,
    as a user would."""
    if not trainer.eval_shard:
        return
    from tpuft.worker.torch_xla import parts as torch_parts

    lines = torch_parts.sample_lines(
        export_dir,
        trainer.tokenizer,
        trainer.eval_shard[:count],
        trainer.recipe.data.max_target_length,
        prompt_file,
    )
    for line in lines:
        trainer._say(f"sample: {line}")
    trainer.metrics.log_text(trainer.step, "samples", "\n\n".join(lines))
