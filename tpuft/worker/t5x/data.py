"""What a T5X fine-tuning task knows of the recipe's data and evaluation, kept framework-free (no TensorFlow,
no seqio) so that the gin writer, the test evaluation and the predict engine can read it without building a
pipeline.

The task spec (``run_dir/t5x/task.json``) holds the recipe's whole ``data`` section as JSON, not a
T5X-specific subset of it: the seqio source then builds its examples with
:func:`tpuft.data.make_example` from the same
:class:`~tpuft.config.DataConfig` every backend gets (fields, templates, prefix, transforms, the preprocess
hook, the file formats, ``data.hf``), so a key added to the shared data section reaches T5X without a change
here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tpuft.data import Example, iter_shard

if TYPE_CHECKING:
    from tpuft.config import DataConfig, RecipeConfig

TEXT_METRICS = ("bleu", "rouge_l")
"""The decoding metrics scored on the inference eval's decodes besides exact match (``eval.metric: bleu |
rouge_l``, or ``eval.generate_examples`` > 0, as the PyTorch/XLA trainer computes them)."""
SAMPLES_SHOWN = 5
"""Decoded eval examples printed in the log at each evaluation; all ``eval.generate_examples`` go to
TensorBoard."""


def finetune_spec(recipe: RecipeConfig) -> dict[str, Any]:
    """The fine-tuning part of the task spec: the data section as JSON and whether to score BLEU and
    ROUGE-L."""
    evaluation = recipe.eval
    return {
        "data": recipe.data.model_dump(mode="json"),
        "text_metrics": evaluation.metric in TEXT_METRICS or evaluation.generate_examples > 0,
    }


def data_config(spec: dict[str, Any]) -> DataConfig:
    """The spec's data section as the recipe had it (its paths are already resolved: no file is looked at)."""
    from tpuft.config import DataConfig

    return DataConfig.model_validate(spec["data"], context={"check_files": False})


def split_names(cfg: DataConfig) -> dict[str, str]:
    """seqio's split -> the recipe's name for it: a data file, or a split of ``data.hf``."""
    if cfg.hf is not None:
        splits = {"train": cfg.hf.split}
        if cfg.hf.eval_split is not None:
            splits["validation"] = cfg.hf.eval_split
        return splits
    splits = {"train": str(cfg.train)}
    if cfg.eval is not None:
        splits["validation"] = str(cfg.eval)
    return splits


def examples(cfg: DataConfig, split: str) -> Iterator[Example]:
    """Every example of seqio's ``split``, in order, streamed: T5X shards them over its hosts and shuffles
    them itself. A data file is read by :mod:`tpuft.data` (JSON lines, CSV, TSV, Parquet, local or
    gs://), a Hugging Face split by :mod:`tpuft.worker.hf_data`, each record through ``make_example``."""
    from tpuft.data import Fields

    name = split_names(cfg)[split]
    if cfg.hf is None:
        yield from iter_shard(name, 0, 1, Fields.of(cfg))
        return
    from tpuft.worker.hf_data import split_examples

    yield from split_examples(cfg, name, rank=0, world=1)


def held_out_label(cfg: DataConfig, role: str) -> str:
    """How a log line names the ``role`` ("eval", "test") set: its file, or ``hf:PATH[SPLIT]``."""
    if cfg.hf is None:
        return str(getattr(cfg, role))
    return f"hf:{cfg.hf.path}{'/' + cfg.hf.name if cfg.hf.name else ''}[{getattr(cfg.hf, f'{role}_split')}]"


def sample_lines(predictions: Sequence[dict[str, Any]], count: int) -> list[str]:
    """The first ``count`` decodes of an inference eval as the PyTorch/XLA trainer shows its samples:
    ``'source' -> 'decoded' (expected 'target') ok|MISS``, the match judged as the test evaluation judges
    it."""
    from tpuft.scoring.predictions import correct

    lines = []
    for row in predictions[:count]:
        prediction, target = str(row.get("prediction")), str(row.get("target"))
        mark = "ok" if correct(prediction, target) else "MISS"
        lines.append(f"{row.get('input')!r} -> {prediction!r} (expected {target!r}) {mark}")
    return lines


def show_samples(loop: Any, step: int, predictions: Sequence[dict[str, Any]], count: int) -> None:
    """``eval.generate_examples`` of an inference eval's decodes: the first few in the log (``sample:`` lines,
    as the PyTorch/XLA trainer prints them), all ``count`` as TensorBoard text (``samples``)."""
    lines = sample_lines(predictions, count)
    for line in lines[:SAMPLES_SHOWN]:
        loop.say(f"sample: {line}")
    if lines and loop.metrics is not None:
        loop.metrics.log_text(step, "samples", "\n\n".join(lines))


def ranking_metric(metric: str | None) -> str | None:
    """What ranks T5X's inference evals (keep-best, early stopping): ``eval.metric`` when the decodes give it
    (exact match, BLEU, ROUGE-L), else the default ranking; the teacher-forced eval's loss and token accuracy
    are rows of their own, never judged."""
    return metric if metric in ("exact_match", *TEXT_METRICS) else None
