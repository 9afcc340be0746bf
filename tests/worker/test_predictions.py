"""The scores shared by the test evaluation and ``tpuft predict``: summed over shards they equal the whole's,
and each is the textbook number on small cases worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuft.scoring import predictions
from tpuft.scoring.text_metrics import corpus_bleu, rouge_l


def test_exact_match_ignores_whitespace_runs_and_text_scores_are_text_metrics() -> None:
    hyps, refs = ["the  cat sat", "a dog", " 42 "], ["the cat sat", "a cat", "42"]
    result = predictions.score(hyps, refs)
    assert result["examples"] == 3 and result["exact_match"] == pytest.approx(2 / 3, abs=1e-6)
    assert result["bleu"] == pytest.approx(corpus_bleu(["the cat sat", "a dog", "42"], refs), abs=1e-4)
    assert result["rouge_l"] == pytest.approx(rouge_l(hyps, refs), abs=1e-4)


def test_macro_f1_averages_the_labels_that_occur_and_a_non_label_counts_against_its_target() -> None:
    labels = ["neg", "neu", "pos"]
    # pos: tp 1, fp 1, fn 1 -> 0.5; neg: tp 0, fp 1, fn 1 -> 0; neu never occurs: not averaged
    result = predictions.score(["pos", "neg", "pos"], ["pos", "pos", "neg"], labels)
    assert result == {
        "examples": 3,
        "exact_match": pytest.approx(1 / 3, abs=1e-6),
        "accuracy": pytest.approx(1 / 3, abs=1e-6),
        "macro_f1": 0.25,
    }
    # "maybe" is no label: a false negative of pos only
    assert predictions.score(["maybe", "neg"], ["pos", "neg"], labels)["macro_f1"] == pytest.approx(
        (0 + 1) / 2
    )


@pytest.mark.parametrize("labels", [(), ("a", "b", "c")])
def test_shards_summed_score_as_the_whole(labels: tuple[str, ...]) -> None:
    hyps = ["a", "b", "c b", "a", "c", "b a", "a"]
    refs = ["a", "c", "c b", "b", "c", "b", "a"]
    whole = predictions.score(hyps, refs, labels)
    total = [0.0] * predictions.size(labels)
    for start in range(0, len(hyps), 3):
        total = predictions.add(
            total, predictions.statistics(hyps[start : start + 3], refs[start : start + 3], labels)
        )
    assert predictions.scores(total, labels) == whole
    with pytest.raises(ValueError, match="expected"):
        predictions.scores(total[:-1], labels)


def test_a_predictions_file_is_whole_or_absent(tmp_path: Path) -> None:
    path = tmp_path / "test" / predictions.shard_name(1)
    with pytest.raises(RuntimeError):
        with predictions.PredictionWriter(path) as writer:
            writer.write(predictions.row(3, "x", "y", "y"))
            raise RuntimeError("killed")
    assert not path.exists()
    predictions.write_predictions(
        path, [predictions.row(3, "x", "y", "y"), predictions.row(1, "u", "v", None)]
    )
    predictions.write_predictions(
        tmp_path / "test" / predictions.shard_name(0), [predictions.row(0, "p", "q", "r")]
    )
    rows = predictions.merged(tmp_path / "test")
    assert [r["id"] for r in rows] == [0, 1, 3]
    assert rows[0]["correct"] is False and "target" not in rows[1] and rows[2]["correct"] is True
    assert json.loads(path.read_text().splitlines()[0])["prediction"] == "y"
