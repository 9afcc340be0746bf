"""The lines a run prints, the same for every backend: users read them in the log, and tests and the
supervisors' live view parse them, so one spelling lives here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpuft.run import rundir


def progress_line(
    step: int, total: int, loss: float, lr: float, examples_per_s: float, tokens_per_s: float
) -> str:
    """The line each logged step prints, the same for every backend (users and tests read it)."""
    return (
        f"step {step}/{total} loss {loss:.4f} lr {lr:.2e} {examples_per_s:.1f} ex/s {tokens_per_s:.0f} tok/s"
    )


def eval_line(step: int, result: Mapping[str, Any]) -> str:
    """The line an evaluation prints: loss, then token accuracy and exact match (text to text) or accuracy
    (classification), then BLEU and ROUGE-L when decodes were scored."""
    if "eval_token_accuracy" in result:
        shown = (
            f"loss {result['eval_loss']:.4f} token acc {result['eval_token_accuracy']:.4f} "
            f"exact match {result['eval_exact_match']:.4f}"
        )
    else:
        shown = f"loss {result['eval_loss']:.4f} accuracy {result['eval_accuracy']:.4f}"
    scores = "".join(
        f" {key[5:]} {result[key]:.2f}" for key in ("eval_bleu", "eval_rouge_l") if key in result
    )
    return f"eval @ {step}: {shown}{scores} ({result['eval_examples']} examples)"


def test_line(result: Mapping[str, Any]) -> str:
    """The line the test evaluation prints: every ``test_*`` score, on which checkpoint, over how many
    examples."""
    shown = " ".join(
        f"{key[5:].replace('_', ' ')} {result[key]:.4f}" for key in rundir.TEST_SCORES if key in result
    )
    return (
        f"test (checkpoint step {result['test_checkpoint_step']}): {shown} ({result['test_examples']} "
        "examples)"
    )


def steps_to_keep(steps: list[int], keep_last: int, best_step: int | None) -> set[int]:
    """Which checkpoints survive pruning: the last ``keep_last`` of ``steps`` (oldest first), and the best
    one."""
    keep = set(sorted(steps)[-keep_last:]) if keep_last > 0 else set()
    if best_step is not None:
        keep.add(best_step)
    return keep
