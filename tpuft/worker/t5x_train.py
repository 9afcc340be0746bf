"""T5X trainer: writes the run's seqio task module and gin, then runs ``t5x.train`` in this process, on every host.

What a user of T5X would otherwise do by hand, and the traps on the way:

* ``run_dir/t5x/tasks.py`` registers the task from the recipe (:mod:`tpuft.worker.t5x_tasks`), and
  ``run_dir/t5x/run.gin`` includes the model gin (t5x's example by family and size, or the user's) and
  ``finetune.gin``, then binds what the recipe says. Both stay in the run dir, so a run can be read and re-run.
* ``TRAIN_STEPS`` is absolute in T5X: the recipe's ``train.steps`` counts this run's steps, so the gin says
  ``initial checkpoint's step + train.steps``; the learning-rate schedule is offset by the same step, and tpuft's
  own step (heartbeats, metrics.jsonl, monitor) counts from 0 as with every backend. A resumed run is the same
  gin: T5X restores the latest checkpoint in ``MODEL_DIR`` by itself, which is ahead of the initial one.
* ``USE_CACHED_TASKS = False`` (nothing is pre-cached), and the loss normalising factor of the family
  (:data:`tpuft.backends.t5x.PRETRAINING_LOSS_FACTOR`) when fine-tuning a public checkpoint.

``MODEL_DIR`` is the run's ``checkpoints/`` (in the bucket for a gs:// run dir: T5X writes there itself). tpuft turns
T5X's progress into its run-dir contract by hooking three places, nothing else:

* the trainer's batch iterator: a heartbeat per step (phase ``collective`` on a pod: each step is an all-reduce);
* the metrics writer of host 0 (``MetricsManager._create_writer``): ``metrics.jsonl`` rows (loss, lr, examples/s,
  tokens/s; teacher-forced eval loss and token accuracy) and TensorBoard events in the run's TensorBoard folder;
* the Orbax checkpoint manager's ``save``: the ``checkpoint`` phase, then, once the save is complete, tpuft's
  ``manifest.json`` in it (pull, convert and resume take only complete checkpoints) and pruning: the last
  ``train.keep_checkpoints`` and the best by the eval metric are kept (T5X's own best-checkpoint wiring does not
  reach Orbax at the pinned commit).

The inference eval (greedy decoding, the task's metric) reaches tpuft through a seqio logger bound in the gin:
``eval_exact_match`` rows, and the decoded predictions in ``run_dir/eval/predictions-<step>.jsonl``. At the end,
host 0 converts the best (or last) checkpoint to ``export/hf`` with tpuft's own converter.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tpuft import rundir
from tpuft.backends.t5x import LAYOUT, PRETRAINING_LOSS_FACTOR, checkpoint_step, gin_value, model_gins
from tpuft.config import RecipeConfig
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import Heartbeat, MetricsWriter, fetch_missing_metrics

RESUME_ENV = "TPUFT_RESUME"
GENERATED = "t5x"
"""Folder of the run dir holding the generated ``run.gin``, ``tasks.py`` and ``task.json``."""
PREDICTIONS = "eval"

_ACTIVE: T5xRun | None = None
"""The run in this process, for the hooks T5X calls (its seqio logger is built by gin, without arguments)."""


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    return T5xRun(ctx, recipe).run()


class T5xRun:
    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig) -> None:
        self.ctx = ctx
        self.recipe = recipe
        self.backend = recipe.backend
        self.cpu = os.environ.get("JAX_PLATFORMS", "") == "cpu"
        self.initial_step = initial_step(recipe)
        self.total_steps = self.initial_step + recipe.train.steps
        self.model_dir = f"{ctx.run_url}/{LAYOUT.checkpoints}" if ctx.remote else str(ctx.run_dir / LAYOUT.checkpoints)
        self.heartbeat = Heartbeat(ctx.run_dir, ctx.worker_id, recipe.train.steps)
        self.resuming = os.environ.get(RESUME_ENV, "") not in ("", "0")
        self.step = 0
        self.phase = "starting"
        self.started = time.time()
        self.best: tuple[float, int] | None = None
        """(score, absolute step) of the best eval so far; higher score is better."""
        self.metrics: MetricsWriter | None = None
        self.counted = (0, 0, 0)
        """Rows, examples and real (non-padding) input + target tokens this host has taken since the last metrics row:
        T5X packs several examples into a row, and its own rates count rows and target tokens only."""
        self.counted_lock = threading.Lock()

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self) -> int:
        global _ACTIVE
        _ACTIVE = self
        exit_on_sigterm()
        self.beat(phase="starting")
        self._distributed()
        self.chief = self._process_index() == 0
        if self.resuming and self.chief:
            fetch_missing_metrics(self.ctx)
        self.metrics = MetricsWriter(self.ctx.run_dir, chief=self.chief)
        if self.resuming:
            latest = self._latest_checkpoint()
            if latest is not None:
                self.step = latest - self.initial_step
                self.metrics.restart_at(self.step)
                self.best = self._best_from_metrics()
                self.say(f"resuming from checkpoint_{latest} (step {self.step} of {self.recipe.train.steps})")
            else:
                self.say(f"{RESUME_ENV} is set but the run has no complete checkpoint: training from the start")
        gin_file = self.write_generated()
        _install_hooks()
        self.say(
            f"T5X on {self._process_count()} host(s): steps {self.initial_step + self.step + 1}..{self.total_steps} "
            f"(TRAIN_STEPS {self.total_steps}), MODEL_DIR {self.model_dir}"
        )
        _run_t5x_train(gin_file)
        self.finish()
        self.metrics.close()
        return 0

    def _distributed(self) -> None:
        """The local CPU pod: JAX's coordination service on worker 0, gloo collectives between the processes. TPU
        hosts need nothing: the TPU runtime finds its peers."""
        import jax

        if self.cpu and self.ctx.num_workers > 1:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(
                coordinator_address=self.ctx.coordinator,
                num_processes=self.ctx.num_workers,
                process_id=self.ctx.worker_id,
                initialization_timeout=max(60, int(self.recipe.train.hang_timeout)),
            )

    @staticmethod
    def _process_index() -> int:
        import jax

        return jax.process_index()

    @staticmethod
    def _process_count() -> int:
        import jax

        return jax.process_count()

    def say(self, message: str) -> None:
        if getattr(self, "chief", self.ctx.chief):
            print(f"[tpuft] {message}", flush=True)

    def beat(self, step: int | None = None, status: str = "running", phase: str | None = None, **extra: Any) -> None:
        if step is not None:
            self.step = step
        if phase is not None:
            self.phase = phase
        self.heartbeat.beat(self.step, status, self.phase, **extra)

    # -- generated files ----------------------------------------------------------------------------------------
    def task_spec(self) -> dict[str, Any]:
        from tpuft.worker.t5x_tasks import DEFAULT_VOCABULARIES

        backend, data = self.backend, self.recipe.data
        if backend.vocabulary is not None:
            vocab, extra_ids = backend.vocabulary, backend.extra_ids
        else:
            vocab, default_extra = DEFAULT_VOCABULARIES[backend.family or "byt5"]
            extra_ids = default_extra if backend.family != "byt5" else backend.extra_ids
        spec: dict[str, Any] = {
            "name": task_name(self.ctx.run_id),
            "task": backend.task,
            "vocabulary": vocab,
            "extra_ids": extra_ids,
        }
        if backend.task == "span_corruption":
            spec.update(
                corpus=list(data.corpus),
                inputs_length=data.max_source_length,
                noise_density=backend.noise_density,
                mean_noise_span_length=backend.mean_noise_span_length,
            )
        else:
            spec.update(
                train=str(data.train),
                eval=str(data.eval) if data.eval is not None else None,
                fields={
                    "source_field": data.source_field,
                    "target_field": data.target_field,
                    "source_template": data.source_template,
                    "target_template": data.target_template,
                    "prefix": data.prefix,
                },
            )
        return spec

    def write_generated(self) -> Path:
        """``run_dir/t5x/{task.json,tasks.py,run.gin}``; every host writes its own copy (atomically: on the local
        pod they share the run dir)."""
        folder = self.ctx.run_dir / GENERATED
        folder.mkdir(parents=True, exist_ok=True)
        spec = self.task_spec()
        _write(folder / "task.json", json.dumps(spec, indent=2, sort_keys=True) + "\n")
        _write(folder / "tasks.py", tasks_module(spec))
        gin_text = run_gin(self.recipe, spec, model_dir=self.model_dir, initial_step=self.initial_step, cpu=self.cpu,
                           resumed_at=self.step)
        _write(folder / "run.gin", gin_text)
        import importlib.util

        module_spec = importlib.util.spec_from_file_location("tpuft_run_tasks", folder / "tasks.py")
        assert module_spec is not None and module_spec.loader is not None
        module_spec.loader.exec_module(importlib.util.module_from_spec(module_spec))
        return folder / "run.gin"

    # -- what the hooks report ----------------------------------------------------------------------------------
    def on_batch(self, absolute_step: int, first_of_run: bool, batch: Any = None) -> None:
        """Called as T5X takes the batch of step ``absolute_step + 1``."""
        if batch is not None and self.counted[0] == 0:  # one batch per metrics window: reading it costs a sync
            rows, examples, tokens = batch_counts(batch)
            with self.counted_lock:
                self.counted = (self.counted[0] + rows, self.counted[1] + examples, self.counted[2] + tokens)
        if first_of_run:
            phase = "starting"
        else:
            phase = "collective" if self._process_count() > 1 else "step"
        self.beat(absolute_step - self.initial_step, phase=phase)

    def on_train_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        assert self.metrics is not None
        step = absolute_step - self.initial_step
        numbers = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        self.metrics.tensorboard(step, {f"t5x/{k}": v for k, v in numbers.items()})
        loss = _per_token_loss(numbers)
        if loss is None:
            return
        with self.counted_lock:
            rows, examples, tokens = self.counted
            self.counted = (0, 0, 0)
        rows_per_s = numbers.get("timing/seqs_per_second", 0.0)  # T5X's own clock for the window
        row = {
            "loss": round(loss, 6),
            "lr": numbers.get("learning_rate", numbers.get("learning_rate/current", 0.0)),
            "examples_per_s": round(rows_per_s * examples / rows, 2) if rows else round(rows_per_s, 2),
            "tokens_per_s": round(rows_per_s * tokens / rows, 1) if rows else 0.0,
            "elapsed_s": round(time.time() - self.started, 1),
        }
        if "accuracy" in numbers:
            row["token_accuracy"] = round(numbers["accuracy"], 6)
        self.metrics.log(step, row)
        self.beat(step, **{k: row[k] for k in ("loss", "lr", "examples_per_s", "tokens_per_s")})
        self.say(
            f"step {step}/{self.recipe.train.steps} loss {row['loss']:.4f} lr {row['lr']:.2e} "
            f"{row['examples_per_s']:.1f} ex/s {row['tokens_per_s']:.0f} tok/s"
        )

    def on_eval_scalars(self, absolute_step: int, scalars: dict[str, Any]) -> None:
        """Teacher-forced eval on the validation split (T5X's "training eval")."""
        assert self.metrics is not None
        numbers = {k: float(v) for k, v in scalars.items() if _is_number(v)}
        row: dict[str, Any] = {}
        loss = _per_token_loss(numbers)
        if loss is not None:
            row["eval_loss"] = round(loss, 6)
        if "accuracy" in numbers:
            row["eval_token_accuracy"] = round(numbers["accuracy"], 6)
        if row:
            self.metrics.log(absolute_step - self.initial_step, row)

    def on_inference_eval(self, absolute_step: int, metrics: dict[str, Any], predictions: list[dict[str, Any]]) -> None:
        assert self.metrics is not None
        step = absolute_step - self.initial_step
        row: dict[str, Any] = {f"eval_{k}": round(float(v), 6) for k, v in metrics.items() if _is_number(v)}
        row["eval_examples"] = len(predictions)
        row["checkpoint"] = LAYOUT.checkpoint_format.format(step=absolute_step)
        self.metrics.log(step, row)
        folder = self.ctx.run_dir / PREDICTIONS
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / f"predictions-{step:08d}.jsonl", "".join(json.dumps(p) + "\n" for p in predictions))
        shown = " ".join(f"{k.removeprefix('eval_')} {v:.4f}" for k, v in row.items() if isinstance(v, float))
        self.say(f"eval @ {step}: {shown} ({len(predictions)} examples)")
        score = eval_score(row)
        if score is not None and (self.best is None or score > self.best[0]):
            self.best = (score, absolute_step)
            self._prune()

    def on_checkpoint_saved(self, absolute_step: int) -> None:
        """Host 0, once Orbax has finished ``checkpoint_<step>``: the manifest, then pruning."""
        if not self.chief:
            return
        folder = f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=absolute_step)}"
        write_manifest(folder)
        self._prune()
        self.say(f"checkpoint saved: {folder}")

    def _prune(self) -> None:
        """Keep the last ``train.keep_checkpoints`` complete checkpoints and the best one; never the initial one
        (it is not in MODEL_DIR)."""
        if not self.chief:
            return
        import tensorflow as tf

        steps = sorted(self._complete_steps())
        keep = set(steps[-self.recipe.train.keep_checkpoints :])
        if self.best is not None:
            keep.add(self.best[1])
        for step in steps:
            if step not in keep:
                tf.io.gfile.rmtree(f"{self.model_dir}/{LAYOUT.checkpoint_format.format(step=step)}")

    def _complete_steps(self) -> list[int]:
        if self.ctx.remote:
            from tpuft.storage import open_storage

            return list(LAYOUT.checkpoint_steps(open_storage(self.ctx.run_url)))
        return [step for step, _ in LAYOUT.local_checkpoints(Path(self.model_dir))]

    def _latest_checkpoint(self) -> int | None:
        steps = self._complete_steps()
        return max(steps) if steps else None

    def _best_from_metrics(self) -> tuple[float, int] | None:
        best: tuple[float, int] | None = None
        path = self.ctx.run_dir / rundir.METRICS
        if not path.is_file():
            return None
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            score = eval_score(row) if isinstance(row, dict) else None
            if score is not None and isinstance(row.get("step"), int) and (best is None or score > best[0]):
                best = (score, row["step"] + self.initial_step)
        return best

    # -- the end ------------------------------------------------------------------------------------------------
    def finish(self) -> None:
        extra: dict[str, Any] = {"train_seconds": round(time.time() - self.started, 1)}
        if self.chief and self.recipe.export.hf:
            steps = self._complete_steps()
            chosen = self.best[1] if self.best is not None and self.best[1] in steps else (max(steps) if steps else None)
            if chosen is not None:
                self.beat(phase="export")
                out = export_hf(self.ctx, self.model_dir, chosen, self.recipe.export.dtype)
                extra["exported_from"] = LAYOUT.checkpoint_format.format(step=chosen)
                self.say(f"Hugging Face export of {extra['exported_from']}: {out}")
        self.beat(self.recipe.train.steps, "finished", phase="step", **extra)


# ----------------------------------------------------------------------------------------------------------------
# Hooks into T5X (installed once per process)


def _install_hooks() -> None:
    import seqio
    from clu import metric_writers
    from t5x import checkpoints as checkpoints_lib
    from t5x import trainer as trainer_lib

    if getattr(trainer_lib, "_tpuft_hooked", False):
        return
    trainer_lib._tpuft_hooked = True

    class TpuftWriter(metric_writers.MultiWriter):
        """Host 0's metric writer for one T5X metrics collection (``train``, or a task's teacher-forced eval)."""

        def __init__(self, name: str) -> None:
            super().__init__([])
            self.collection = name

        def write_scalars(self, step: int, scalars: Any) -> None:
            if _ACTIVE is None:
                return
            if self.collection == "train":
                _ACTIVE.on_train_scalars(int(step), dict(scalars))
            else:
                _ACTIVE.on_eval_scalars(int(step), dict(scalars))

    def create_writer(self: Any, name: str, summary_dir: str | None = None) -> Any:
        return TpuftWriter(name)

    trainer_lib.MetricsManager._create_writer = create_writer

    original_train = trainer_lib.BaseTrainer.train

    def train(self: Any, batch_iter: Any, num_steps: int, start_step: int | None = None) -> Any:
        start = int(start_step if start_step is not None else self.train_state.step)
        first = not getattr(self, "_tpuft_warm", False)
        self._tpuft_warm = True

        def beating() -> Any:
            for offset in range(num_steps):
                batch = next(batch_iter)
                if _ACTIVE is not None:
                    _ACTIVE.on_batch(start + offset, first and offset == 0, batch)
                yield batch

        return original_train(self, beating(), num_steps, start_step=start_step)

    trainer_lib.BaseTrainer.train = train

    def in_phase(method: Any, phase: str) -> Any:
        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _ACTIVE is not None:
                _ACTIVE.beat(phase=phase)
            try:
                return method(self, *args, **kwargs)
            finally:
                if _ACTIVE is not None:
                    _ACTIVE.beat(phase="step")

        return wrapped

    # Evaluations are long and quiet (decoding every held-out example): the supervisor gives them more time.
    trainer_lib.BaseTrainer.eval = in_phase(trainer_lib.BaseTrainer.eval, "eval")
    seqio.Evaluator.evaluate = in_phase(seqio.Evaluator.evaluate, "eval")

    manager = checkpoints_lib.OrbaxCheckpointManagerInterface
    original_save = manager.save

    def save(self: Any, train_state: Any, state_transformation_fns: Any = (), force: bool = True) -> bool:
        from t5x import utils

        step = int(utils.get_local_data(train_state.step))
        if _ACTIVE is not None:
            _ACTIVE.beat(phase="checkpoint")
        saved = original_save(self, train_state, state_transformation_fns, force)
        if saved:
            self.wait_until_finished()
            if _ACTIVE is not None:
                _ACTIVE.on_checkpoint_saved(step)
                _ACTIVE.beat(phase="step")
        return saved

    manager.save = save


class EvalLogger:
    """A seqio logger (bound in the run gin): the inference eval's metrics and decoded predictions to tpuft."""

    def __init__(self, output_dir: str | None = None) -> None:
        self.output_dir = output_dir

    def __call__(self, task_name: str, step: int | None, metrics: Any, dataset: Any, inferences: Any, targets: Any) -> None:
        if _ACTIVE is None or not _ACTIVE.chief or step is None:
            return
        values = {name: getattr(value, "value", value) for name, value in (metrics or {}).items()}
        outputs = list((inferences or {}).get("output", []))
        predictions = []
        inputs = []
        if dataset is not None:
            for example in dataset.as_numpy_iterator():
                text = example.get("inputs_pretokenized")
                inputs.append(text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text))
                if len(inputs) >= len(outputs):
                    break
        for index, output in enumerate(outputs):
            target = targets[index] if targets is not None and index < len(targets) else None
            predictions.append({"input": inputs[index] if index < len(inputs) else None, "prediction": _text(output),
                                "target": _text(target)})
        _ACTIVE.on_inference_eval(int(step), values, predictions)


def exit_on_sigterm() -> None:
    """Stop at once on SIGTERM (``tpuft stop``, or the supervisor stopping this host because a peer failed).

    JAX's distributed runtime takes SIGTERM as a preemption notice that T5X never asks about at the pinned commit, so
    the process would run on until the supervisor's SIGKILL; and a host whose peer died is blocked inside a
    collective, where a Python signal handler never gets to run. So SIGTERM is blocked in every thread (threads
    started later inherit the mask) and taken by one thread that waits for it and exits the process. A checkpoint
    being written is left in its temporary folder, which Orbax and tpuft ignore."""
    import signal
    import threading

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        signal.sigwait({signal.SIGTERM})
        print("[tpuft] SIGTERM: stopping this host's trainer", flush=True)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait, name="tpuft-sigterm", daemon=True).start()


def _run_t5x_train(gin_file: Path) -> None:
    """``python -m t5x.train --gin_file=...`` in this process: gin binds ``__main__.train``, so the module must
    run as ``__main__``; absl ends it with ``sys.exit``."""
    import logging

    # One warning per parameter that Adafactor does not factor (all of a small model's): noise in a worker's log.
    logging.getLogger("absl").addFilter(lambda record: "falls back to heuristics" not in record.getMessage())
    argv = sys.argv
    sys.argv = ["t5x.train", f"--gin_file={gin_file}", "--verbosity=-1"]  # absl: warnings and up
    try:
        runpy.run_module("t5x.train", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code not in (None, 0):
            raise
    finally:
        sys.argv = argv


# ----------------------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested against real gin and seqio)


def task_name(run_id: str) -> str:
    return "tpuft_" + re.sub(r"[^A-Za-z0-9_]", "_", run_id)


def initial_step(recipe: RecipeConfig) -> int:
    backend = recipe.backend
    if backend.initial_checkpoint is None:
        return 0
    if backend.initial_step is not None:
        return backend.initial_step
    return checkpoint_step(backend.initial_checkpoint) or 0


def tasks_module(spec: dict[str, Any]) -> str:
    return (
        '"""The seqio task of this tpuft run (generated from its recipe; see tpuft/worker/t5x_tasks.py)."""\n\n'
        "from tpuft.worker.t5x_tasks import register\n\n"
        f"TASK = register({pprint.pformat(spec, indent=4, sort_dicts=True)})\n"
    )


def learning_rate_bindings(recipe: RecipeConfig, initial: int) -> dict[str, Any]:
    """tpuft's schedule over this run's steps as T5X's ``create_learning_rate_scheduler`` factors, offset by the
    initial checkpoint's step (T5X's step is absolute)."""
    train = recipe.train
    peak, warmup, steps = train.learning_rate, train.warmup_steps, train.steps
    prefix = "utils.create_learning_rate_scheduler"
    if train.schedule == "linear":
        warm = max(warmup, 1)
        bindings = {"factors": "linear_decay", "base_learning_rate": peak, "warmup_steps": warm,
                    "decay_factor": 1.0 / max(steps - warm, 1)}  # fmt: skip
    elif train.schedule == "cosine":  # T5X's cosine factor decays from the end of the warm-up to the last step
        bindings = {"factors": "constant * linear_warmup * cosine_decay" if warmup else "constant * cosine_decay",
                    "base_learning_rate": peak, "warmup_steps": max(warmup, 1),
                    "steps_per_cycle": max(steps - warmup, 1)}  # fmt: skip
    elif train.schedule == "inverse_sqrt":
        bindings = {"factors": "constant * rsqrt_normalized_decay", "base_learning_rate": peak, "warmup_steps": max(warmup, 1)}
    else:
        bindings = {"factors": "constant * linear_warmup" if warmup else "constant", "base_learning_rate": peak,
                    "warmup_steps": max(warmup, 1)}  # fmt: skip
    bindings["step_offset"] = initial
    return {f"{prefix}.{key}": value for key, value in bindings.items()}


def run_gin(recipe: RecipeConfig, spec: dict[str, Any], *, model_dir: str, initial_step: int, cpu: bool,
            resumed_at: int = 0) -> str:
    """The run's gin: the model gin(s), T5X's fine-tuning run gin, then every binding the recipe implies, then the
    user's ``gin_overrides`` (last, so they win).

    The training data's shuffle seed is ``train.seed`` (T5X's default draws a new one from the clock), plus the step
    a resumed run starts at: T5X does not checkpoint a seqio pipeline's position, so a resumed run reads the data in
    a new order (rather than again from the start of the same one) that is still reproducible."""
    backend, train, data, evaluation = recipe.backend, recipe.train, recipe.data, recipe.eval
    includes = list(backend.gin_files) or list(model_gins(backend.family, backend.size) or ())
    has_eval = backend.task == "finetune" and data.eval is not None
    inputs_length = data.max_source_length
    targets_length = data.max_target_length
    if backend.task == "span_corruption":
        from tpuft.worker.t5x_tasks import random_spans_helper

        needed = random_spans_helper(inputs_length, backend.noise_density, backend.mean_noise_span_length)[1]
        targets_length = max(targets_length, needed)
    if backend.loss_normalizing_factor == "auto":
        factor = None
        if backend.initial_checkpoint is not None and backend.task == "finetune" and backend.family is not None:
            factor = PRETRAINING_LOSS_FACTOR.get(backend.family)
    else:
        factor = backend.loss_normalizing_factor
    vocab = spec["vocabulary"]
    if vocab == "byt5":
        vocabulary = {"seqio.ByteVocabulary.extra_ids": spec["extra_ids"]}
    else:
        vocabulary = {"seqio.SentencePieceVocabulary.sentencepiece_model_file": vocab,
                      "seqio.SentencePieceVocabulary.extra_ids": spec["extra_ids"]}  # fmt: skip
    binds: dict[str, Any] = {
        "MODEL_DIR": model_dir,
        "MIXTURE_OR_TASK_NAME": spec["name"],
        "TASK_FEATURE_LENGTHS": {"inputs": inputs_length, "targets": targets_length},
        "TRAIN_STEPS": initial_step + train.steps,
        "INITIAL_CHECKPOINT_PATH": backend.initial_checkpoint,
        "USE_CACHED_TASKS": False,
        "BATCH_SIZE": train.batch_size,
        "RANDOM_SEED": train.seed,
        "train/utils.DatasetConfig.seed": train.seed + resumed_at,
        "LOSS_NORMALIZING_FACTOR": factor,
        "EVAL_PERIOD": evaluation.every or train.steps,
        "EVALUATOR_NUM_EXAMPLES": evaluation.max_examples,
        "train_script.train.stats_period": train.log_every,
        "utils.SaveCheckpointConfig.period": train.checkpoint_every or train.steps,
        "utils.SaveCheckpointConfig.keep": None,  # tpuft prunes: the last ones and the best
        "trainer.Trainer.num_microbatches": backend.num_microbatches,
        "partitioning.PjitPartitioner.num_partitions": backend.num_partitions,
        "network.T5Config.dtype": backend.dtype or ("float32" if cpu else "bfloat16"),
        "seqio.Evaluator.logger_cls": ["@seqio.PyLoggingLogger", "@t5x_train.EvalLogger"],
        "infer_eval/utils.DatasetConfig.batch_size": evaluation.batch_size,
        "EVAL_STEPS": -(-evaluation.max_examples // train.batch_size) if evaluation.max_examples else 20,
    }
    if recipe.model.dropout is not None:
        binds["DROPOUT_RATE"] = recipe.model.dropout
    if train.weight_decay:
        binds["adafactor.Adafactor.weight_decay_rate"] = train.weight_decay
    if train.max_grad_norm is not None:
        binds["adafactor.Adafactor.global_norm_clip_threshold"] = train.max_grad_norm
    if not has_eval:
        binds["train_script.train.train_eval_dataset_cfg"] = None
        binds["train_script.train.infer_eval_dataset_cfg"] = None
    binds.update(learning_rate_bindings(recipe, initial_step))
    network = network_module(backend.family, [_read_text(path) for path in backend.gin_files])
    if network is None:
        binds.pop("network.T5Config.dtype")  # the user's gin names its own network module: dtype is theirs to bind
    imports = dict(GIN_IMPORTS)
    if network is not None:
        imports["network"] = network
    lines = [
        "# Generated by tpuft for this run from its recipe; T5X reads it as --gin_file.",
        "from __gin__ import dynamic_registration",
        "import __main__ as train_script",
        "import seqio",
        *(f"from {module.rsplit('.', 1)[0]} import {name}" for name, module in imports.items() if name != "seqio"),
        "",
    ]
    lines += [f"include {path!r}" for path in includes]
    lines += ["include 't5x/configs/runs/finetune.gin'", ""]
    lines += [f"VOCABULARY = @{next(iter(vocabulary)).rsplit('.', 1)[0]}()"]
    lines += [f"{name} = {gin_value(value)}" for name, value in vocabulary.items()]
    lines += [f"{name} = {gin_value(value)}" for name, value in binds.items()]
    if backend.gin_overrides:
        lines += ["", "# backend.gin_overrides"]
        lines += [f"{qualify(name, imports)} = {gin_value(value)}" for name, value in backend.gin_overrides.items()]
    return "\n".join(lines) + "\n"


GIN_IMPORTS = {
    "seqio": "seqio",
    "adafactor": "t5x.adafactor",
    "models": "t5x.models",
    "partitioning": "t5x.partitioning",
    "trainer": "t5x.trainer",
    "utils": "t5x.utils",
    "t5x_train": "tpuft.worker.t5x_train",
}
"""Modules the run gin imports (gin's dynamic registration needs every configurable's module imported)."""


def network_module(family: str | None, user_gins: list[str]) -> str | None:
    """The module whose ``T5Config`` the model gin configures: t5x's T5 network for t5_1_0/t5_1_1/mt5/byt5, the
    scalable one for umt5, or whatever the user's gin imports as ``network``."""
    if family == "umt5":
        return "t5x.examples.scalable_t5.network"
    if family is not None:
        return "t5x.examples.t5.network"
    for text in user_gins:
        match = re.search(r"^from\s+([\w.]+)\s+import\s+network\s*$", text, re.MULTILINE)
        if match:
            return f"{match.group(1)}.network"
    return None


def qualify(binding: str, imports: dict[str, str]) -> str:
    """``PjitPartitioner.num_partitions`` -> ``partitioning.PjitPartitioner.num_partitions``: under dynamic
    registration a binding names its module; the short form users copy from T5X's docs is given the imported module
    that has that name."""
    scope, _, name = binding.rpartition("/")
    head = name.split(".", 1)[0]
    if head in imports or "." not in name or head.isupper():
        return binding
    import importlib

    for alias, module in imports.items():
        try:
            if hasattr(importlib.import_module(module), head):
                return f"{scope + '/' if scope else ''}{alias}.{name}"
        except ImportError:
            continue
    return binding


def _read_text(path: str) -> str:
    if path.startswith("gs://"):
        import tensorflow as tf

        with tf.io.gfile.GFile(path) as handle:
            return handle.read()
    return Path(path).read_text(encoding="utf-8")


def batch_counts(batch: Any) -> tuple[int, int, int]:
    """(rows, examples, real tokens) of this host's part of a T5X batch. A packed row holds one example per decoder
    segment id (1, 2, ...; 0 is padding); an unpacked one, one example if its targets are not all padding."""
    import numpy as np

    def local(array: Any) -> Any:
        """This host's rows: on a pod the batch is a global jax.Array whose other shards live on other hosts."""
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


def eval_score(row: dict[str, Any]) -> float | None:
    """Higher is better: the metric that ranks a run's evaluations everywhere (``rundir.BEST_METRICS``: exact match,
    else accuracy, else token accuracy, else the eval loss), negated where lower is better; the shared ranking of
    ``tpuft.worker.selection`` (T5X's teacher-forced and inference evaluations are separate rows, so it keeps the
    default ranking rather than ``eval.metric``)."""
    from tpuft.worker.selection import score

    return score(row)


def write_manifest(folder: str) -> None:
    """tpuft's manifest for a checkpoint folder, local or gs:// (listed through TensorFlow's gfile)."""
    if not folder.startswith("gs://"):
        LAYOUT.write_manifest(Path(folder))
        return
    import tensorflow as tf

    from tpuft.backends.base import manifest_text

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


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "tolist"):
        return value.tolist()
    return value
