"""The shared best-so-far and early-stopping logic (tpuft.worker.selection) on constructed metric
sequences."""

from __future__ import annotations

import json
import math

import pytest

from tpuft.config import EarlyStopping
from tpuft.run import rundir
from tpuft.worker.selection import MissingMetric, Selector, Verdict, metric_key, ranked, score


def stopping(patience: int, min_delta: float = 0.0) -> EarlyStopping:
    return EarlyStopping(patience=patience, min_delta=min_delta)


def match(value: float, loss: float = 1.0) -> dict[str, float]:
    return {"eval_exact_match": value, "eval_token_accuracy": 0.5, "eval_loss": loss, "eval_examples": 8}


def loss(value: float) -> dict[str, float]:
    return {"eval_loss": value, "eval_token_accuracy": 0.5, "eval_exact_match": 0.1}


def run(selector: Selector, results: list[dict], every: int = 10) -> list[Verdict]:
    """Judge the results at steps every, 2*every, ... until a stop (as a trainer does); the verdicts."""
    verdicts = []
    for i, result in enumerate(results, start=1):
        verdicts.append(selector.judge(i * every, result))
        if verdicts[-1].stop:
            break
    return verdicts


def stop_index(verdicts: list[Verdict]) -> int | None:
    """1-based index of the evaluation that stopped, or None."""
    return len(verdicts) if verdicts and verdicts[-1].stop else None


# -- early stopping stops at exactly the expected evaluation -----------------------------------------------
@pytest.mark.parametrize(
    ("patience", "values", "expected_stop"),
    [
        (1, [0.1, 0.2, 0.2], 3),  # a tie is no improvement
        (1, [0.1, 0.2, 0.3, 0.25], 4),
        (2, [0.1, 0.2, 0.1, 0.3, 0.2, 0.1], 6),  # the counter restarts at 0.3
        (2, [0.1, 0.05, 0.2, 0.15, 0.3], None),
        (3, [0.5, 0.4, 0.4, 0.6, 0.5, 0.5, 0.5, 0.9], 7),
        (3, [0.5, 0.4, 0.3], None),  # only two bad evaluations before the end
        (3, [0.5, 0.4, 0.3, 0.2], 4),
    ],
)
def test_exact_match_stops_at_the_expected_evaluation(
    patience: int, values: list[float], expected_stop: int | None
) -> None:
    verdicts = run(Selector(None, stopping(patience)), [match(v) for v in values])
    assert stop_index(verdicts) == expected_stop


@pytest.mark.parametrize(
    ("patience", "values", "expected_stop"),
    [
        (1, [2.0, 1.5, 1.6], 3),
        (1, [2.0, 1.5, 1.5], 3),  # a tie
        (2, [2.0, 1.5, 1.6, 1.4, 1.45, 1.41], 6),
        (2, [2.0, 2.5, 1.9, 3.0, 1.0], None),
        (3, [2.0, 2.1, 2.2, 2.3], 4),
    ],
)
def test_loss_is_better_lower(patience: int, values: list[float], expected_stop: int | None) -> None:
    verdicts = run(Selector("loss", stopping(patience)), [loss(v) for v in values])
    assert stop_index(verdicts) == expected_stop


def test_min_delta_in_the_metrics_direction() -> None:
    # exact match (max): +0.04 is not more than 0.05; +0.06 is
    selector = Selector(None, stopping(2, min_delta=0.05))
    assert [v.improved for v in run(selector, [match(x) for x in (0.50, 0.54, 0.56, 0.60, 0.605)])] == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert selector.best == {"metric": "eval_exact_match", "value": 0.56, "step": 30}
    assert selector.bad_evals == 2 and selector.stopped_early is not None
    # loss (min): 1.0 -> 0.95 is not enough with 0.1, 0.85 is; a worse loss never is
    selector = Selector("loss", stopping(5, min_delta=0.1))
    assert [v.improved for v in run(selector, [loss(x) for x in (1.0, 0.95, 1.5, 0.85, 0.80, 0.74)])] == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert selector.best == {"metric": "eval_loss", "value": 0.74, "step": 60}
    # exactly min_delta better (binary-exact numbers) is not more than min_delta
    exact = Selector(None, stopping(3, min_delta=0.25))
    assert [v.improved for v in run(exact, [match(x) for x in (1.0, 1.25, 1.5, 1.75, 1.703125)])] == [
        True,
        False,
        True,
        False,
        False,
    ]
    exact_loss = Selector("loss", stopping(3, min_delta=0.25))
    assert [v.improved for v in run(exact_loss, [loss(x) for x in (2.0, 1.75, 1.5, 1.25, 1.0)])] == [
        True,
        False,
        True,
        False,
        True,
    ]


def test_the_best_step_is_tracked_and_the_reason_says_it() -> None:
    selector = Selector(None, stopping(2))
    verdicts = run(selector, [match(x) for x in (0.1, 0.3, 0.2, 0.25)], every=50)
    assert [v.improved for v in verdicts] == [True, True, False, False]
    assert selector.best == {"metric": "eval_exact_match", "value": 0.3, "step": 100}
    assert verdicts[-1].reason == (
        "early stopping at step 200: eval_exact_match has not improved on 0.3000 (step 100) for 2 evaluations"
    )
    assert selector.stopped_early == verdicts[-1].reason
    assert all(v.reason is None for v in verdicts[:-1])


def test_without_early_stopping_it_only_tracks_the_best() -> None:
    selector = Selector(None, None)
    verdicts = run(selector, [match(x) for x in (0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3)])
    assert not any(v.stop for v in verdicts) and len(verdicts) == 7
    assert selector.best is not None and selector.best["step"] == 70 and selector.bad_evals == 0
    tie = Selector(None, None)
    assert [v.improved for v in run(tie, [match(0.5), match(0.5)])] == [True, False]  # a tie keeps the first


def test_default_ranking_follows_best_metrics() -> None:
    assert rundir.BEST_METRICS[-2:] == (("eval_bleu", max), ("eval_rouge_l", max))
    assert [name for name, _ in rundir.BEST_METRICS[:4]] == [
        "eval_exact_match",
        "eval_accuracy",
        "eval_token_accuracy",
        "eval_loss",
    ]
    assert ranked({"eval_loss": 1.0, "eval_exact_match": 0.2}) == ("eval_exact_match", 0.2)
    assert ranked({"eval_loss": 1.0, "eval_accuracy": 0.7}) == ("eval_accuracy", 0.7)
    assert ranked({"eval_loss": 1.0, "eval_token_accuracy": 0.4}) == ("eval_token_accuracy", 0.4)
    assert ranked({"eval_loss": 1.5, "eval_bleu": 20.0}) == ("eval_loss", 1.5)
    assert ranked({"eval_bleu": 20.0, "eval_rouge_l": 30.0}) == ("eval_bleu", 20.0)
    assert ranked({"loss": 1.0, "eval_examples": 3}) is None
    assert score({"eval_loss": 2.0}) == -2.0 and score({"eval_exact_match": 0.5}) == 0.5
    assert score({"eval_loss": 2.0, "eval_bleu": 30.0}, "bleu") == 30.0
    assert score({"loss": 1.0}) is None


def test_explicit_metric_overrides_the_default_ranking() -> None:
    selector = Selector("bleu", stopping(1))
    # exact match up, BLEU down
    results = [
        {**match(0.5), "eval_bleu": 10.0},
        {**match(0.9), "eval_bleu": 9.0},
    ]
    verdicts = run(selector, results)
    assert [v.improved for v in verdicts] == [True, False] and verdicts[-1].stop
    assert selector.best == {"metric": "eval_bleu", "value": 10.0, "step": 10}
    assert "eval_bleu has not improved on 10.0000" in (verdicts[-1].reason or "")
    assert metric_key("rouge_l") == "eval_rouge_l" and metric_key("eval_loss") == "eval_loss"
    assert metric_key(None) is None


def test_explicit_metric_missing_is_an_error() -> None:
    with pytest.raises(
        MissingMetric,
        match=r"eval\.metric is bleu, but the evaluation has no eval_bleu .*"
        r"generate_examples",
    ):
        Selector("bleu", stopping(2)).judge(10, match(0.5))
    with pytest.raises(
        MissingMetric, match="eval.metric is accuracy, but the evaluation has no eval_accuracy"
    ):
        Selector("accuracy", None).judge(10, match(0.5))
    with pytest.raises(MissingMetric, match="no ranking metric"):
        Selector("loss", None).judge(10, {"eval_examples": 3})
    with pytest.raises(Exception, match="unknown eval.metric"):
        Selector("f1", None)


def test_no_evaluation_changes_nothing() -> None:
    selector = Selector("bleu", stopping(1))
    assert selector.judge(10, {}) == Verdict(False, False, None)
    default = Selector(None, stopping(1))
    assert default.judge(10, {"eval_examples": 0}) == Verdict(False, False, None)
    assert default.state() == {"best": None, "bad_evals": 0, "stopped_early": None}


def test_nan_never_improves() -> None:
    selector = Selector(None, stopping(2))
    verdicts = run(selector, [match(math.nan), match(0.2), match(math.nan), match(0.1)])
    assert [v.improved for v in verdicts] == [False, True, False, False] and verdicts[-1].stop
    assert selector.best == {"metric": "eval_exact_match", "value": 0.2, "step": 20}
    only_nans = Selector("loss", stopping(2))
    verdicts = run(only_nans, [loss(math.nan)] * 3)
    assert len(verdicts) == 2 and verdicts[-1].stop and "no usable value" in (verdicts[-1].reason or "")


# -- state round trip --------------------------------------------------------------------------------------
SEQUENCES = [
    (None, 3, 0.0, [match(x) for x in (0.1, 0.2, 0.15, 0.18, 0.3, 0.29, 0.3, 0.28, 0.31)]),
    ("loss", 2, 0.05, [loss(x) for x in (3.0, 2.0, 1.98, 1.9, 1.96, 2.5, 1.7)]),
    ("bleu", 1, 0.5, [{"eval_loss": 1.0, "eval_bleu": x} for x in (10.0, 12.0, 12.4, 13.0, 12.0)]),
]


@pytest.mark.parametrize(("metric", "patience", "delta", "results"), SEQUENCES)
def test_state_round_trip_gives_the_same_decisions(
    metric: str | None, patience: int, delta: float, results: list[dict]
) -> None:
    whole = Selector(metric, stopping(patience, delta))
    expected = run(whole, results)
    assert any(not v.improved for v in expected)
    for cut in range(
        len(expected)
    ):  # a checkpoint after `cut` evaluations (none of them a stop), then a resume
        first = Selector(metric, stopping(patience, delta))
        got = run(first, results[:cut])
        # trainer_state.json
        saved = json.loads(json.dumps({"step": cut * 10, "run_id": "x", **first.state()}))
        resumed = Selector(metric, stopping(patience, delta), saved)
        assert resumed.state() == first.state()
        got += [resumed.judge(i * 10, r) for i, r in enumerate(results[cut : len(expected)], start=cut + 1)]
        assert got == expected, cut
        assert resumed.state() == whole.state(), cut


def test_round_trip_mid_sequence_stops_at_the_same_evaluation() -> None:
    results = [match(x) for x in (0.4, 0.5, 0.45, 0.3, 0.2)]
    first = Selector(None, stopping(3))
    run(first, results[:3])  # one bad evaluation, then a checkpoint and a crash
    resumed = Selector(None, stopping(3), first.state())
    assert resumed.bad_evals == 1 and resumed.best == {"metric": "eval_exact_match", "value": 0.5, "step": 20}
    assert resumed.judge(40, results[3]).stop is False
    verdict = resumed.judge(50, results[4])
    assert verdict.stop and verdict.reason == (
        "early stopping at step 50: eval_exact_match has not improved on 0.5000 (step 20) for 3 evaluations"
    )
    assert resumed.state() == {
        "best": {"metric": "eval_exact_match", "value": 0.5, "step": 20},
        "bad_evals": 3,
        "stopped_early": verdict.reason,
    }


def test_legacy_keras_state_is_accepted() -> None:
    """A Keras checkpoint from before the shared selector: its trainer_state has best and bad_evals only."""
    legacy = {
        "step": 300,
        "run_id": "r",
        "recipe": "t",
        "backend": "keras",
        "tokenizer": "t5-small",
        "time": 1.0,
        "elapsed_s": 5.0,
        "replicas": 2,
        "best": {"metric": "eval_exact_match", "value": 0.25, "step": 200},
        "bad_evals": 1,
    }
    selector = Selector(None, stopping(2), legacy)
    assert selector.best == {"metric": "eval_exact_match", "value": 0.25, "step": 200}
    assert selector.bad_evals == 1 and selector.stopped_early is None
    verdict = selector.judge(400, match(0.25))
    assert verdict.stop and "has not improved on 0.2500 (step 200) for 2 evaluations" in (
        verdict.reason or ""
    )
    # older still: no best at all, or an explicit null
    assert Selector(None, stopping(2), {"step": 5}).state() == {
        "best": None,
        "bad_evals": 0,
        "stopped_early": None,
    }
    assert Selector(None, None, {"best": None, "bad_evals": 0}).best is None
    assert Selector(None, None, None).best is None
    with pytest.raises(ValueError, match="trainer state's best"):
        Selector(None, None, {"best": {"value": 1.0}})


def test_a_best_in_another_metric_is_replaced() -> None:
    selector = Selector(
        "loss",
        stopping(2),
        {"best": {"metric": "eval_exact_match", "value": 0.9, "step": 10}, "bad_evals": 1},
    )
    verdict = selector.judge(20, loss(5.0))
    assert verdict.improved and selector.best == {"metric": "eval_loss", "value": 5.0, "step": 20}
    assert selector.bad_evals == 0
