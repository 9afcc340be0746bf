"""TF Keras trainer: a Hugging Face TF model trained with ``model.fit`` under a ``tf.distribute`` strategy.

Reads top to bottom: ``KerasRun.setup()`` picks the strategy, writes the data as TFRecords and builds the
model and optimizer in the strategy's scope; ``train()`` is one ``model.fit``. What happens after a step and
at the end (rows, heartbeats, evaluations judged, checkpoints, requests, ``train.time_limit``, the test
evaluation, the export, ``finished``) is the run sequencer's (:mod:`tpuft.worker.loop.sequencer`): ``fit``'s
callback (:func:`run_callback`) hands it each step boundary, and this class supplies the acts it asks for
(``progress``, ``evaluate``, ``save``, ``test``: ``tpuft/worker/keras/testset.py``, ``digest``, ``export``,
``agree``, ``settle``).

Strategy (``tpuft/backends/keras.py`` says where the program runs):
- local CPU pod: ``MultiWorkerMirroredStrategy`` with ``TF_CONFIG`` built from ``TPUFT_PEERS``; every worker
  runs this trainer on its own shard, gradients are all-reduced by TF's collectives. A worker with several
  devices (``local.devices_per_worker``) makes them logical CPU devices, each a replica
  (``tpuft/worker/keras/devices.py``).
- TPU: ``TPUStrategy`` over every core of the slice, from worker 0 alone (``TPUFT_TPU_HOSTS`` hosts).

The training step is our own ``train_step`` inside ``fit`` (``tpuft/worker/keras/parts.py``;
``steps_per_execution`` runs that many steps on the device per call from Python): the loss of a replica is its
summed token (or example) losses divided by the global count, so that summing gradients over replicas gives
the gradient of the global mean; ``train.grad_accum_steps`` sums the gradients of that many micro-batches of
each replica's batch before the one update; gradients are all-reduced explicitly, clipped by their global
norm, and applied without a second aggregation. Eval metrics (loss, token accuracy, exact match with teacher
forcing: every target position's argmax right, EOS included; classification accuracy) are sums in
SUM-synchronised Keras metrics, so they are computed on the device and exact over replicas.

Data (``tpuft/worker/keras/data.py``): each replica's examples are tokenized once and written as TFRecords
with static shapes; ``tf.data`` shuffles them per epoch with the run's seed, and a resumed run skips the
batches its checkpoint had consumed.

Checkpoints: ``checkpoints/step_N`` holds the HF model (``tf_model.h5`` + config + tokenizer), the optimizer's
variables (``optimizer.npz``, in the optimizer's own order) and ``trainer_state.json``, then
``manifest.json``. ``train.keep_best`` keeps the best by the eval metric besides the last
``keep_checkpoints``; early stopping stops every replica at the same evaluation (the metric is the same on all
of them).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from tpuft import data as data_mod
from tpuft.backends.keras_schema import LAYOUT, KerasBackend
from tpuft.config import RecipeConfig
from tpuft.worker.context import WorkerContext
from tpuft.worker.export import export_hf
from tpuft.worker.hf_data import has_held_out
from tpuft.worker.keras import (
    adafactor as keras_adafactor,
)
from tpuft.worker.keras import (
    generate as keras_generate,
)
from tpuft.worker.keras import (
    layers as keras_layers,
)
from tpuft.worker.keras import (
    model as keras_model,
)
from tpuft.worker.keras import (
    prompt as keras_prompt,
)
from tpuft.worker.keras import (
    testset as keras_test,
)
from tpuft.worker.keras.data import RecordData
from tpuft.worker.keras.parts import (
    build_trainable,
    epoch_length,
    eval_row,
    make_schedule,
    restore_optimizer,
    save_optimizer,
    weights_digest,
)
from tpuft.worker.loop import RunLoop, sequencer
from tpuft.worker.ondemand import CheckpointRequests

OPTIMIZER_STATE = "optimizer.npz"


def main(ctx: WorkerContext, recipe: RecipeConfig) -> int:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # transformers' TF models need Keras 2 (tf-keras)
    return KerasRun(ctx, recipe).run()


class KerasRun:
    def __init__(self, ctx: WorkerContext, recipe: RecipeConfig) -> None:
        assert isinstance(recipe.backend, KerasBackend)
        self.ctx = ctx
        self.recipe = recipe
        self.backend: KerasBackend = recipe.backend
        self.classify = self.backend.task == "classification"
        self.tpu_hosts = keras_model.tpu_hosts()
        self.loop = RunLoop(ctx, recipe, LAYOUT, chief=ctx.chief)
        self.say = self.loop.say

    def run(self) -> int:
        self.setup()
        try:
            self.train()
            self.finish()
        finally:
            if self.loop.metrics is not None:
                self.loop.metrics.close()
        return 0

    # -- setup ----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        loop = self.loop
        loop.beat(loop.find_checkpoint(), phase="starting")
        import tensorflow as tf

        self.tf = tf
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cpus and not self.tpu_hosts:
            tf.config.threading.set_intra_op_parallelism_threads(len(cpus))
            tf.config.threading.set_inter_op_parallelism_threads(2)
        self.strategy = keras_model.make_strategy(tf, self.ctx, self.tpu_hosts)
        self.replicas = self.strategy.num_replicas_in_sync
        precision = keras_model.set_precision(tf, self.backend, self.tpu_hosts, self.recipe.train.precision)
        transformers = keras_model.quiet_transformers()
        self.say(
            f"worker {self.ctx.worker_id}/{self.ctx.num_workers}: {type(self.strategy).__name__} with "
            f"{self.replicas} replicas, {precision} (tensorflow {tf.__version__}, transformers "
            f"{transformers.__version__})"
        )
        self.checkpoint = loop.load_checkpoint().checkpoint
        self.tokenizer = data_mod.load_tokenizer(self.recipe.model.tokenizer)
        self.data = RecordData(
            tf,
            self.ctx,
            self.recipe,
            self.tokenizer,
            classify=self.classify,
            replicas=self.replicas,
            tpu_hosts=self.tpu_hosts,
            say=self.say,
        )
        self.data.prepare()
        loop.has_eval = bool(self.data.eval_files)
        loop.has_test = has_held_out(self.recipe.data, "test")
        tf.keras.utils.set_random_seed(self.recipe.train.seed)  # identical initial weights on every replica
        with self.strategy.scope():
            self._setup_model()
            self._setup_optimizer()

    # -- model and optimizer --------------------------------------------------------------------------------
    def _setup_model(self) -> None:
        tf = self.tf
        source = self.checkpoint or self.recipe.model.name_or_path  # pretrained weights, or None: random init
        hf = keras_model.build_hf_model(self.recipe, self.tokenizer, source)
        # freeze, recompute
        keras_layers.apply(tf, hf, self.recipe.model, classify=self.classify, say=self.say)
        # model.prompt_tuning: a soft prompt, T5 frozen
        hf = keras_prompt.wrap(tf, hf, self.recipe, self.checkpoint)
        start = 0 if self.classify else int(hf.config.decoder_start_token_id)
        self.model = build_trainable(
            tf,
            hf,
            classify=self.classify,
            start_token=start,
            clip_norm=self.recipe.train.max_grad_norm,
            accum_steps=self.recipe.train.grad_accum_steps,
            label_smoothing=self.recipe.train.label_smoothing,
        )
        self.model.distribute_reduction_method = "first"  # what train/test steps return is global already
        self.model.build_all(self.recipe.data)
        count = sum(int(tf.size(v)) for v in hf.weights)
        trained = sum(int(tf.size(v)) for v in hf.trainable_variables)
        origin = source or "random init"
        self.say(
            f"model: {type(hf).__name__}, {count / 1e6:.2f}M parameters, {trained / 1e6:.3f}M trained "
            f"({origin})"
        )

    def _setup_optimizer(self) -> None:
        tf = self.tf
        train = self.recipe.train
        self.schedule = schedule = make_schedule(
            tf, train.learning_rate, train.steps, train.warmup_steps, train.schedule
        )
        optimizer = keras_adafactor.make_optimizer(tf, train, schedule)
        self.model.compile(optimizer=optimizer, steps_per_execution=self.backend.steps_per_call(self.recipe))
        optimizer.build(self.model.hf.trainable_variables)
        if self.checkpoint is not None:
            restore_optimizer(optimizer, self.checkpoint / OPTIMIZER_STATE)
        self.optimizer = optimizer

    # -- training -------------------------------------------------------------------------------------------
    def train(self) -> None:
        loop, data = self.loop, self.data
        train, evaluation = self.recipe.train, self.recipe.eval
        epoch = epoch_length(
            train.steps, evaluation.every if loop.has_eval else None, train.checkpoint_every, loop.start_step
        )
        self.epoch = epoch
        strategy = self.strategy
        dataset = strategy.distribute_datasets_from_function(
            data.dataset_fn(data.train_files, data.local_batch, train=True, skip_steps=loop.start_step)
        )
        self.eval_dataset = None  # the held-out set, for fit's periodic evaluations and the final one
        if loop.has_eval:
            self.eval_dataset = strategy.distribute_datasets_from_function(
                data.dataset_fn(data.eval_files, data.eval_batch, train=False)
            )
        validation = self.eval_dataset if evaluation.every else None
        validation_freq = max((evaluation.every or epoch) // epoch, 1)
        first, last = loop.start_step // epoch, train.steps // epoch
        requests = sequencer.begin(
            loop,
            line=f"training steps {loop.start_step + 1} to {train.steps}"
            if loop.start_step
            else f"training for {train.steps} steps ({self.backend.steps_per_call(self.recipe)} per "
            "execution)",
        )
        callback = run_callback(self, requests)
        if first < last:
            self.model.fit(
                dataset,
                epochs=last,
                initial_epoch=first,
                steps_per_epoch=epoch,
                callbacks=[callback],
                verbose=0,
                validation_data=validation,
                validation_steps=data.eval_batches or None,
                validation_freq=validation_freq,
            )

    # -- the acts the sequencer asks for -------------------------------------------------------------------
    def progress(self) -> tuple[float, float, float]:
        """The window's mean loss, its last step's rate, its tokens; the window's trackers start again."""
        model = self.model
        loss, tokens = float(model.loss_tracker.result()), float(model.token_tracker.result())
        model.loss_tracker.reset_state()
        model.token_tracker.reset_state()
        return loss, float(self.schedule(self.loop.step - 1)), tokens

    def evaluate(self) -> dict[str, Any]:
        if self.eval_dataset is None:
            return {}
        sums = self.model.evaluate(
            self.eval_dataset, steps=self.data.eval_batches, verbose=0, return_dict=True
        )
        return self.eval_result(sums)

    def eval_result(self, sums: dict[str, Any]) -> dict[str, Any]:
        """The eval row of the eval sums (``fit``'s or :meth:`evaluate`'s), with the decodes' scores."""
        return {**eval_row(sums, classify=self.classify), **keras_generate.eval_scores(self)}

    def agree(self, flag: bool) -> bool:
        """Any worker's ``flag``, on every worker (an all-reduce of one number; one process: no
        collective)."""
        if self.ctx.num_workers == 1 or self.tpu_hosts:
            return flag
        tf = self.tf
        value = 1.0 if flag else 0.0
        return (
            float(self.strategy.reduce("SUM", self.strategy.run(lambda: tf.constant(value)), axis=None)) > 0
        )

    def settle(self) -> None:
        """A barrier (an all-reduce of one number) at the end: a worker of a MultiWorkerMirrored run that
        exits while the chief still saves and exports is seen by TF's coordination service as crashed, which
        aborts the chief."""
        if self.ctx.num_workers > 1 and not self.tpu_hosts:
            tf = self.tf
            self.loop.beat(self.loop.step, phase="export")  # waiting for the chief's export, not hung
            self.strategy.reduce("SUM", self.strategy.run(lambda: tf.constant(1.0)), axis=None)

    def save(self, step: int) -> Path | None:
        """The chief writes ``checkpoints/step_N`` (the loop's temp folder, trainer state, manifest and
        pruning); the other replicas hold the same weights and wait for the chief in their next collective:
        their heartbeat says ``checkpoint`` too, so that their supervisor is as patient as the chief's."""
        self.loop.beat(step, phase="checkpoint")

        def write(folder: Path) -> None:
            self.model.hf.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
            save_optimizer(self.optimizer, folder / OPTIMIZER_STATE)

        return self.loop.save_checkpoint(step, write, backend="keras", replicas=self.replicas)

    def test(self, folder: Path | None) -> dict[str, Any]:
        return keras_test.evaluate(self, folder)

    def digest(self) -> str:
        for line in keras_generate.sample_lines(getattr(self, "last_decodes", [])):
            self.say(f"sample: {line}")
        digest = weights_digest(self.model.hf)
        self.say(f"weights sha256 {digest[:16]} (worker {self.ctx.worker_id})", everyone=True)
        return digest

    def export(self, source: Path) -> None:
        out = export_hf(self.ctx, source, self.recipe.export.dtype)
        self.say(f"Hugging Face export: {out}")
        if self.recipe.model.prompt_tuning is not None:  # beside the HF dir: the frozen model plus this file
            shutil.copyfile(source / keras_prompt.PROMPT_FILE, out.parent / keras_prompt.PROMPT_FILE)
            self.say(f"soft prompt: {out.parent / keras_prompt.PROMPT_FILE}")

    def finish(self) -> None:
        sequencer.finish(self.loop, self, say_export_source=True, settle=self.settle)

    @property
    def chief(self) -> bool:
        return self.loop.chief


def run_callback(run: KerasRun, requests: CheckpointRequests) -> Any:
    """``fit``'s step boundaries handed to the sequencer: after each execution its step (the row on
    ``log_every``, the heartbeat) and, off an epoch's end, the rest of the boundary (requests, the time
    limit); at an epoch's end the boundary with the evaluation ``fit`` has just made, if any. A stop (early,
    or the time limit) ends ``fit``. A tf.keras Callback, its class made here so that this module imports
    without TensorFlow."""
    tf = run.tf
    loop = run.loop

    class Callback(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.params_epoch = 0
            self.eval_started = time.time()
            self.ended = False

        def end_if(self, stop: bool) -> None:
            if stop:
                self.ended = True
                run.model.stop_training = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = self.params_epoch * run.epoch + batch + 1
            sequencer.step_done(loop, step, run, phase="step", time_first_step=False)
            if step % run.epoch:  # an epoch's end waits for fit's evaluation: on_epoch_end
                self.end_if(sequencer.boundary(loop, step, run, requests, evaluate_when_due=False))

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.params_epoch = epoch

        def on_test_begin(self, logs: Any = None) -> None:
            loop.beat(loop.step, phase="eval")
            self.eval_started = time.time()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self.ended:  # fit may evaluate after a stop: training has ended already
                return
            logs = logs or {}
            evaluation = None
            if "val_loss_sum" in logs:
                sums = {k.removeprefix("val_"): v for k, v in logs.items() if k.startswith("val_")}
                evaluation = (run.eval_result(sums), time.time() - self.eval_started)
            stop = sequencer.boundary(
                loop, loop.step, run, requests, evaluation=evaluation, evaluate_when_due=False
            )
            self.end_if(stop)

    return Callback()
