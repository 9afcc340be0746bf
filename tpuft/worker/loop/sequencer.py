"""The run sequencer: the one place that decides what happens after a step and at the end of a run.

Why one place: a feature of the run (a metrics key, on-demand checkpoints, goodput events, keep-best, a
stop) used to be written once per backend, three times. Here every engine hands over at its step
boundaries and supplies only its acts (:class:`Acts`: evaluate, save, test, digest, export, agree); what to
do with them, and when, is decided here, as Levanter's ``Trainer`` runs every feature as a hook of one loop.

After a step (:func:`after_step`, or its two halves for a framework that reports a step before its own
evaluation: :func:`step_done` then :func:`boundary`): the metrics row on ``log_every`` (and the last step)
with the progress line, the heartbeat; on ``eval.every`` (not the last step) an evaluation, judged: an early
stop ends training there, a new best under ``keep_best`` is checkpointed at once; else a checkpoint on
``train.checkpoint_every`` (not the last step); then a checkpoint asked for on demand (``tpuft checkpoint``,
a maintenance notice, ``train.max_cost``: :mod:`tpuft.worker.ondemand`); then ``train.time_limit``.

At the end (:func:`finish`): a final evaluation (unless one has just been made, or training was cut short),
the test evaluation (``data.test``, once per run), the final checkpoint, the weight digest, the export
(chief only), the final heartbeat (``finished``).

``train.time_limit`` is this module's alone: checked on ``log_every`` boundaries (every host reaches the same
ones), on this attempt's clock (each attempt of a run, a resume included, gets the whole budget: a resume is
how a user grants more time, with ``tpuft resume --time-limit``), agreed over the hosts through the engine's
``agree`` (one small collective per ``log_every`` steps, only with a limit), so every host stops at the same
step. Training then ends there, and the end above runs as for the last step: the run is finished, and its
heartbeat says ``ended: time_limit``. The final checkpoint keeps no test row, so a resumed run tests its
later weights again.

Stdlib only at import: it runs inside every backend's venv.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from tpuft.worker import events
from tpuft.worker.loop.runloop import RunLoop
from tpuft.worker.ondemand import CheckpointRequests, serve

TIME_LIMIT = "time_limit"
"""``RunLoop.ended`` and the final heartbeat's ``ended`` when ``train.time_limit`` cut training short."""


class Acts(Protocol):
    """What an engine supplies: acts only, never a decision. Building the engine (model, optimizer, data;
    restored from ``RunLoop.resume.checkpoint`` when resuming) is its set-up, done before."""

    def progress(self) -> tuple[float, float, float]:
        """(mean loss, learning rate, input and target tokens over every replica) of the steps since the last
        call."""
        ...

    def evaluate(self) -> dict[str, Any]:
        """The held-out evaluation's metrics row (``eval_*`` keys); {} when there is nothing to evaluate."""
        ...

    def save(self, step: int) -> Path | None:
        """Checkpoint at ``step`` (``RunLoop.save_checkpoint`` does the writing); the folder on the chief."""
        ...

    def digest(self) -> str:
        """The sha256 of the trained weights, said by every replica (equal digests: identical weights)."""
        ...

    def export(self, checkpoint: Path) -> None:
        """Chief only, when ``export.hf``: ``checkpoint`` to Hugging Face format (and what goes with it)."""
        ...

    def test(self, checkpoint: Path | None) -> dict[str, Any]:
        """Every process: predict this replica's share of the test set with the weights of ``checkpoint``
        (None: those in memory), write the share to ``RunLoop.test_predictions_dir()``, sum the
        :func:`tpuft.scoring.predictions.statistics` over the replicas and return their ``scores`` (the same
        on every process). The weights in memory are as before when it returns (the final checkpoint saves
        them)."""
        ...

    def agree(self, flag: bool) -> bool:
        """Every process: whether any process's ``flag`` is set (a collective when there are several)."""
        ...


class TrainerHooks(Acts, Protocol):
    """A trainer that owns its loop (PyTorch/XLA) supplies the step itself too, to :func:`train`."""

    def start(self, step: int) -> int:
        """Right before the first step (``step``: the start step): put a resumed state in place, seed the
        RNGs. Returns how many steps the step's program takes to become steady (compilation): the heartbeat
        says ``starting`` until then."""
        ...

    def train_step(self, step: int) -> None:
        """Train one optimizer step, from ``step`` to ``step + 1``."""
        ...


def begin(loop: RunLoop, *, line: str | None = None) -> CheckpointRequests:
    """Training starts: the clocks, the line (``line``: an engine's own), and the on-demand requests to
    watch (one ``os.stat`` per boundary)."""
    total = loop.recipe.train.steps
    loop.step = loop.start_step
    loop.start_clock()
    loop.say(
        line or (f"training steps {loop.step + 1} to {total}" if loop.step else f"training for {total} steps")
    )
    return CheckpointRequests.of(loop.ctx, answers=loop.beats)


def resumed_after_stop(loop: RunLoop) -> bool:
    """The checkpoint is where an early-stopped run ended: nothing more to train."""
    if not loop.selector.stopped_early:
        return False
    loop.stopped_early = loop.selector.stopped_early
    loop.say(f"resumed after {loop.stopped_early}")
    return True


def step_done(
    loop: RunLoop, step: int, acts: Acts, *, phase: str | None = None, time_first_step: bool = True
) -> None:
    """A step (or a framework's execution of several) is done: its metrics row on ``log_every`` and the
    heartbeat. ``time_first_step``: the step has really run here (else the first row ends the start-up)."""
    loop.step = step
    if time_first_step and loop.first_step_s is None:
        loop.first_step_done()
    logged: dict[str, Any] = {}
    if loop.log_due(step):
        loss, lr, tokens = acts.progress()
        logged = loop.log_train(step, loss=loss, lr=lr, tokens=tokens)
    loop.beat(step, phase=phase or loop.phase(step), **logged)


def boundary(
    loop: RunLoop,
    step: int,
    acts: Acts,
    requests: CheckpointRequests,
    *,
    evaluation: tuple[dict[str, Any], float] | None = None,
    evaluate_when_due: bool = True,
) -> bool:
    """What follows a step: evaluation and judgement, checkpoints, requests, the time limit. ``evaluation``:
    an evaluation the framework has just made itself (its row and seconds); ``evaluate_when_due``: else ask
    ``acts.evaluate`` on the cadence. True: training ends here (an early stop, the time limit)."""
    total = loop.recipe.train.steps
    saved = False
    result: dict[str, Any] = {}
    if evaluation is not None:
        result = loop.record_eval(step, *evaluation) if evaluation[0] else {}
    elif evaluate_when_due and loop.eval_due(step):
        result = evaluate(loop, acts)
    if result:
        verdict = loop.judge(step, result)
        if verdict.stop:
            return True
        if verdict.improved and loop.recipe.train.keep_best and step < total:
            acts.save(step)  # the best so far becomes a checkpoint, whatever checkpoint_every says
            saved = True
    if not saved and loop.checkpoint_due(step):
        acts.save(step)
    serve_requests(loop, requests, step, acts.save)
    return time_up(loop, step, lambda flag: acts.agree(flag))


def after_step(loop: RunLoop, step: int, acts: Acts, requests: CheckpointRequests) -> bool:
    """:func:`step_done` then :func:`boundary`: True when training ends here."""
    step_done(loop, step, acts)
    return boundary(loop, step, acts, requests)


def serve_requests(
    loop: RunLoop, requests: CheckpointRequests, step: int, save: Callable[[int], Any]
) -> None:
    """A checkpoint asked for on demand and due at this boundary, saved through the engine's ``save``."""
    serve(
        requests,
        step,
        lambda at: loop.save_asked(save, at),
        loop.say,
        lambda at: loop.beat(at, phase="checkpoint"),
    )


def time_up(loop: RunLoop, step: int, agree: Callable[[bool], bool], *, due: bool | None = None) -> bool:
    """``train.time_limit``: True (every host the same) when this attempt's training has run that long, on a
    ``log_every`` boundary before the last step (``due``: a framework's own boundary instead)."""
    limit = getattr(loop.recipe.train, "time_limit", None)  # a recipe made before the key: none
    if limit is None or step >= loop.recipe.train.steps or loop.attempt_started is None:
        return False
    if not (loop.log_due(step) if due is None else due):
        return False
    spent = time.time() - loop.attempt_started
    if not agree(spent >= limit):
        return False
    loop.ended = TIME_LIMIT
    loop.say(
        f"train.time_limit reached ({limit:.0f} s) at step {step}: saving, testing and exporting now "
        "(tpuft resume RUN --time-limit ... continues)"
    )
    return True


def evaluate(loop: RunLoop, acts: Acts) -> dict[str, Any]:
    """One evaluation in the ``eval`` phase, recorded (row and line) when there was something to evaluate."""
    if not loop.has_eval:
        return {}
    loop.beat(loop.step, phase="eval")
    started = time.time()
    result = acts.evaluate()
    return loop.record_eval(loop.step, result, time.time() - started) if result else result


def train(loop: RunLoop, hooks: TrainerHooks) -> None:
    """The loop of a trainer that owns it (PyTorch/XLA): its steps, each followed by :func:`after_step`."""
    requests = begin(loop)
    loop.warm_at = loop.step + hooks.start(loop.step)
    if resumed_after_stop(loop):
        return
    while loop.step < loop.recipe.train.steps:
        hooks.train_step(loop.step)
        if after_step(loop, loop.step + 1, hooks, requests):
            break


def finish(
    loop: RunLoop, acts: Acts, *, say_export_source: bool = False, settle: Callable[[], None] | None = None
) -> None:
    """The end of a run: the final evaluation (unless one was made at this step, an early stop's, or training
    was cut short), the test evaluation, the final checkpoint (no periodic one is made at the last step), the
    weight digest, the export, the final heartbeat. ``say_export_source``: say which checkpoint is exported
    even when it is the last; ``settle``: every process, after the export and before the final heartbeat (a
    barrier where a peer's exit would abort the chief)."""
    if loop.stopped_early is None and loop.ended is None and loop.last_eval_step != loop.step:
        result = evaluate(loop, acts)
        if result:
            loop.judge(loop.step, result)  # for the best to export; training is over either way
        loop.last_eval = result
    if loop.test_due():
        run_test(loop, acts.test)
    checkpoint = acts.save(loop.step)
    digest = acts.digest()
    if loop.chief and loop.recipe.export.hf and checkpoint is not None:
        export(loop, lambda: acts.export(loop.export_source(checkpoint, say_when_last=say_export_source)))
    if settle is not None:
        settle()
    loop.finished(loop.step, params_sha256=digest)


def end(loop: RunLoop, step: int, **extra: Any) -> None:
    """The final heartbeat of an engine that ends its run itself (T5X: its own final save and evaluation),
    once its test and export are done."""
    loop.finished(step, **extra)


def export(loop: RunLoop, act: Callable[[], Any]) -> Any:
    """The export in the ``export`` phase, timed as the run's ``export`` event."""
    loop.beat(loop.step, phase="export")
    started = time.time()
    done = act()
    events.record("export", started, time.time() - started, step=loop.step)
    return done


def run_test(loop: RunLoop, test: Callable[[Path | None], dict[str, Any]]) -> dict[str, Any]:
    """The test evaluation in the ``eval`` phase: ``test(folder)`` on what :meth:`RunLoop.test_checkpoint`
    picks, recorded."""
    step, folder = loop.test_checkpoint()
    what = f"the best checkpoint, step {step}" if folder is not None else "the final weights"
    return test_at(
        loop, step, lambda: test(folder), label=f"{what} on {loop.recipe.data.test or 'the test split'}"
    )


def test_at(loop: RunLoop, step: int, test: Callable[[], dict[str, Any]], *, label: str) -> dict[str, Any]:
    """The test evaluation of the checkpoint at ``step``, said (``testing <label>``), timed and recorded (an
    engine that picks its checkpoint itself, T5X, comes here directly)."""
    loop.beat(loop.step, phase="eval")
    loop.say(f"testing {label}")
    started = time.time()
    result = test()
    return loop.record_test(result, time.time() - started, step)


def run(loop: RunLoop, hooks: TrainerHooks) -> None:
    """:func:`train`, then :func:`finish`."""
    train(loop, hooks)
    finish(loop, hooks)
