"""The Keras trainer's eval decodes (``eval.generate_examples``, and ``eval.metric: bleu | rouge_l``): at
every evaluation, greedy decodes of the first ``generate_examples`` held-out examples, scored by the one
shared scorer (:mod:`tpuft.scoring.predictions`: BLEU and ROUGE-L from summable statistics) into
``eval_bleu``, ``eval_rouge_l`` and ``eval_decoded``, which rank evaluations for keep-best and early stopping
like any metric.

One decoder: the trainer's :class:`~tpuft.worker.keras.predict.KerasEngine` (static-shape greedy decoding on
the device under the run's strategy, the soft prompt included), built once and shared with the test evaluation
(``keras_test.py``), so an eval's BLEU and the test's come from the same decodes of the same weights. The
examples are dealt as the eval set is (the first N of the set, wherever their shard is); each program decodes
its share and the statistics are summed over the workers with one all-reduce, so every worker ranks by the
same number. The first decodes go to TensorBoard as text at each evaluation, and are said at the end as the
torch trainer says its samples.
"""

from __future__ import annotations

from typing import Any

from tpuft.data import Example
from tpuft.scoring import predictions
from tpuft.worker.keras.predict import KerasEngine

SAMPLES = 3
"""Decodes shown as samples (TensorBoard text at each evaluation; lines at the end)."""


def engine(run: Any) -> KerasEngine:
    """The trainer's one prediction engine (``run``: a ``keras_train.KerasRun``), built on first use: a batch
    of the eval batch per local replica."""
    if getattr(run, "_engine", None) is None:
        run._engine = KerasEngine(
            run.tf,
            run.strategy,
            run.model.hf,
            run.tokenizer,
            run.recipe,
            batch_size=run.data.eval_batch * len(run.strategy.extended.worker_devices),
        )
    return run._engine


def generate_share(run: Any) -> list[Example]:
    """This program's share of the first ``eval.generate_examples`` held-out examples."""
    rank, world = (0, 1) if run.tpu_hosts else (run.ctx.worker_id, run.ctx.num_workers)
    return run.data.eval_examples[: len(range(rank, run.recipe.eval.generate_examples, world))]


def eval_scores(run: Any) -> dict[str, Any]:
    """BLEU and ROUGE-L of this evaluation's decodes over every worker (empty without ``generate_examples``);
    the samples logged. Every worker calls it at the same evaluation (the sum is a collective)."""
    if not run.recipe.eval.generate_examples or not run.loop.has_eval:
        return {}
    share = generate_share(run)
    decoded = engine(run).predict([example.source for example in share])
    run.last_decodes = list(zip(share, decoded))
    stats = predictions.statistics(decoded, [example.target for example in share])
    scores = predictions.scores(summed(run, stats))
    if run.loop.metrics is not None:
        run.loop.metrics.log_text(run.loop.step, "samples", "\n\n".join(sample_lines(run.last_decodes)))
    return {
        "eval_bleu": scores["bleu"],
        "eval_rouge_l": scores["rouge_l"],
        "eval_decoded": scores["examples"],
    }


def sample_lines(decodes: list[tuple[Example, str]]) -> list[str]:
    """``'source' -> 'decoded' (expected 'target') ok|MISS`` of the first decodes."""
    return [
        f"{example.source!r} -> {text!r} (expected {example.target!r}) "
        f"{'ok' if predictions.correct(text, example.target) else 'MISS'}"
        for example, text in decodes[:SAMPLES]
    ]


def summed(run: Any, stats: list[float]) -> list[float]:
    """``stats`` summed over the workers of a CPU pod run (one all-reduce; one local replica of each worker
    brings them, the others zeros); a TPU program has every prediction already."""
    if run.tpu_hosts or run.ctx.num_workers == 1:
        return stats
    tf, strategy = run.tf, run.strategy
    local = len(strategy.extended.worker_devices)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(
            stats if context.replica_id_in_sync_group % local == 0 else [0.0] * len(stats), tf.float64
        )
    )
    total = strategy.reduce("SUM", values, axis=None)
    return [float(x) for x in total.numpy()]
