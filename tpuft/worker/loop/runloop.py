"""One run's bookkeeping, the state the sequencer (:mod:`tpuft.worker.loop.sequencer`) keeps: resume, the
metrics rows and lines, heartbeats, the judge, checkpoint folders and pruning, the test row, the final
heartbeat. Engines do not call it for decisions: the sequencer does, after each step and at the end.

* ``find_checkpoint()`` then ``load_checkpoint()``: resume bookkeeping (``TPUFT_RESUME``): the start step,
  the checkpoint folder to restore from and its ``trainer_state.json``, the metrics writer (rows after the
  checkpoint forgotten) and the :class:`~tpuft.worker.selection.Selector` restored from that state. A trainer
  that finds its checkpoint its own way (T5X) calls ``open_metrics(restart_at)`` and sets ``start_step``.
* ``start_clock()`` as training starts: the run's clock goes on from the checkpoint's ``elapsed_s``; the
  attempt's own clock (``train.time_limit``) starts at zero.
* ``log_train`` (the metrics row and progress line; rates over the steps since the last row), ``beat``
  (heartbeat phases ``starting``, ``collective``, ``step``, ``eval``, ``checkpoint``, ``export``:
  :data:`tpuft.worker.metrics.PATIENT_PHASES` get the supervisor's longer hang timeout), ``record_eval`` and
  ``judge`` (keep-best, early stopping), ``save_checkpoint`` (through a temp dir, ``trainer_state.json`` and
  the manifest last, then pruning), ``record_test`` (once per run: the result goes into the final
  checkpoint's state, so a resume does not test again), ``finished`` (the final heartbeat).

Stdlib only at import (plus tpuft's worker modules): it runs inside every backend's venv.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.run import rundir
from tpuft.scoring.predictions import prefixed
from tpuft.worker import events
from tpuft.worker.loop.lines import eval_line, progress_line, steps_to_keep, test_line
from tpuft.worker.metrics import Heartbeat, MetricsWriter
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
        self.ended: str | None = None
        """Why training ended before ``train.steps`` other than an early stop: ``time_limit``. The run still
        tests, saves, exports and finishes; its checkpoint keeps no test row, so a resume tests again."""
        self.attempt_started: float | None = None
        """When this attempt's training started (``start_clock``): ``train.time_limit`` counts from here."""
        self.last_eval_step = -1
        """The step of the latest evaluation recorded, so that the end does not evaluate the same weights
        twice."""
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
        self.attempt_started = time.time()
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
        self.last_eval_step = step
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
        (:func:`tpuft.scoring.predictions.shard_name`)."""
        return self.ctx.run_dir / rundir.TEST_DIR

    def record_test(self, result: Mapping[str, Any], seconds: float, checkpoint_step: int) -> dict[str, Any]:
        """The test row: ``result``'s scores (:func:`tpuft.scoring.predictions.scores`, unprefixed, already
        summed over every replica) as ``test_*``, with ``test_seconds`` and ``test_checkpoint_step``, logged
        at the current step; its line. Every process calls it (the row is the chief's) and keeps the result
        for the checkpoint."""
        row = {
            **prefixed(dict(result), "test"),
            "test_seconds": round(seconds, 2),
            "test_checkpoint_step": checkpoint_step,
            **({"ended": self.ended} if self.ended else {}),  # training was cut short: a resume tests again
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
            if self.test_result and not self.ended:
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
            **({TEST_STATE: self.test_result} if self.test_result and not self.ended else {}),
            **({"ended": self.ended} if self.ended else {}),
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
        if step >= self.recipe.train.steps or self.stopped_early or self.ended:
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
        if self.ended:
            tail["ended"] = self.ended
        self.beat(step, "finished", **extra, train_seconds=round(time.time() - self.run_started, 1), **tail)
        events.close()
