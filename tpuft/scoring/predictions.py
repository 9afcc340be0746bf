"""Predictions scored against their targets, and the predictions files: one implementation for the test
evaluation that ends a training run (every backend) and for ``tpuft predict``, so that a run's ``test_*``
numbers and what ``predict`` prints for the same model and inputs are the same computation.

A prediction is text (text to text: the decode; classification: the label name the argmax picked). The scores:

* ``exact_match``: the share of predictions equal to their target once whitespace runs are collapsed and the
  ends stripped (what a user means by "the same answer");
* classification (``labels`` given): ``accuracy`` (the same count) and ``macro_f1``, the unweighted mean of
  the F1 of every label that occurs as a target or a prediction (scikit-learn's ``f1_score(average="macro")``
  without ``labels=``); a prediction that is no label counts against its target's label only;
* text to text: ``bleu`` (corpus BLEU, sacreBLEU's defaults) and ``rouge_l`` (mean ROUGE-L F), 0-100, from
  :mod:`tpuft.scoring.text_metrics`.

Sharded work scores once: every shard turns its pairs into :func:`statistics` (a fixed-length list of sums),
the backend sums the lists over its replicas with its own collective (or the controller adds up its shards'
lists), and
:func:`scores` turns the sum into numbers. Summing is exact: every score is a ratio of sums.

Predictions files are JSON lines, one object per input: ``id`` (the input's 0-based position in its file),
``input``, ``prediction``, and ``target`` and ``correct`` when the input had a target. A sharded writer writes
one file per process (:func:`shard_name`); readers merge them by ``id``.

Stdlib only: it runs inside every backend's venv and on the controller.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tpuft.scoring.text_metrics import MAX_ORDER, bleu_from_statistics, bleu_statistics, rouge_l_sum

BLEU_STATS = 2 + 2 * MAX_ORDER


def normalize(text: str) -> str:
    """What exact match compares: whitespace runs collapsed to one space, the ends stripped."""
    return " ".join(text.split())


def correct(prediction: str, target: str) -> bool:
    return normalize(prediction) == normalize(target)


def statistics(predictions: Sequence[str], targets: Sequence[str], labels: Sequence[str] = ()) -> list[float]:
    """The summable statistics of these pairs: ``[pairs, exact matches]``, then for text to text the 10 BLEU
    statistics and the ROUGE-L sum, for classification ``labels``' true positives, false positives and false
    negatives (three numbers per label, in ``labels``' order)."""
    if isinstance(predictions, str) or isinstance(targets, str):
        raise TypeError("predictions and targets are sequences of strings, not strings")
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} predictions but {len(targets)} targets: one target each")
    pairs = [(normalize(p), normalize(t)) for p, t in zip(predictions, targets)]
    stats: list[float] = [float(len(pairs)), float(sum(p == t for p, t in pairs))]
    if not labels:
        hypotheses, references = [p for p, _ in pairs], [t for _, t in pairs]
        stats += [float(x) for x in bleu_statistics(hypotheses, references)]
        stats.append(rouge_l_sum(hypotheses, references))
        return stats
    index = {normalize(name): i for i, name in enumerate(labels)}
    counts = [0.0] * (3 * len(labels))
    for prediction, target in pairs:
        predicted, truth = index.get(prediction), index.get(target)
        if predicted is not None and predicted == truth:
            counts[3 * predicted] += 1
            continue
        if predicted is not None:
            counts[3 * predicted + 1] += 1
        if truth is not None:
            counts[3 * truth + 2] += 1
    return stats + counts


def size(labels: Sequence[str] = ()) -> int:
    """The length of :func:`statistics`' list (a collective needs it before it has any pairs)."""
    return 2 + (3 * len(labels) if labels else BLEU_STATS + 1)


def add(a: Sequence[float], b: Sequence[float]) -> list[float]:
    if len(a) != len(b):
        raise ValueError(f"statistics of different shapes: {len(a)} and {len(b)} numbers")
    return [x + y for x, y in zip(a, b)]


def scores(stats: Sequence[float], labels: Sequence[str] = ()) -> dict[str, float | int]:
    """The scores of summed :func:`statistics`: ``examples`` and ``exact_match``, then ``accuracy`` and
    ``macro_f1`` (classification) or ``bleu`` and ``rouge_l`` (text to text). Ratios are rounded to 6 places,
    BLEU and ROUGE-L (0-100) to 4."""
    if len(stats) != size(labels):
        raise ValueError(f"expected {size(labels)} statistics for {len(labels)} labels, got {len(stats)}")
    pairs = round(stats[0])
    result: dict[str, float | int] = {
        "examples": pairs,
        "exact_match": round(stats[1] / pairs, 6) if pairs else 0.0,
    }
    if labels:
        f1s = []
        for i in range(len(labels)):
            tp, fp, fn = stats[2 + 3 * i : 5 + 3 * i]
            if tp + fp + fn > 0:
                f1s.append(2 * tp / (2 * tp + fp + fn))
        result["accuracy"] = result["exact_match"]
        result["macro_f1"] = round(sum(f1s) / len(f1s), 6) if f1s else 0.0
        return result
    result["bleu"] = round(bleu_from_statistics(stats[2 : 2 + BLEU_STATS]), 4)
    result["rouge_l"] = round(100.0 * stats[2 + BLEU_STATS] / pairs, 4) if pairs else 0.0
    return result


def score(
    predictions: Sequence[str], targets: Sequence[str], labels: Sequence[str] = ()
) -> dict[str, float | int]:
    """:func:`scores` of one unsharded list of pairs."""
    return scores(statistics(predictions, targets, labels), labels)


def prefixed(result: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``{"exact_match": ..}`` -> ``{"test_exact_match": ..}`` (``prefix="test"``)."""
    return {f"{prefix}_{key}": value for key, value in result.items()}


# ----------------------------------------------------------------------------------------------------------
# Predictions files


def shard_name(index: int) -> str:
    """The file of one process's (or one input shard's) predictions."""
    return f"predictions-{index:05d}.jsonl"


def row(index: int, source: str, prediction: str, target: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": index, "input": source, "prediction": prediction}
    if target is not None:
        out["target"] = target
        out["correct"] = correct(prediction, target)
    return out


class PredictionWriter:
    """JSON lines written through ``<path>.tmp`` and renamed on :meth:`close`: a file under its final name is
    whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = path.with_name(path.name + ".tmp")
        self._handle = self._tmp.open("w", encoding="utf-8")
        self.rows = 0

    def write(self, item: dict[str, Any]) -> None:
        self._handle.write(json.dumps(item, ensure_ascii=False) + "\n")
        self.rows += 1

    def close(self) -> Path:
        self._handle.close()
        os.replace(self._tmp, self.path)
        return self.path

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is None:
            self.close()
        else:
            self._handle.close()


def write_predictions(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` whole to ``path``; returns how many."""
    with PredictionWriter(path) as writer:
        for item in rows:
            writer.write(item)
    return writer.rows


def read_rows(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)


def merged(folder: Path) -> list[dict[str, Any]]:
    """Every ``predictions-*.jsonl`` of ``folder``, in input order (for a test set's few thousand rows;
    ``tpuft predict`` joins its shards streaming)."""
    return sorted(read_rows(sorted(folder.glob("predictions-*.jsonl"))), key=lambda item: int(item["id"]))
