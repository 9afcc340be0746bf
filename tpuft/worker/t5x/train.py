"""T5X trainer: writes the run's seqio task module and gin, then runs ``t5x.train`` in this process, on every
host.

What a user of T5X would otherwise do by hand, and the traps on the way:

* ``run_dir/t5x/tasks.py`` registers the task from the recipe (:mod:`tpuft.worker.t5x.tasks`), and
  ``run_dir/t5x/run.gin`` (:mod:`tpuft.worker.t5x.gin`) includes the model gin (t5x's example by family and
  size, or the user's) and ``finetune.gin``, then binds what the recipe says. Both stay in the run dir, so a
  run can be read and re-run.
* ``TRAIN_STEPS`` is absolute in T5X: the recipe's ``train.steps`` counts this run's steps, so the gin says
  ``initial checkpoint's step + train.steps``; the learning-rate schedule is offset by the same step, and
  tpuft's own step (heartbeats, metrics.jsonl, monitor) counts from 0 as with every backend. A resumed run is
  the same gin: T5X restores the latest checkpoint in ``MODEL_DIR`` by itself, which is ahead of the initial
  one.
* ``USE_CACHED_TASKS = False`` (nothing is pre-cached), and the loss normalising factor of the family
  (:data:`tpuft.backends.t5x.PRETRAINING_LOSS_FACTOR`) when fine-tuning a public checkpoint.

``MODEL_DIR`` is the run's ``checkpoints/`` (in the bucket for a gs:// run dir: T5X writes there itself).
tpuft turns T5X's progress into its run-dir contract, through the run sequencer every backend hands over to
(:mod:`tpuft.worker.loop`; its side of a framework's own loop, :mod:`tpuft.worker.loop.framework`), by
hooking a few places (:mod:`tpuft.worker.t5x.hooks`), nothing else:

* the trainer's ``train`` (a run of ``log_every`` steps): the sequencer's boundary before it (checkpoints on
  demand, ``train.time_limit``);

* the trainer's batch iterator: a heartbeat per step (phase ``collective`` on a pod: each step is an
  all-reduce);
* the metrics writer of host 0 (``MetricsManager._create_writer``): ``metrics.jsonl`` rows (loss, lr,
  examples/s, tokens/s; teacher-forced eval loss and token accuracy) and TensorBoard events in the run's
  TensorBoard folder;
* the Orbax checkpoint manager's ``save``: the ``checkpoint`` phase, then, once the save is complete, tpuft's
  ``manifest.json`` in it (pull, convert and resume take only complete checkpoints) and pruning: the last
  ``train.keep_checkpoints`` and the best by the eval metric are kept (T5X's own best-checkpoint wiring does
  not reach Orbax at the pinned commit).

The inference eval (greedy decoding, the task's metric) reaches tpuft through a seqio logger bound in the gin:
``eval_exact_match`` rows, and the decoded predictions in ``run_dir/eval/predictions-<step>.jsonl``. At the
end, host 0 converts the best (or last) checkpoint to ``export/hf`` with tpuft's own converter.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from tpuft.backends.t5x_schema import LAYOUT
from tpuft.config import RecipeConfig
from tpuft.run import rundir
from tpuft.worker.context import WorkerContext
from tpuft.worker.hf_data import has_held_out
from tpuft.worker.loop import RunLoop, sequencer, steps_to_keep
from tpuft.worker.loop.framework import Timeline, reported_eval, reported_train, resumed_from_rows
from tpuft.worker.metrics import fetch_missing_metrics
from tpuft.worker.resume import RESUME_ENV, find_resume_checkpoint
from tpuft.worker.selection import Selector
from tpuft.worker.t5x.data import held_out_label, ranking_metric, show_samples
from tpuft.worker.t5x.gin import initial_step, run_gin, task_spec, tasks_module
from tpuft.worker.t5x.hooks import activate, boundaries, exit_on_sigterm, install_hooks, run_t5x_train
from tpuft.worker.t5x.parts import (
    batch_counts,
    export_checkpoint,
    is_number,
    layout_line,
    logged_rows,
    per_token_loss,
    remove_checkpoint,
    start_jax,
    with_host_device_count,
    write_manifest,
    write_text,
)

__all__ = ["T5xRun", "batch_counts", "layout_line", "main", "start_jax", "with_host_device_count"]

GENERATED = "t5x"
"""Folder of the run dir holding the generated ``run.gin``, ``tasks.py`` and ``task.json``."""
PREDICTIONS = "eval"


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    return T5xRun(ctx, recipe).run()


class T5xRun:
    """T5X's loop reported through the shared run skeleton (:class:`tpuft.worker.loop.RunLoop`): T5X trains,
    evaluates and checkpoints as the gin says, and the hooks (:mod:`tpuft.worker.t5x.hooks`) call the ``on_*``
    methods here, which turn what T5X reports into the loop's events (metrics rows, the progress line,
    heartbeats, keep-best, the final heartbeat). What stays here is what only T5X has: absolute steps (tpuft's
    step is T5X's minus the initial checkpoint's), its scalars' names, checkpoints it writes itself (to the
    bucket, for a gs:// run dir), and a resume it does itself."""

    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig) -> None:
        self.ctx = ctx
        self.recipe = recipe
        self.backend = recipe.backend
        self.cpu = os.environ.get("JAX_PLATFORMS", "") == "cpu"
        self.initial_step = initial_step(recipe)
        self.total_steps = self.initial_step + recipe.train.steps
        self.model_dir = (
            f"{ctx.run_url}/{LAYOUT.checkpoints}" if ctx.remote else str(ctx.run_dir / LAYOUT.checkpoints)
        )
        self.loop = RunLoop(ctx, recipe, LAYOUT, chief=ctx.chief)
        self.timeline = Timeline(self.initial_step, self.total_steps)  # goodput events of T5X's own loop
        self.boundaries = boundaries(self)  # the sequencer between T5X's runs of steps
        # Only the inference evaluations are judged (T5X's teacher-forced ones are rows of their own), by
        # eval.metric when the decodes give it (exact match, BLEU, ROUGE-L), else exact match; T5X always
        # keeps the best checkpoint, and stops early through its actions (tpuft.worker.t5x.hooks.EarlyStop
        # asks the judge).
        self.loop.selector = Selector(ranking_metric(recipe.eval.metric), recipe.train.early_stopping)
        self.phase = "starting"
        self.counted = (0, 0, 0)
        """Rows, examples and real (non-padding) input + target tokens this host has taken since the last
        metrics row: T5X packs several examples into a row, and its own rates count rows and target tokens
        only."""
        self.counted_lock = threading.Lock()

    @property
    def chief(self) -> bool:
        return self.loop.chief

    @property
    def stopped_early(self) -> str | None:
        """Why the judge stopped the run early (the last inference eval did not improve for long enough)."""
        return self.loop.stopped_early

    @property
    def stopped(self) -> str | None:
        """Why training ended before its last step (an early stop, ``train.time_limit``), if it did."""
        return self.loop.stopped_early or self.loop.ended

    @property
    def step(self) -> int:
        """tpuft's step (T5X's minus the initial checkpoint's), as the last heartbeat said it."""
        return self.loop.step

    # -- the run --------------------------------------------------------------------------------------------
    def run(self) -> int:
        activate(self)
        exit_on_sigterm()
        self.beat(phase="starting")
        start_jax(self.ctx, self.recipe)
        self.loop.chief = self._process_index() == 0
        self._resume()
        gin_file = self.write_generated()
        install_hooks()
        self.say(
            f"T5X on {self._process_count()} host(s) x {self._local_device_count()} device(s): steps "
            f"{self.initial_step + self.step + 1}..{self.total_steps} "
            f"(TRAIN_STEPS {self.total_steps}), MODEL_DIR {self.model_dir}"
        )
        run_t5x_train(gin_file)
        self.finish()
        assert self.loop.metrics is not None
        self.loop.metrics.close()
        return 0

    def _resume(self) -> None:
        """The metrics writer, and where a resumed run starts. T5X restores the latest checkpoint in MODEL_DIR
        by itself; tpuft finds its step where the run dir really is, forgets the rows logged after it, and
        judges the inference evaluations before it again for keep-best (T5X's checkpoints hold no state of
        tpuft's)."""
        loop = self.loop
        if loop.resuming and loop.chief:
            fetch_missing_metrics(self.ctx)
        found = find_resume_checkpoint(self.ctx, LAYOUT) if loop.resuming else None
        if found is None:
            loop.open_metrics(None)
            if loop.resuming:
                self.say(
                    f"{RESUME_ENV} is set but the run has no complete checkpoint: training from the start"
                )
            return
        latest = found[0]
        loop.start_step = loop.step = latest - self.initial_step
        loop.open_metrics(loop.start_step)
        self.timeline.resumed_at = loop.start_step  # T5X restores it in its start-up: the hooks time it there
        resumed_from_rows(loop, logged_rows(self.ctx.run_dir / rundir.METRICS))
        self.say(f"resuming from checkpoint_{latest} (step {loop.start_step} of {self.recipe.train.steps})")

    @staticmethod
    def _process_index() -> int:
        import jax

        return jax.process_index()

    @staticmethod
    def _process_count() -> int:
        import jax

        return jax.process_count()

    @staticmethod
    def _device_count() -> int:
        import jax

        return jax.device_count()

    @staticmethod
    def _local_device_count() -> int:
        import jax

        return jax.local_device_count()

    def say(self, message: str, *, everyone: bool = False) -> None:
        self.loop.say(message, everyone=everyone)

    def beat(
        self, step: int | None = None, status: str = "running", phase: str | None = None, **extra: Any
    ) -> None:
        """The heartbeat; T5X's hooks that know no step (evaluations, checkpoints) repeat the last one's, and
        a beat without a phase keeps the last one's."""
        if step is not None:
            self.loop.step = step
        if phase is not None:
            self.phase = phase
        self.loop.beat(self.loop.step, status, self.phase, **extra)

    # -- generated files ------------------------------------------------------------------------------------
    def task_spec(self) -> dict[str, Any]:
        return task_spec(self.ctx.run_id, self.recipe)

    def write_generated(self) -> Path:
        """``run_dir/t5x/{task.json,tasks.py,run.gin}``; every host writes its own copy (atomically: on the
        local pod they share the run dir)."""
        folder = self.ctx.run_dir / GENERATED
        folder.mkdir(parents=True, exist_ok=True)
        spec = self.task_spec()
        write_text(folder / "task.json", json.dumps(spec, indent=2, sort_keys=True) + "\n")
        write_text(folder / "tasks.py", tasks_module(spec))
        gin_text = run_gin(
            self.recipe,
            spec,
            model_dir=self.model_dir,
            initial_step=self.initial_step,
            cpu=self.cpu,
            resumed_at=self.step,
            slices=self.ctx.num_slices,
            devices=self._device_count(),
        )
        write_text(folder / "run.gin", gin_text)
        import importlib.util

        module_spec = importlib.util.spec_from_file_location("tpuft_run_tasks", folder / "tasks.py")
        assert module_spec is not None and module_spec.loader is not None
        module_spec.loader.exec_module(importlib.util.module_from_spec(module_spec))
        return folder / "run.gin"

    # -- what the hooks report ------------------------------------------------------------------------------
    def on_batch(self, absolute_step: int, first_of_run: bool, batch: Any = None) -> None:
        """Called as T5X takes the batch of step ``absolute_step + 1``."""
        if (
            batch is not None and self.counted[0] == 0
        ):  # one batch per metrics window: reading it costs a sync
            rows, examples, tokens = batch_counts(batch)
            with self.counted_lock:
                self.counted = (self.counted[0] + rows, self.counted[1] + examples, self.counted[2] + tokens)
            if first_of_run:  # T5X feeds each host the rows of the replicas its devices hold
                batch = self.recipe.train.batch_size
                self.say(f"batch split: this host feeds {rows} of each batch's {batch} rows", everyone=True)
        if first_of_run:
            phase = "starting"
        else:
            phase = "collective" if self._process_count() > 1 else "step"
        self.beat(absolute_step - self.initial_step, phase=phase)

    def on_train_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        metrics = self.loop.metrics
        assert metrics is not None
        step = absolute_step - self.initial_step
        numbers = {k: float(v) for k, v in scalars.items() if is_number(v)}
        metrics.tensorboard(step, {f"t5x/{k}": v for k, v in numbers.items()})
        loss = per_token_loss(numbers)
        if loss is None:
            return
        with self.counted_lock:
            rows, examples, tokens = self.counted
            self.counted = (0, 0, 0)
        rows_per_s = numbers.get("timing/seqs_per_second", 0.0)  # T5X's own clock for the window
        extra = {"token_accuracy": round(numbers["accuracy"], 6)} if "accuracy" in numbers else {}
        self.loop.data_wait_s += self.timeline.waited_before(absolute_step)  # this window's steps' waits
        reported_train(
            self.loop,
            step,
            loss=round(loss, 6),
            lr=numbers.get("learning_rate", numbers.get("learning_rate/current", 0.0)),
            examples_per_s=round(rows_per_s * examples / rows, 2) if rows else round(rows_per_s, 2),
            tokens_per_s=round(rows_per_s * tokens / rows, 1) if rows else 0.0,
            extra=extra,
            phase=self.phase,
        )

    def on_eval_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        """Teacher-forced eval on the validation split (T5X's "training eval"): a row, not judged."""
        assert self.loop.metrics is not None
        numbers = {k: float(v) for k, v in scalars.items() if is_number(v)}
        row: dict[str, Any] = {}
        loss = per_token_loss(numbers)
        if loss is not None:
            row["eval_loss"] = round(loss, 6)
        if "accuracy" in numbers:
            row["eval_token_accuracy"] = round(numbers["accuracy"], 6)
        if row:
            self.loop.metrics.log(absolute_step - self.initial_step, row)

    def on_inference_eval(
        self, absolute_step: int, metrics: dict[str, Any], predictions: list[dict[str, Any]]
    ) -> None:
        step = absolute_step - self.initial_step
        row: dict[str, Any] = {f"eval_{k}": round(float(v), 6) for k, v in metrics.items() if is_number(v)}
        row["eval_examples"] = len(predictions)
        row["checkpoint"] = LAYOUT.checkpoint_format.format(step=absolute_step)
        folder = self.ctx.run_dir / PREDICTIONS
        folder.mkdir(parents=True, exist_ok=True)
        write_text(
            folder / f"predictions-{step:08d}.jsonl", "".join(json.dumps(p) + "\n" for p in predictions)
        )
        shown = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in row.items() if isinstance(v, float))
        line = f"eval @ {step}: {shown} ({len(predictions)} examples)"
        improved = reported_eval(self.loop, step, row, line=line)
        show_samples(self.loop, step, predictions, self.recipe.eval.generate_examples)
        if improved:
            self._prune()

    def on_layout(self, layout: dict[str, Any]) -> None:
        """The mesh T5X built and how the parameters are split over it: a line in the log, and (host 0)
        ``run_dir/t5x/layout.json``, so a rehearsal shows the layout the slice will get."""
        self.say(layout_line(layout), everyone=True)
        if self.chief:
            write_text(
                self.ctx.run_dir / GENERATED / "layout.json",
                json.dumps(layout, indent=2, sort_keys=True) + "\n",
            )

    def on_checkpoint_saved(self, absolute_step: int) -> None:
        """Host 0, once Orbax has finished ``checkpoint_<step>``: the manifest, then pruning."""
        if not self.chief:
            return
        folder = f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=absolute_step)}"
        write_manifest(folder)
        self._prune()
        self.say(f"checkpoint saved: {folder}")

    def _best_step(self) -> int | None:
        """T5X's (absolute) step of the best inference evaluation so far."""
        best = self.loop.best
        return int(best["step"]) + self.initial_step if best is not None else None

    def _prune(self) -> None:
        """Keep the last ``train.keep_checkpoints`` complete checkpoints and the best one; never the initial
        one (it is not in MODEL_DIR)."""
        if not self.chief:
            return
        steps = self._complete_steps()
        keep = steps_to_keep(steps, self.recipe.train.keep_checkpoints, self._best_step())
        for step in sorted(steps):
            if step not in keep:
                remove_checkpoint(f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=step)}")

    def _complete_steps(self) -> list[int]:
        if self.ctx.remote:
            from tpuft.storage import open_storage

            return list(LAYOUT.checkpoint_steps(open_storage(self.ctx.run_url)))
        return [step for step, _ in LAYOUT.local_checkpoints(Path(self.model_dir))]

    # -- the end --------------------------------------------------------------------------------------------
    def _final_checkpoint(self, best_always: bool = True) -> int | None:
        """T5X's step of the checkpoint the export takes (the best, else the last), or with
        ``best_always=False`` the one the test takes, as every backend's and ``tpuft predict RUN``: the best
        under ``train.keep_best``, else the last."""
        steps = self._complete_steps()
        best = self._best_step() if best_always or self.recipe.train.keep_best else None
        return best if best is not None and best in steps else (max(steps) if steps else None)

    def finish(self) -> None:
        """The test evaluation (``data.test``, once per run, every host: :mod:`tpuft.worker.t5x.testset`);
        host 0 exports the best checkpoint (else the last) to Hugging Face format; then the final
        heartbeat."""
        extra: dict[str, Any] = {}
        last = self.loop.step if self.stopped else self.recipe.train.steps
        self.loop.step = last  # the test row's step (the last heartbeat's may be the one before)
        self.loop.has_test = has_held_out(self.recipe.data, "test") and self.recipe.backend.task == "finetune"
        if self.loop.has_test:
            from tpuft.worker.t5x.testset import agree, test_checkpoint

            due, chosen = agree(
                [int(self.loop.test_due()), self._final_checkpoint(False) or -1] if self.chief else [0, -1]
            )
            if due and chosen >= 0:
                folder = f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=chosen)}"
                gin_file = self.ctx.run_dir / GENERATED / "run.gin"
                label = (
                    f"{folder.rstrip('/').rsplit('/', 1)[-1]} on {held_out_label(self.recipe.data, 'test')}"
                )
                sequencer.test_at(
                    self.loop,
                    chosen - self.initial_step,
                    lambda: test_checkpoint(self.loop, self.recipe, gin_file, folder),
                    label=label,
                )
        if self.chief and self.recipe.export.hf:
            chosen = self._final_checkpoint()
            if chosen is not None:
                self.phase = "export"
                out = sequencer.export(
                    self.loop,
                    lambda: export_checkpoint(self.ctx, self.model_dir, chosen, self.recipe.export.dtype),
                )
                extra["exported_from"] = LAYOUT.checkpoint_format.format(step=chosen)
                self.say(f"Hugging Face export of {extra['exported_from']}: {out}")
        self.phase = "step"
        sequencer.end(self.loop, last, **extra)
