"""Best-so-far and early stopping from a run's evaluations: one implementation for every backend's trainer.

Which number ranks an evaluation is ``eval.metric`` (``exact_match``, ``accuracy``, ``token_accuracy``,
``loss``, ``bleu``, ``rouge_l``: the result key ``eval_<metric>``) or, when the recipe leaves it unset, the
first of ``rundir.BEST_METRICS`` the evaluation has (exact match, else accuracy, else token accuracy, else the
loss: the ranking monitor, runs and pull use too). ``rundir.BEST_METRICS`` also says which way is better (the
loss: lower).

An evaluation improves on the best so far when it is better by more than ``train.early_stopping.min_delta`` (0
without early stopping): a tie is not an improvement, and neither is a NaN. ``patience`` evaluations in a row
without an improvement stop training. :meth:`Selector.state` is what a checkpoint's ``trainer_state.json``
keeps (``best``, ``bad_evals``, ``stopped_early``) so that a resumed run judges its next evaluations as the
original would have; the Keras trainer's checkpoints from before this module (``best`` and ``bad_evals`` only)
read the same.

Stdlib only (and ``tpuft.run.rundir``, ``tpuft.core.errors``): it runs inside every backend's venv.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuft.core.errors import UsageError
from tpuft.run import rundir

if TYPE_CHECKING:
    from tpuft.config import EarlyStopping

METRICS = ("exact_match", "accuracy", "token_accuracy", "loss", "bleu", "rouge_l")
"""The values of ``eval.metric``; the result key of each is ``eval_<metric>``."""

_DIRECTION = dict(rundir.BEST_METRICS)


class MissingMetric(UsageError):
    """``eval.metric`` names a metric this evaluation did not produce (BLEU without decodes, accuracy of a
    text-to-text task, ...)."""


def metric_key(metric: str | None) -> str | None:
    """The result key ranking evaluations for ``eval.metric`` (``"bleu"`` -> ``"eval_bleu"``; the key itself
    is accepted too); None for the default ranking."""
    if metric is None:
        return None
    key = metric if metric.startswith("eval_") else f"eval_{metric}"
    if key not in _DIRECTION:
        raise UsageError(f"unknown eval.metric {metric!r}: one of {', '.join(METRICS)}")
    return key


def higher_is_better(key: str) -> bool:
    """Whether a larger value of this result key is better (every ranking metric but the loss)."""
    return _DIRECTION[key] is max


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def ranked(result: Mapping[str, Any], metric: str | None = None) -> tuple[str, float] | None:
    """The (result key, value) that ranks this evaluation: ``eval.metric``'s, or the first of
    ``rundir.BEST_METRICS`` present. None when the default ranking finds none of them; an explicit metric that
    the result lacks raises :class:`MissingMetric`."""
    key = metric_key(metric)
    if key is None:
        for name, _ in rundir.BEST_METRICS:
            if _number(result.get(name)):
                return name, float(result[name])
        return None
    if not _number(result.get(key)):
        have = sorted(k for k, v in result.items() if k in _DIRECTION and _number(v))
        hint = (
            " BLEU and ROUGE-L are scored on greedy decodes: they need eval.generate_examples > 0 and "
            "a held-out set."
            if key in ("eval_bleu", "eval_rouge_l")
            else ""
        )
        raise MissingMetric(
            f"eval.metric is {key.removeprefix('eval_')}, but the evaluation has no {key} (it has "
            f"{', '.join(have) or 'no ranking metric'}).{hint}"
        )
    return key, float(result[key])


def score(result: Mapping[str, Any], metric: str | None = None) -> float | None:
    """The ranking value of :func:`ranked`, negated where lower is better: higher is always better."""
    found = ranked(result, metric)
    if found is None:
        return None
    key, value = found
    return value if higher_is_better(key) else -value


@dataclass(frozen=True)
class Verdict:
    """What one evaluation means: ``improved`` (the best so far: keep its checkpoint), ``stop`` (early
    stopping says stop now) with its ``reason`` (a sentence for the log and the heartbeat's
    ``stopped_early``)."""

    improved: bool
    stop: bool
    reason: str | None = None


class Selector:
    """Best-so-far and early stopping over a run's evaluations.

    ``metric``: ``eval.metric`` (None: the default ranking). ``early_stopping``: ``train.early_stopping`` (an
    object with ``patience`` and ``min_delta``; None: never stop, and any strict improvement counts).
    ``state``: what :meth:`state` returned, as read back from a checkpoint's ``trainer_state.json`` (the whole
    file's dict is fine: other keys are ignored; a missing key means a fresh start for it).

    Every replica judges the same (all-reduced) numbers, so they all stop at the same evaluation.
    """

    def __init__(
        self, metric: str | None, early_stopping: EarlyStopping | None, state: Mapping[str, Any] | None = None
    ) -> None:
        self.metric = metric_key(metric)
        self.patience: int | None = int(early_stopping.patience) if early_stopping is not None else None
        self.min_delta = float(early_stopping.min_delta) if early_stopping is not None else 0.0
        state = state or {}
        self.best: dict[str, Any] | None = _best(state.get("best"))
        """``{"metric", "value", "step"}`` of the best evaluation so far, or None."""
        self.bad_evals = int(state.get("bad_evals") or 0)
        """Evaluations in a row since the best without an improvement."""
        stopped = state.get("stopped_early")
        self.stopped_early: str | None = str(stopped) if stopped else None
        """The reason of the last stop verdict: training ended early (kept in the checkpoint)."""

    def judge(self, step: int, result: Mapping[str, Any]) -> Verdict:
        """Judge the evaluation at ``step``. An empty result (no evaluation) and, with the default ranking,
        one without any ranking metric change nothing; with an explicit ``eval.metric`` a result without it
        raises
        :class:`MissingMetric`. A best in another metric (an older checkpoint) cannot be compared: this
        evaluation replaces it."""
        if not result:
            return Verdict(False, False)
        found = ranked(result, self.metric)
        if found is None:
            return Verdict(False, False)
        name, value = found
        if self._improves(name, value):
            self.best = {"metric": name, "value": value, "step": int(step)}
            self.bad_evals = 0
            return Verdict(True, False)
        self.bad_evals += 1
        if self.patience is None or self.bad_evals < self.patience:
            return Verdict(False, False)
        best = self.best
        if best is None:  # only NaNs so far
            reason = (
                f"early stopping at step {step}: {name} has had no usable value for {self.bad_evals} "
                "evaluations"
            )
        else:
            reason = (
                f"early stopping at step {step}: {name} has not improved on {best['value']:.4f} "
                f"(step {best['step']}) for {self.bad_evals} evaluations"
            )
        self.stopped_early = reason
        return Verdict(False, True, reason)

    def _improves(self, name: str, value: float) -> bool:
        if math.isnan(value):
            return False
        best = self.best
        if best is None or best["metric"] != name or math.isnan(best["value"]):
            return True
        ahead = value >= best["value"] if higher_is_better(name) else value <= best["value"]
        return ahead and abs(value - best["value"]) > self.min_delta

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): ``{"best": {"metric", "value", "step"} | None, "bad_evals": int,
        "stopped_early": str | None}``; a Selector made with it judges the next evaluations the same."""
        return {
            "best": dict(self.best) if self.best else None,
            "bad_evals": self.bad_evals,
            "stopped_early": self.stopped_early,
        }


def _best(best: Any) -> dict[str, Any] | None:
    if best is None:
        return None
    if not isinstance(best, Mapping) or not {"metric", "value", "step"} <= set(best):
        raise ValueError(f"a trainer state's best is {{'metric', 'value', 'step'}} or null, not {best!r}")
    return {"metric": str(best["metric"]), "value": float(best["value"]), "step": int(best["step"])}
