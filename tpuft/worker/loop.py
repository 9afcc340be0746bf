"""The run skeleton every backend's trainer shares, written once: what a run writes and says around its steps.

A trainer owns its engine (model, optimizer, data, collectives); this module owns the bookkeeping around it,
so that a feature of the run (a metrics key, a heartbeat phase, keep-best, early stopping) is written here and
not once per backend. Two ways to use it, one logic:

* **Events** (:class:`RunLoop`), for a loop a framework drives (Keras ``fit`` calls its callback, T5X its
  hooks). The trainer makes one ``RunLoop`` at start-up and calls, as things happen:

  - ``find_checkpoint()`` then ``load_checkpoint()``: resume bookkeeping (``TPUFT_RESUME``): the start
    step, the checkpoint folder to restore from and its ``trainer_state.json``, the metrics writer (rows after
    the checkpoint forgotten) and the :class:`~tpuft.worker.selection.Selector` restored from that state. A
    trainer that finds its checkpoint its own way (T5X) calls ``open_metrics(restart_at)`` and sets
    ``start_step`` itself.
  - ``start_clock()`` as training starts (the run's clock goes on from the checkpoint's ``elapsed_s``);
  - ``log_due(step)`` / ``log_train(step, loss=, lr=, tokens=)``: the metrics row (``loss lr examples_per_s
    tokens_per_s elapsed_s`` [``first_step_s``]) and the ``step N/total loss ... tok/s`` line; rates are over
    the steps since the last row; a framework that measures its own rates passes
    ``examples_per_s``/``tokens_per_s``. Returns what the next heartbeat repeats;
  - ``beat(step, phase=...)``: the heartbeat (``starting``, ``collective``, ``step``, ``eval``,
    ``checkpoint``, ``export``: :data:`tpuft.worker.metrics.PATIENT_PHASES` get the supervisor's longer hang
    timeout);
  - ``eval_due(step)`` / ``record_eval(step, result, seconds)`` / ``judge(step, result)``: the eval row and
    line, then keep-best and early stopping (a stop sets ``stopped_early`` and says why);
  - ``checkpoint_due(step)`` / ``save_checkpoint(step, write, ...)``: a checkpoint folder written through a
    temp dir, its ``trainer_state.json`` and manifest, then pruning to the last ``train.keep_checkpoints`` and
    the best (``train.keep_best``);
  - ``test_due()`` / ``test_checkpoint()`` / ``record_test(result, seconds, checkpoint_step)``: the test
    evaluation (``data.test``) once at the end, before the final checkpoint, on the best checkpoint under
    ``keep_best`` (else the weights in memory, the last); its ``test_*`` row and line. The result goes into
    the final checkpoint's ``trainer_state.json`` (``test``), so a run resumed from that checkpoint does not
    test again: exactly one test row per run;
  - ``export_source(checkpoint)``: the checkpoint to export (the best one under ``keep_best``);
  - ``finished(step, **extra)``: the final heartbeat (status ``finished``, the last eval's numbers, the early
    stop).

* **A driver** (:func:`train`, :func:`finish`, or :func:`run` for both), for a trainer that owns its loop
  (PyTorch/XLA): it calls the events above in the order every backend keeps, and the trainer's
  :class:`TrainerHooks` for the work: ``start`` (put the restored state in place, seed), ``train_step``,
  ``progress`` (the window's loss, lr, tokens), ``evaluate``, ``save`` (which writes through
  ``RunLoop.save_checkpoint``), ``digest``, ``export``. Building the engine and restoring it from
  ``RunLoop.resume.checkpoint`` is the trainer's set-up, before the driver runs.

The order of one step (the driver's, and what a framework adapter should keep): the step; its metrics row on
``log_every`` (and the last step); the heartbeat; on ``eval.every`` (not the last step) an evaluation, judged:
an early stop ends training there, a new best under ``keep_best`` is checkpointed at once; else a checkpoint
on ``train.checkpoint_every`` (not the last step). The end: a final evaluation (unless an early stop has just
evaluated), the test evaluation (``data.test``, once per run), the final checkpoint, the weight digest, the
export (chief only), the final heartbeat.

Stop and hang signals are the heartbeat: the worker's supervisor (``tpuft/worker/supervisor/process.py``)
declares a trainer hung when its heartbeat is older than the hang timeout for its phase, and stops it with
SIGTERM.

Stdlib only at import (plus tpuft's worker modules): it runs inside every backend's venv.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tpuft.run import rundir
from tpuft.scoring.predictions import prefixed
from tpuft.worker import events
from tpuft.worker.metrics import Heartbeat, MetricsWriter
from tpuft.worker.ondemand import CheckpointRequests, serve
from tpuft.worker.resume import (
    TRAINER_STATE,
    ResumePoint,
    find_resume_checkpoint,
    load_resume_point,
    open_metrics,
)
from tpuft.worker.resume import resuming as resume_requested
from tpuft.worker.selection import Selector, Verdict

if TYPE_CHECKING:
    from tpuft.backends.spec import RunLayout
    from tpuft.config import RecipeConfig
    from tpuft.worker.context import WorkerContext

TEST_STATE = "test"
"""The key of the test row in a checkpoint's ``trainer_state.json``."""

HEARTBEAT_KEYS = ("loss", "lr", "examples_per_s", "tokens_per_s")
"""What a heartbeat repeats of the latest metrics row (``monitor`` shows them per worker)."""


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


class RunLoop:
    """One run's bookkeeping: the events a trainer calls (see the module docstring for the order).

    ``layout``: where the backend's checkpoints go (its ``RunLayout``). ``chief``: this process writes the
    run's files (metrics, checkpoints, the export) and speaks for the run in the log. ``beats``: this process
    writes its worker's heartbeat (one process per host does: on a TPU host with a process per chip, the
    first). The set-up may learn who is chief late: ``chief`` can be set until ``load_checkpoint``."""

    def __init__(
        self,
        ctx: WorkerContext,
        recipe: RecipeConfig,
        layout: RunLayout,
        *,
        chief: bool,
        beats: bool = True,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.ctx, self.recipe, self.layout = ctx, recipe, layout
        self.chief, self.beats = chief, beats
        self.heartbeat = heartbeat or Heartbeat(ctx.run_dir, ctx.worker_id, recipe.train.steps)
        self.resuming = resume_requested()
        self.setup_started = time.time()
        self.run_started = self.setup_started
        """Start of training, moved back by the checkpoint's ``elapsed_s`` (``start_clock``)."""
        self.step = 0
        self.start_step = 0
        self.warm_at = 1
        """The first step from which the heartbeat says ``step`` (before it: ``starting``, a compiler's
        warm-up)."""
        self.resume = ResumePoint()
        self.metrics: MetricsWriter | None = None
        self.selector = Selector(recipe.eval.metric, recipe.train.early_stopping)
        self.has_eval = False
        """Set by the trainer once its data is set up: there is a held-out set to evaluate on."""
        self.last_eval: dict[str, Any] = {}
        self.has_test = False
        """Set by the trainer once its data is set up: there is a test set (``data.test``) to evaluate at the
        end."""
        self.test_result: dict[str, Any] = {}
        """The test row (``test_*``); restored from the checkpoint a run resumes from, so it is made once."""
        self.stopped_early: str | None = None
        self.saved_steps: set[int] = set()
        self.first_step_s: float | None = None
        self._first_step_logged = False
        self._found: tuple[int, str] | None = None
        self._window_step = 0
        self._window_time = time.time()
        self.data_wait_s = 0.0
        """Time the trainer waited for its next batch since the last metrics row (a backend that can tell adds
        to it): the ``steps`` event's ``data_wait_s``."""
        self._startup_recorded = False
        self._asked = False
        """A save under way was asked for on demand (``tpuft checkpoint``): its event's reason is
        ``request``."""

    # -- output ---------------------------------------------------------------------------------------------
    def say(self, message: str, *, everyone: bool = False) -> None:
        if everyone or self.chief:
            print(f"[tpuft] {message}", flush=True)

    def beat(self, step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        if self.beats:
            self.heartbeat.beat(step, status, phase, **extra)

    def phase(self, step: int) -> str:
        """``starting`` until the step's graph is compiled and steady (``warm_at``), then ``step``."""
        return "step" if step >= self.warm_at else "starting"

    # -- resume ---------------------------------------------------------------------------------------------
    def find_checkpoint(self) -> int:
        """The step this run starts at: its latest complete checkpoint's when resuming, else 0."""
        self._found = find_resume_checkpoint(self.ctx, self.layout) if self.resuming else None
        self.start_step = self.step = self._found[0] if self._found else 0
        self.warm_at = self.start_step + 1
        return self.start_step

    def load_checkpoint(self) -> ResumePoint:
        """Fetch what ``find_checkpoint`` found (said either way), open the metrics and restore the
        selector."""
        events.open_for(self.ctx.run_dir, self.ctx.worker_id, chief=self.chief)
        started = time.time()
        self.resume = load_resume_point(self.ctx, self.layout, self._found, self.recipe.train.steps, self.say)
        if self._found is not None:
            events.record("checkpoint_restore", started, time.time() - started, step=self.start_step)
        self.open_metrics(self.start_step if self.resuming else None)
        self.selector = Selector(self.recipe.eval.metric, self.recipe.train.early_stopping, self.resume.state)
        self.test_result = dict(self.resume.state.get(TEST_STATE) or {})
        return self.resume

    def open_metrics(self, restart_at: int | None) -> MetricsWriter:
        self.metrics = open_metrics(self.ctx, chief=self.chief, restart_at=restart_at)
        if not events.recording():
            events.open_for(self.ctx.run_dir, self.ctx.worker_id, chief=self.chief)
        return self.metrics

    @property
    def trainer_state(self) -> dict[str, Any]:
        """The resumed checkpoint's ``trainer_state.json`` ({} for a fresh start)."""
        return self.resume.state

    def start_clock(self) -> None:
        """Training starts: the run's clock goes on from the checkpoint's, and the first rates window
        opens."""
        self.run_started = time.time() - float(self.trainer_state.get("elapsed_s", 0.0))
        self._window_step, self._window_time = self.step, time.time()

    # -- steps ----------------------------------------------------------------------------------------------
    def first_step_done(self) -> None:
        """Time to the first step, compilation and all (as a user waits): said once, and in the next metrics
        row. The caller makes sure the step has really run (a device step may still be queued)."""
        if self.first_step_s is None:
            self.first_step_s = round(time.time() - self.setup_started, 2)
            self.say(f"first step done {self.first_step_s:.1f}s after start-up (model, data, compilation)")
            self._record_startup()

    def _record_startup(self) -> None:
        """The ``startup`` event: from the process's start to the first step done, compilation included (a
        backend that does not call ``first_step_done`` ends it with its first metrics row, whose steps include
        the compile)."""
        if not self._startup_recorded:
            self._startup_recorded = True
            started = events.process_started()
            external = events.external_recorder()
            events.record(
                "startup",
                started,
                time.time() - started,
                step=self.start_step,
                **({"external_goodput": external} if external else {}),
            )

    def log_due(self, step: int) -> bool:
        train = self.recipe.train
        return step % train.log_every == 0 or step == train.steps

    def log_train(
        self,
        step: int,
        *,
        loss: float,
        lr: float,
        tokens: float = 0.0,
        examples_per_s: float | None = None,
        tokens_per_s: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The training metrics row of the steps since the last one, and the progress line. ``loss``: their
        mean; ``tokens``: the input and target tokens they took, over every replica; ``extra``: more keys for
        the row. Returns what the heartbeat repeats (:data:`HEARTBEAT_KEYS`)."""
        train = self.recipe.train
        elapsed = max(time.time() - self._window_time, 1e-9)
        if examples_per_s is None:
            examples_per_s = round((step - self._window_step) * train.batch_size / elapsed, 2)
        if tokens_per_s is None:
            tokens_per_s = round(tokens / elapsed, 1)
        row: dict[str, Any] = {
            "loss": round(loss, 6),
            "lr": lr,
            "examples_per_s": examples_per_s,
            "tokens_per_s": tokens_per_s,
            "elapsed_s": round(time.time() - self.run_started, 1),
            **(extra or {}),
        }
        if self.first_step_s is not None and not self._first_step_logged:
            row["first_step_s"] = self.first_step_s
            self._first_step_logged = True
        self._log(step, row)
        self.say(progress_line(step, train.steps, loss, lr, row["examples_per_s"], row["tokens_per_s"]))
        self._record_window(step)
        self._window_step, self._window_time = step, time.time()
        return {key: row[key] for key in HEARTBEAT_KEYS}

    def _record_window(self, step: int) -> None:
        """One ``steps`` event per metrics row (not per step: the cost is one line per ``log_every``); the
        first row of a backend that did not call ``first_step_done`` ends the start-up instead."""
        if not self._startup_recorded:
            self._record_startup()
        else:
            wait = {"data_wait_s": round(self.data_wait_s, 3)} if self.data_wait_s else {}
            events.record(
                "steps",
                self._window_time,
                time.time() - self._window_time,
                from_step=self._window_step,
                to_step=step,
                **wait,
            )
        self.data_wait_s = 0.0

    def _log(self, step: int, row: dict[str, Any]) -> None:
        if self.metrics is None:
            raise RuntimeError("the run's metrics are not open: call load_checkpoint or open_metrics first")
        self.metrics.log(step, row)

    # -- evaluation -----------------------------------------------------------------------------------------
    def eval_due(self, step: int) -> bool:
        every = self.recipe.eval.every
        return bool(self.has_eval and every and step % every == 0 and step < self.recipe.train.steps)

    def record_eval(
        self, step: int, result: dict[str, Any], seconds: float | None = None, line: str | None = None
    ) -> dict[str, Any]:
        """An evaluation's metrics row (with ``eval_seconds`` when given) and its line (``line``, else
        :func:`eval_line`). Returns the row, which is also ``last_eval``."""
        if seconds is not None:
            result["eval_seconds"] = round(seconds, 2)
            events.record("eval", time.time() - seconds, seconds, step=step)
        self._log(step, result)
        self.say(line if line is not None else eval_line(step, result))
        self.last_eval = result
        return result

    def judge(self, step: int, result: Mapping[str, Any]) -> Verdict:
        """Keep-best and early stopping (the shared :class:`~tpuft.worker.selection.Selector`); an early stop
        is said and kept for the final heartbeat."""
        verdict = self.selector.judge(step, result)
        if verdict.stop:
            self.stopped_early = verdict.reason
            self.say(f"{verdict.reason}")
        return verdict

    @property
    def best(self) -> dict[str, Any] | None:
        """``{"metric", "value", "step"}`` of the best evaluation so far, or None."""
        return self.selector.best

    # -- the test evaluation --------------------------------------------------------------------------------
    def test_due(self) -> bool:
        """Whether the end of this run tests: there is a test set and no test of this run is on record."""
        return self.has_test and not self.test_result

    def test_checkpoint(self) -> tuple[int, Path | None]:
        """What the test evaluates: ``(step, folder)`` of the best checkpoint under ``train.keep_best`` when
        that is not the current step, else ``(current step, None)``: the weights in memory, the last."""
        best = self.best
        if self.recipe.train.keep_best and best is not None and int(best["step"]) != self.step:
            return int(best["step"]), self.layout.checkpoint_dir(self.ctx.run_dir, int(best["step"]))
        return self.step, None

    def test_predictions_dir(self) -> Path:
        """Where every process writes its share of the test predictions
        (:func:`tpuft.worker.predictions.shard_name`)."""
        return self.ctx.run_dir / rundir.TEST_DIR

    def record_test(self, result: Mapping[str, Any], seconds: float, checkpoint_step: int) -> dict[str, Any]:
        """The test row: ``result``'s scores (:func:`tpuft.worker.predictions.scores`, unprefixed, already
        summed over every replica) as ``test_*``, with ``test_seconds`` and ``test_checkpoint_step``, logged
        at the current step; its line. Every process calls it (the row is the chief's) and keeps the result
        for the checkpoint."""
        row = {
            **prefixed(dict(result), "test"),
            "test_seconds": round(seconds, 2),
            "test_checkpoint_step": checkpoint_step,
        }
        events.record("test", time.time() - seconds, seconds, step=self.step)
        self._log(self.step, row)
        self.say(test_line(row))
        self.test_result = row
        return row

    # -- checkpoints ----------------------------------------------------------------------------------------
    def checkpoint_due(self, step: int) -> bool:
        every = self.recipe.train.checkpoint_every
        return bool(every and step % every == 0 and step < self.recipe.train.steps)

    def save_checkpoint(
        self,
        step: int,
        write: Callable[[Path], None],
        *,
        backend: str,
        replicas: int,
        state: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> Path | None:
        """The chief writes ``checkpoints/<step>``: ``write(folder)`` puts the engine's files in a temp
        folder, then ``trainer_state.json`` (the step, the clock, ``state``, the selector's state) and the
        manifest go in last, and the folder takes its final name at once; then pruning. A step already saved
        is not written again. Returns the folder (None on a process that is not the chief)."""
        if not self.chief:
            return None
        final = self.layout.checkpoint_dir(self.ctx.run_dir, step)
        if step in self.saved_steps:
            if self.test_result:
                self._note_test(final)
            return final
        self.beat(step, phase="checkpoint")
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.time()
        elapsed = started - self.run_started
        write(tmp)
        trainer_state = {
            "step": step,
            "run_id": self.ctx.run_id,
            "recipe": self.recipe.name,
            "backend": backend,
            "tokenizer": self.recipe.model.tokenizer,
            "time": time.time(),
            "elapsed_s": elapsed,
            "replicas": replicas,
            **(state or {}),
            **self.selector.state(),
            **({TEST_STATE: self.test_result} if self.test_result else {}),
        }
        (tmp / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
        self.layout.write_manifest(tmp)  # last: the checkpoint is complete once every file it lists is there
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self.saved_steps.add(step)
        self.prune()
        self.say(f"checkpoint saved: {final} ({time.time() - started:.1f}s)")
        events.record(
            "checkpoint_save",
            started,
            time.time() - started,
            step=step,
            reason=reason or self._save_reason(step),
        )
        return final

    def save_asked(self, save: Callable[[int], Any], step: int) -> Any:
        """``save(step)`` for a checkpoint asked for on demand (:mod:`tpuft.worker.ondemand`)."""
        self._asked = True
        try:
            return save(step)
        finally:
            self._asked = False

    def _save_reason(self, step: int) -> str:
        """Why a checkpoint was saved, for its event: the last step's (or an early stop's), a new best's, else
        the cadence's."""
        if self._asked:
            return "request"
        if step >= self.recipe.train.steps or self.stopped_early:
            return "final"
        best = self.best
        return (
            "best"
            if self.recipe.train.keep_best and best is not None and int(best["step"]) == step
            else "periodic"
        )

    def _note_test(self, folder: Path) -> None:
        """A checkpoint saved before the test (an early stop on a checkpoint step) gets the test result in its
        ``trainer_state.json`` too, through a temp file, and its manifest anew."""
        path = folder / TRAINER_STATE
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return
        if state.get(TEST_STATE) == self.test_result:
            return
        state[TEST_STATE] = self.test_result
        rundir.write_json_atomic(path, state)
        self.layout.write_manifest(folder)

    def prune(self) -> None:
        """Keep the last ``train.keep_checkpoints`` complete checkpoints and, under ``train.keep_best``, the
        best."""
        found = self.layout.local_checkpoints(self.ctx.run_dir / self.layout.checkpoints)
        best = self.best if self.recipe.train.keep_best else None
        keep = steps_to_keep(
            [step for step, _ in found],
            self.recipe.train.keep_checkpoints,
            int(best["step"]) if best is not None else None,
        )
        for step, path in found:
            if step not in keep:
                shutil.rmtree(path, ignore_errors=True)

    # -- the end --------------------------------------------------------------------------------------------
    def export_source(self, checkpoint: Path, *, say_when_last: bool = False) -> Path:
        """The checkpoint to export: the best one under ``train.keep_best`` (said when it is not the last, or
        always with ``say_when_last``: Keras's users and tests read the line), else ``checkpoint`` (the final
        one)."""
        best = self.best
        if (
            self.recipe.train.keep_best
            and best is not None
            and (say_when_last or int(best["step"]) != self.step)
        ):
            self.say(
                f"exporting the best checkpoint: step {best['step']} ({best['metric']} {best['value']:.4f})"
            )
            return self.layout.checkpoint_dir(self.ctx.run_dir, int(best["step"]))
        return checkpoint

    def finished(self, step: int, **extra: Any) -> None:
        """The final heartbeat: ``extra`` (e.g. the weight digest), the training time, the last evaluation's
        numbers and, after an early stop, why."""
        tail = {key: value for key, value in self.last_eval.items() if key.startswith("eval_")}
        tail.update((key, value) for key, value in self.test_result.items() if key.startswith("test_"))
        if self.stopped_early:
            tail["stopped_early"] = self.stopped_early
        self.beat(step, "finished", **extra, train_seconds=round(time.time() - self.run_started, 1), **tail)
        events.close()


class TrainerHooks(Protocol):
    """What a trainer that owns its loop supplies to :func:`train` and :func:`finish`. Building (model,
    optimizer, data; restored from ``RunLoop.resume.checkpoint`` when resuming) is the trainer's set-up, done
    before."""

    def start(self, step: int) -> int:
        """Right before the first step (``step``: the start step): put a resumed state in place, seed the
        RNGs. Returns how many steps the step's program takes to become steady (compilation): the heartbeat
        says ``starting`` until then."""
        ...

    def train_step(self, step: int) -> None:
        """Train one optimizer step, from ``step`` to ``step + 1``."""
        ...

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
        :func:`tpuft.worker.predictions.statistics` over the replicas and return their ``scores`` (the same on
        every process). The weights in memory are as before when it returns (the final checkpoint saves
        them)."""
        ...


def train(loop: RunLoop, hooks: TrainerHooks) -> None:
    """The loop of a trainer that owns it: steps, rows, heartbeats, evaluations judged, checkpoints."""
    total = loop.recipe.train.steps
    loop.step = loop.start_step
    loop.start_clock()
    loop.say(f"training steps {loop.step + 1} to {total}" if loop.step else f"training for {total} steps")
    loop.warm_at = loop.step + hooks.start(loop.step)
    requests = CheckpointRequests.of(loop.ctx, answers=loop.beats)  # tpuft checkpoint: one os.stat per step
    if (
        loop.selector.stopped_early
    ):  # the checkpoint is where an early-stopped run ended: nothing more to train
        loop.stopped_early = loop.selector.stopped_early
        loop.say(f"resumed after {loop.stopped_early}")
        return
    while loop.step < total:
        hooks.train_step(loop.step)
        loop.step += 1
        step = loop.step
        if loop.first_step_s is None:
            loop.first_step_done()
        logged: dict[str, Any] = {}
        if loop.log_due(step):
            loss, lr, tokens = hooks.progress()
            logged = loop.log_train(step, loss=loss, lr=lr, tokens=tokens)
        loop.beat(step, phase=loop.phase(step), **logged)
        saved = False
        if loop.eval_due(step):
            verdict = loop.judge(step, evaluate(loop, hooks))
            if verdict.stop:
                break
            if verdict.improved and loop.recipe.train.keep_best:
                hooks.save(step)  # the best so far becomes a checkpoint, whatever checkpoint_every says
                saved = True
        if not saved and loop.checkpoint_due(step):
            hooks.save(step)
        serve(
            requests,
            step,
            lambda at: loop.save_asked(hooks.save, at),
            loop.say,
            lambda at: loop.beat(at, phase="checkpoint"),
        )


def evaluate(loop: RunLoop, hooks: TrainerHooks) -> dict[str, Any]:
    """One evaluation in the ``eval`` phase, recorded (row and line) when there was something to evaluate."""
    if not loop.has_eval:
        return {}
    loop.beat(loop.step, phase="eval")
    started = time.time()
    result = hooks.evaluate()
    return loop.record_eval(loop.step, result, time.time() - started) if result else result


def finish(loop: RunLoop, hooks: TrainerHooks) -> None:
    """The end of a run: the final evaluation (unless an early stop has just evaluated), the final checkpoint
    (the loop never saves at the last step), the weight digest, the export, the final heartbeat."""
    if loop.stopped_early is None:
        result = evaluate(loop, hooks)
        if result:
            loop.selector.judge(loop.step, result)  # for the best to export; training is over either way
        loop.last_eval = result
    if loop.test_due():
        run_test(loop, hooks.test)
    checkpoint = hooks.save(loop.step)
    digest = hooks.digest()
    if loop.chief and loop.recipe.export.hf and checkpoint is not None:
        source = loop.export_source(checkpoint)
        loop.beat(loop.step, phase="export")
        started = time.time()
        hooks.export(source)
        events.record("export", started, time.time() - started, step=loop.step)
    loop.finished(loop.step, params_sha256=digest)


def run_test(loop: RunLoop, test: Callable[[Path | None], dict[str, Any]]) -> dict[str, Any]:
    """The test evaluation in the ``eval`` phase: ``test(folder)`` on what :meth:`RunLoop.test_checkpoint`
    picks, recorded. For a framework-driven trainer too (Keras, T5X), with its own ``test``."""
    step, folder = loop.test_checkpoint()
    loop.beat(loop.step, phase="eval")
    loop.say(
        f"testing {'the best checkpoint, step ' + str(step) if folder is not None else 'the final weights'} "
        f"on {loop.recipe.data.test or 'the test split'}"
    )
    started = time.time()
    result = test(folder)
    return loop.record_test(result, time.time() - started, step)


def run(loop: RunLoop, hooks: TrainerHooks) -> None:
    """:func:`train`, then :func:`finish`."""
    train(loop, hooks)
    finish(loop, hooks)
