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
tpuft turns T5X's progress into its run-dir contract, through the run skeleton every backend shares
(:mod:`tpuft.worker.loop`), by hooking a few places (:mod:`tpuft.worker.t5x.hooks`), nothing else:

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
import time
from pathlib import Path
from typing import Any

from tpuft.backends.spec import LOCAL_DEVICES_ENV
from tpuft.backends.t5x_schema import LAYOUT
from tpuft.config import RecipeConfig
from tpuft.run import rundir
from tpuft.worker import events
from tpuft.worker.context import WorkerContext
from tpuft.worker.hf_data import has_held_out
from tpuft.worker.loop import RunLoop, steps_to_keep
from tpuft.worker.metrics import fetch_missing_metrics
from tpuft.worker.resume import RESUME_ENV, find_resume_checkpoint
from tpuft.worker.selection import Selector
from tpuft.worker.t5x.data import ranking_metric, show_samples
from tpuft.worker.t5x.gin import initial_step, run_gin, task_spec, tasks_module
from tpuft.worker.t5x.goodput import T5xTimeline
from tpuft.worker.t5x.hooks import activate, exit_on_sigterm, install_hooks, run_t5x_train

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
        self.timeline = T5xTimeline(self.initial_step, self.total_steps)  # goodput events of T5X's own loop
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
        for row in _logged_rows(self.ctx.run_dir / rundir.METRICS):
            if "eval_examples" in row and isinstance(row.get("step"), int):  # an inference evaluation's row
                loop.selector.judge(row["step"], row)
            if "test_examples" in row:  # this run has tested (tpuft.worker.t5x.testset): not again
                loop.test_result = row
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
        _write(folder / "task.json", json.dumps(spec, indent=2, sort_keys=True) + "\n")
        _write(folder / "tasks.py", tasks_module(spec))
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
        _write(folder / "run.gin", gin_text)
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
                self.say(
                    f"batch split: this host feeds {rows} of each batch's {self.recipe.train.batch_size} rows",
                    everyone=True,
                )
        if first_of_run:
            phase = "starting"
        else:
            phase = "collective" if self._process_count() > 1 else "step"
        self.beat(absolute_step - self.initial_step, phase=phase)

    def on_train_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        metrics = self.loop.metrics
        assert metrics is not None
        step = absolute_step - self.initial_step
        numbers = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        metrics.tensorboard(step, {f"t5x/{k}": v for k, v in numbers.items()})
        loss = _per_token_loss(numbers)
        if loss is None:
            return
        with self.counted_lock:
            rows, examples, tokens = self.counted
            self.counted = (0, 0, 0)
        rows_per_s = numbers.get("timing/seqs_per_second", 0.0)  # T5X's own clock for the window
        extra = {"token_accuracy": round(numbers["accuracy"], 6)} if "accuracy" in numbers else {}
        self.loop.data_wait_s += self.timeline.waited_before(absolute_step)  # this window's steps' waits
        logged = self.loop.log_train(
            step,
            loss=round(loss, 6),
            lr=numbers.get("learning_rate", numbers.get("learning_rate/current", 0.0)),
            examples_per_s=round(rows_per_s * examples / rows, 2) if rows else round(rows_per_s, 2),
            tokens_per_s=round(rows_per_s * tokens / rows, 1) if rows else 0.0,
            extra=extra,
        )
        self.beat(step, **logged)

    def on_eval_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        """Teacher-forced eval on the validation split (T5X's "training eval"): a row, not judged."""
        assert self.loop.metrics is not None
        numbers = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        row: dict[str, Any] = {}
        loss = _per_token_loss(numbers)
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
        row: dict[str, Any] = {f"eval_{k}": round(float(v), 6) for k, v in metrics.items() if _is_number(v)}
        row["eval_examples"] = len(predictions)
        row["checkpoint"] = LAYOUT.checkpoint_format.format(step=absolute_step)
        folder = self.ctx.run_dir / PREDICTIONS
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / f"predictions-{step:08d}.jsonl", "".join(json.dumps(p) + "\n" for p in predictions))
        shown = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in row.items() if isinstance(v, float))
        self.loop.record_eval(step, row, line=f"eval @ {step}: {shown} ({len(predictions)} examples)")
        show_samples(self.loop, step, predictions, self.recipe.eval.generate_examples)
        if self.loop.judge(step, row).improved:
            self._prune()

    def on_layout(self, layout: dict[str, Any]) -> None:
        """The mesh T5X built and how the parameters are split over it: a line in the log, and (host 0)
        ``run_dir/t5x/layout.json``, so a rehearsal shows the layout the slice will get."""
        self.say(layout_line(layout), everyone=True)
        if self.chief:
            _write(
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
        last = self.loop.step if self.loop.stopped_early else self.recipe.train.steps
        self.loop.step = last  # the test row's step (the last heartbeat's may be the one before)
        self.loop.has_test = has_held_out(self.recipe.data, "test") and self.recipe.backend.task == "finetune"
        if self.loop.has_test:
            from tpuft.worker.t5x.testset import agree, run_test

            due, chosen = agree(
                [int(self.loop.test_due()), self._final_checkpoint(False) or -1] if self.chief else [0, -1]
            )
            if due and chosen >= 0:
                run_test(
                    self.loop,
                    self.recipe,
                    self.ctx.run_dir / GENERATED / "run.gin",
                    f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=chosen)}",
                    chosen - self.initial_step,
                )
        if self.chief and self.recipe.export.hf:
            chosen = self._final_checkpoint()
            if chosen is not None:
                self.beat(phase="export")
                started = time.time()
                out = export_hf(self.ctx, self.model_dir, chosen, self.recipe.export.dtype)
                events.record("export", started, time.time() - started, step=last)
                extra["exported_from"] = LAYOUT.checkpoint_format.format(step=chosen)
                self.say(f"Hugging Face export of {extra['exported_from']}: {out}")
        self.phase = "step"
        self.loop.finished(last, **extra)


def start_jax(ctx: WorkerContext, recipe: RecipeConfig) -> None:
    """What every T5X process does before JAX starts (a training, a ``tpuft predict`` job). The local pod: as
    many CPU devices in this process as the slice's hosts have chips (the launch plan's count, in the
    XLA_FLAGS that JAX's CPU client reads), and JAX's coordination service on worker 0 with gloo collectives
    between the processes, waiting up to ``train.startup_timeout`` for every host of every slice to join. TPU
    hosts need nothing: the TPU runtime finds its peers (and, on several slices, the MEGASCALE variables'
    coordinator)."""
    if os.environ.get("JAX_PLATFORMS", "") != "cpu":
        return
    count = os.environ.get(LOCAL_DEVICES_ENV)
    if count:
        os.environ["XLA_FLAGS"] = with_host_device_count(os.environ.get("XLA_FLAGS", ""), int(count))
    if ctx.num_workers > 1:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=ctx.coordinator,
            num_processes=ctx.num_workers,
            process_id=ctx.worker_id,
            initialization_timeout=int(recipe.train.startup_timeout),
        )


# ----------------------------------------------------------------------------------------------------------
# Pure helpers


def batch_counts(batch: Any) -> tuple[int, int, int]:
    """(rows, examples, real tokens) of this host's part of a T5X batch. A packed row holds one example per
    decoder segment id (1, 2, ...; 0 is padding); an unpacked one, one example if its targets are not all
    padding."""
    import numpy as np

    def local(array: Any) -> Any:
        """This host's rows: on a pod the batch is a global jax.Array whose other shards live on other
        hosts."""
        shards = getattr(array, "addressable_shards", None)
        if shards is None:
            return np.asarray(array)
        unique = {str(shard.index): shard.data for shard in shards}
        return np.concatenate([np.asarray(data) for data in unique.values()])

    targets = local(batch["decoder_target_tokens"])
    tokens = int((targets > 0).sum())
    if "encoder_input_tokens" in batch:
        tokens += int((local(batch["encoder_input_tokens"]) > 0).sum())
    segments = batch.get("decoder_segment_ids")
    if segments is not None:
        examples = int(local(segments).max(axis=-1).sum())
    else:
        examples = int((targets > 0).any(axis=-1).sum())
    return int(targets.shape[0]), examples, tokens


def with_host_device_count(flags: str, count: int) -> str:
    """``XLA_FLAGS`` with XLA's host-platform device count set to ``count`` (replacing one already there), the
    other flags kept as they were."""
    kept = [flag for flag in flags.split() if not flag.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={count}"])


def layout_line(layout: dict[str, Any]) -> str:
    """``device layout: 2 host(s) x 2 device(s), mesh data 2 x model 2 (2 replicas x 2 partitions); ...``; on
    several slices the mesh's ``replica`` axis is the slices (``replica 2 x data 1 x model 2``)."""
    mesh = layout["mesh"]
    replicas = mesh.get("replica", 1) * mesh.get("data", 1)
    line = (
        f"device layout: {layout['hosts']} host(s) x {layout['devices_per_host']} device(s), mesh "
        + " x ".join(f"{axis} {size}" for axis, size in mesh.items())
        + f" ({replicas} replicas x {mesh.get('model', 1)} partitions); "
        f"{layout['params_sharded']} of {layout['params']} parameter arrays split over "
        + " and ".join(f"'{axis}'" for axis in layout.get("sharded_over") or ["model"])
    )
    example = layout.get("example")
    if example:
        line += (
            f", e.g. {example['name']} {tuple(example['shape'])} as {example['spec']}: "
            f"{tuple(example['per_device'])} per device"
        )
    return line


def remove_checkpoint(folder: str) -> None:
    """A checkpoint folder pruned, local or gs:// (through TensorFlow's gfile, which T5X writes with)."""
    import tensorflow as tf

    tf.io.gfile.rmtree(folder)


def write_manifest(folder: str) -> None:
    """tpuft's manifest for a checkpoint folder, local or gs:// (listed through TensorFlow's gfile)."""
    if not folder.startswith("gs://"):
        LAYOUT.write_manifest(Path(folder))
        return
    import tensorflow as tf

    from tpuft.backends.spec import manifest_text

    files: dict[str, int] = {}
    for root, _, names in tf.io.gfile.walk(folder):
        for name in names:
            path = f"{root.rstrip('/')}/{name}"
            rel = path[len(folder) + 1 :]
            if rel != LAYOUT.manifest:
                files[rel] = tf.io.gfile.stat(path).length
    with tf.io.gfile.GFile(f"{folder}/{LAYOUT.manifest}", "w") as handle:
        handle.write(manifest_text(files))


def export_hf(ctx: WorkerContext, model_dir: str, step: int, dtype: str) -> Path:
    from tpuft.convert.hf_writer import write_hf_model
    from tpuft.convert.sources import open_source

    if model_dir.startswith("gs://"):
        from tpuft.convert.remote import fetch_checkpoint

        checkpoint = fetch_checkpoint(model_dir, step)
    else:
        checkpoint = Path(model_dir) / LAYOUT.checkpoint_format.format(step=step)
    out = ctx.run_dir / rundir.EXPORT_HF
    write_hf_model(open_source(checkpoint), out, dtype=dtype, overwrite=True)
    return out


def _write(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _per_token_loss(numbers: dict[str, float]) -> float | None:
    """The mean loss per real target token, comparable across backends (T5X's own ``loss`` is a sum over the
    batch's tokens divided by the loss normalising factor, kept in TensorBoard as ``t5x/loss``)."""
    for name in ("loss_per_nonpadding_target_token", "loss"):
        if name in numbers:
            return numbers[name]
    return None


def _is_number(value: Any) -> bool:
    try:
        return not isinstance(value, (bool, str, bytes)) and float(value) == float(value)
    except (TypeError, ValueError):
        return False


def _logged_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (none when there is no file; a torn line is skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [row for line in lines if (row := rundir.read_json_text(line)) is not None]
