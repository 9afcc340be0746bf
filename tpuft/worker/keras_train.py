"""TF Keras trainer: a Hugging Face TF model trained with ``model.fit`` under a ``tf.distribute`` strategy.

Reads top to bottom: ``KerasRun.setup()`` picks the strategy, writes the data as TFRecords and builds the model and
optimizer in the strategy's scope; ``train()`` is one ``model.fit``; ``finish()`` evaluates, checkpoints, exports to
Hugging Face (PyTorch) format and records the weight digest.

Strategy (``tpuft/backends/keras.py`` says where the program runs):
- local CPU pod: ``MultiWorkerMirroredStrategy`` with ``TF_CONFIG`` built from ``TPUFT_PEERS``; every worker runs
  this trainer on its own shard, gradients are all-reduced by TF's collectives.
- TPU: ``TPUStrategy`` over every core of the slice, from worker 0 alone (``TPUFT_TPU_HOSTS`` hosts).

The training step is our own ``train_step`` inside ``fit`` (so ``steps_per_execution`` runs that many steps on the
device per call from Python): the loss of a replica is its summed token (or example) losses divided by the global
count, so that summing gradients over replicas gives the gradient of the global mean; gradients are all-reduced
explicitly, clipped by their global norm, and applied without a second aggregation. Eval metrics (loss, token
accuracy, exact match with teacher forcing: every target position's argmax right, EOS included; classification
accuracy) are sums in SUM-synchronised Keras metrics, so they are computed on the device and exact over replicas.

Shapes are static: inputs are padded to ``max_source_length``/``max_target_length``, batches ``drop_remainder``,
and the eval set is padded with weight-0 rows to a whole number of global batches.

Data: each replica's examples are tokenized once and written as TFRecords (``run_dir/data``; on a pod slice into the
run's bucket, since the input pipelines run on every host); ``tf.data`` shuffles them per epoch with the run's seed.
A resumed run skips the batches its checkpoint had consumed, so it sees the data the original would have.

Checkpoints: ``checkpoints/step_N`` holds the HF model (``tf_model.h5`` + config + tokenizer), the optimizer's
variables (``optimizer.npz``, in the optimizer's own order) and ``trainer_state.json``, then ``manifest.json``.
``train.keep_best`` keeps the best by the eval metric besides the last ``keep_checkpoints``; early stopping stops
every replica at the same evaluation (the metric is the same on all of them).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tpuft import rundir
from tpuft.backends.keras import LAYOUT, KerasBackend
from tpuft.config import RecipeConfig
from tpuft.errors import UsageError
from tpuft.worker import data as data_mod
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import Heartbeat
from tpuft.worker.resume import TRAINER_STATE, find_resume_checkpoint, load_resume_point, open_metrics, resuming
from tpuft.worker.selection import Selector

OPTIMIZER_STATE = "optimizer.npz"
IGNORE = -100
"""Label of a padded target position (no loss, not counted)."""


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
        self.tpu_hosts = int(os.environ.get("TPUFT_TPU_HOSTS", "0"))
        self.chief = ctx.chief
        self.heartbeat = Heartbeat(ctx.run_dir, ctx.worker_id, recipe.train.steps)
        self.resuming = resuming()
        self.stopped_early: str | None = None
        self.last_eval_step = -1
        self.last_eval: dict[str, float] = {}

    # -- setup ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        try:
            self.train()
            self.finish()
        finally:
            self.metrics.close()
        return 0

    def say(self, message: str, *, everyone: bool = False) -> None:
        if everyone or self.chief:
            print(f"[tpuft] {message}", flush=True)

    def beat(self, step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        self.heartbeat.beat(step, status, phase, **extra)

    def setup(self) -> None:
        found = find_resume_checkpoint(self.ctx, LAYOUT) if self.resuming else None
        self.start_step = found[0] if found else 0
        self.beat(self.start_step, phase="starting")
        import tensorflow as tf

        self.tf = tf
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if cpus and not self.tpu_hosts:
            tf.config.threading.set_intra_op_parallelism_threads(len(cpus))
            tf.config.threading.set_inter_op_parallelism_threads(2)
        self.strategy = self._strategy()
        self.replicas = self.strategy.num_replicas_in_sync
        precision = self.backend.precision
        if precision == "auto":
            precision = "mixed_bfloat16" if self.tpu_hosts else "float32"
        tf.keras.mixed_precision.set_global_policy(precision)
        import warnings

        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()  # "TF classes are deprecated", once per worker
        warnings.filterwarnings("ignore", message="The initializer .* is unseeded")  # seeded globally above
        self.say(
            f"worker {self.ctx.worker_id}/{self.ctx.num_workers}: {type(self.strategy).__name__} with "
            f"{self.replicas} replicas, {precision} (tensorflow {tf.__version__}, transformers {transformers.__version__})"
        )
        start = load_resume_point(self.ctx, LAYOUT, found, self.recipe.train.steps, self.say)
        self.checkpoint, self.trainer_state = start.checkpoint, start.state
        self.metrics = open_metrics(self.ctx, chief=self.chief, restart_at=self.start_step if self.resuming else None)
        self.tokenizer = data_mod.load_tokenizer(self.recipe.model.tokenizer)
        self._setup_data()
        tf.keras.utils.set_random_seed(self.recipe.train.seed)  # identical initial weights on every replica
        with self.strategy.scope():
            self._setup_model()
            self._setup_optimizer()

    def _strategy(self) -> Any:
        tf = self.tf
        if self.tpu_hosts:
            # One host: its own chips. A pod slice: the node by name; the other hosts serve the TPU runtime.
            name = "local" if self.tpu_hosts == 1 else os.environ.get("TPU_NAME") or os.environ["TPUFT_NODE"]
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver)
        if self.ctx.num_workers > 1:
            peers = os.environ.get("TPUFT_PEERS", "").split(",")
            if len(peers) != self.ctx.num_workers:
                raise RuntimeError(f"TPUFT_PEERS names {len(peers)} workers, the run has {self.ctx.num_workers}")
            os.environ["TF_CONFIG"] = json.dumps(
                {"cluster": {"worker": peers}, "task": {"type": "worker", "index": self.ctx.worker_id}}
            )
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            )
            return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        return tf.distribute.OneDeviceStrategy("/cpu:0")

    # -- data -------------------------------------------------------------------------------------------------
    def _setup_data(self) -> None:
        """Tokenize this program's examples once, into TFRecords that tf.data reads (the same on CPU and TPU)."""
        cfg = self.recipe.data
        train = self.recipe.train
        self.local_batch = train.batch_size // self.replicas  # per replica
        self.eval_batch = self.recipe.eval.batch_size // self.replicas
        # MWMS: one program per worker, each on its shard. TPU: one program feeds every replica.
        rank, world = (0, 1) if self.tpu_hosts else (self.ctx.worker_id, self.ctx.num_workers)
        fields = data_mod.Fields.of(cfg)
        train_examples = data_mod.load_shard(cfg.train, rank, world, fields)
        eval_examples: list[data_mod.Example] = []
        if cfg.eval is not None:
            eval_examples = list(data_mod.iter_shard(cfg.eval, rank, world, fields))
            limit = self.recipe.eval.max_examples
            if limit is not None:  # the first `limit` examples of the file, wherever their shard is
                eval_examples = eval_examples[: len(range(rank, limit, world))]
        self.eval_examples = eval_examples
        self.say(
            f"data: {len(train_examples)} train / {len(eval_examples)} eval examples on worker {self.ctx.worker_id} "
            f"(batch {self.local_batch} per replica, {train.batch_size} global"
            f"{f', {train.grad_accum_steps} micro-batches a step' if train.grad_accum_steps > 1 else ''})",
            everyone=True,
        )
        self.data_dir = self._data_dir()
        tag = f"w{self.ctx.worker_id}" if not self.tpu_hosts else "all"
        self.train_files = self._write_records(f"train-{tag}", train_examples, shards=max(self.tpu_hosts, 1))
        self.eval_files: list[str] = []
        self.eval_batches = 0
        if eval_examples:
            # Static shapes, and on the CPU pod every worker runs the same number of eval batches (their steps meet
            # in collectives): each program pads its examples with weight-0 rows to whole batches.
            total = _eval_count(cfg, self.recipe.eval.max_examples) if world > 1 else len(eval_examples)
            per_program = self.eval_batch * (self.replicas if self.tpu_hosts else 1)
            largest_share = -(-total // world)  # ceil: the worker with the most examples
            self.eval_batches = -(-largest_share // per_program)
            padding = [data_mod.Example("", "", 0)] * (self.eval_batches * per_program - len(eval_examples))
            self.eval_files = self._write_records(f"eval-{tag}", eval_examples + padding,
                                                  shards=max(self.tpu_hosts, 1), real=len(eval_examples))

    def _data_dir(self) -> str:
        if self.tpu_hosts > 1:  # the input pipelines run on every host of the slice: they read the bucket
            if not self.ctx.remote:
                raise UsageError("the Keras backend on a TPU pod slice reads its data and writes its run dir in a "
                                 "bucket (every host runs an input pipeline): give the cluster file a bucket")
            return f"{self.ctx.run_url}/data"
        return str(self.ctx.run_dir / "data")

    def _write_records(self, name: str, examples: list[data_mod.Example], *, shards: int,
                       real: int | None = None) -> list[str]:
        tf = self.tf
        cfg = self.recipe.data
        count = len(examples) if real is None else real  # the rest pad to whole batches (weight 0)
        tf.io.gfile.makedirs(self.data_dir)
        sources, masks = data_mod.encode_texts(
            self.tokenizer, [e.source for e in examples], cfg.max_source_length, cfg.truncation
        )
        if self.classify:
            targets = [[self._label_id(e)] if i < count else [0] for i, e in enumerate(examples)]
        else:
            enc = self.tokenizer([e.target for e in examples], max_length=cfg.max_target_length,
                                 padding="max_length", truncation=True)
            targets = [[t if m else IGNORE for t, m in zip(ids, mask)]
                       for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
        paths = [f"{self.data_dir}/{name}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        int_list = tf.train.Int64List
        for i, (ids, mask, target) in enumerate(zip(sources, masks, targets)):
            feature = {
                "input_ids": tf.train.Feature(int64_list=int_list(value=ids)),
                "attention_mask": tf.train.Feature(int64_list=int_list(value=mask)),
                "labels": tf.train.Feature(int64_list=int_list(value=target)),
                "weight": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0 if i < count else 0.0])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[i % shards].write(example.SerializeToString())
        for writer in writers:
            writer.close()
        if self.tpu_hosts > 1:
            self.say(f"data: {len(examples)} examples written as TFRecords to {self.data_dir}/{name}-*")
        return paths

    def _label_id(self, example: data_mod.Example) -> int:
        labels = self.recipe.data.labels
        if example.target in labels:
            return labels.index(example.target)
        if example.target.isdigit() and int(example.target) < len(labels):
            return int(example.target)
        where = f"{self.recipe.data.eval if example in self.eval_examples else self.recipe.data.train}:{example.line}"
        raise data_mod.DataError(where, f"label {example.target!r} is not one of data.labels ({', '.join(labels)}) "
                                 f"nor an index into them")

    def _parse(self, record: Any) -> Any:
        tf = self.tf
        cfg = self.recipe.data
        label_len = 1 if self.classify else cfg.max_target_length
        spec = {
            "input_ids": tf.io.FixedLenFeature([cfg.max_source_length], tf.int64),
            "attention_mask": tf.io.FixedLenFeature([cfg.max_source_length], tf.int64),
            "labels": tf.io.FixedLenFeature([label_len], tf.int64),
            "weight": tf.io.FixedLenFeature([1], tf.float32),
        }
        row = tf.io.parse_single_example(record, spec)
        out = {k: tf.cast(v, tf.int32) for k, v in row.items() if k != "weight"}
        out["weight"] = row["weight"][0]
        if self.classify:
            out["labels"] = out["labels"][0]
        return out

    def _dataset_fn(self, files: list[str], batch: int, *, train: bool, skip_steps: int = 0) -> Any:
        tf = self.tf
        seed = self.recipe.train.seed + 7919 * self.ctx.worker_id

        def make(context: Any) -> Any:
            ds = tf.data.Dataset.from_tensor_slices(files)
            if context.num_input_pipelines > 1 and self.tpu_hosts:  # one pipeline per host of the slice
                ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
            ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=1)
            ds = ds.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE)
            if train:
                ds = ds.cache()
                if self.recipe.data.shuffle:
                    ds = ds.shuffle(100_000, seed=seed, reshuffle_each_iteration=True)
                ds = ds.repeat()
            # Per-replica batches (tf.distribute hands a pipeline's batches to its replicas in turn): a resumed run
            # skips every batch its pipeline's replicas consumed before the checkpoint.
            ds = ds.batch(batch, drop_remainder=True)
            if skip_steps:
                ds = ds.skip(skip_steps * (context.num_replicas_in_sync // max(context.num_input_pipelines, 1)))
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            options.deterministic = True
            return ds.with_options(options).prefetch(2)

        return make

    # -- model and optimizer ----------------------------------------------------------------------------------
    def _setup_model(self) -> None:
        import transformers

        tf = self.tf
        model_cfg, tokenizer = self.recipe.model, self.tokenizer
        overrides: dict[str, Any] = {}
        if model_cfg.dropout is not None:
            overrides["dropout_rate" if not self.classify else "hidden_dropout_prob"] = model_cfg.dropout
        source = self.checkpoint or model_cfg.name_or_path  # pretrained weights, or None: random init
        if self.classify:
            labels = self.recipe.data.labels
            label_maps = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                          "label2id": {name: i for i, name in enumerate(labels)}}
            if source is not None:
                hf = transformers.TFAutoModelForSequenceClassification.from_pretrained(source, **label_maps, **overrides)
            else:
                settings = dict(self.backend.encoder or {})
                model_type = settings.pop("model_type")
                config = transformers.AutoConfig.for_model(
                    model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                    **settings, **label_maps, **overrides,
                )
                hf = transformers.TFAutoModelForSequenceClassification.from_config(config)
        else:
            if source is not None:
                hf = transformers.TFT5ForConditionalGeneration.from_pretrained(source, **overrides)
            else:
                assert model_cfg.config is not None
                config = transformers.T5Config(
                    vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
                    **{**model_cfg.config.kwargs(), **overrides},
                )
                hf = transformers.TFT5ForConditionalGeneration(config)
        start = 0 if self.classify else int(hf.config.decoder_start_token_id)
        self.model = build_trainable(tf, hf, classify=self.classify, start_token=start,
                                     clip_norm=self.recipe.train.max_grad_norm,
                                     accum_steps=self.recipe.train.grad_accum_steps)
        self.model.distribute_reduction_method = "first"  # what train/test steps return is global already
        self.model.build_all(self.recipe.data)
        count = sum(int(tf.size(v)) for v in hf.trainable_variables)
        origin = source or "random init"
        self.say(f"model: {type(hf).__name__}, {count / 1e6:.2f}M parameters ({origin})")

    def _setup_optimizer(self) -> None:
        tf = self.tf
        train = self.recipe.train
        self.schedule = schedule = make_schedule(tf, train.learning_rate, train.steps, train.warmup_steps, train.schedule)
        if train.optimizer == "adafactor":
            optimizer = tf.keras.optimizers.Adafactor(learning_rate=schedule, weight_decay=train.weight_decay or None)
        else:
            optimizer = tf.keras.optimizers.AdamW(learning_rate=schedule, weight_decay=train.weight_decay)
        optimizer.exclude_from_weight_decay(var_names=["layer_norm", "LayerNorm", "bias"])
        self.model.compile(optimizer=optimizer, steps_per_execution=self.backend.steps_per_call(self.recipe))
        optimizer.build(self.model.hf.trainable_variables)
        if self.checkpoint is not None:
            restore_optimizer(optimizer, self.checkpoint / OPTIMIZER_STATE)
        self.optimizer = optimizer

    # -- training ---------------------------------------------------------------------------------------------
    def train(self) -> None:
        train, evaluation = self.recipe.train, self.recipe.eval
        epoch = epoch_length(train.steps, evaluation.every if self.eval_files else None, train.checkpoint_every)
        self.epoch = epoch
        self.run_started = time.time() - float(self.trainer_state.get("elapsed_s", 0.0))
        # best-so-far and early stopping (tpuft.worker.selection), restored from the checkpoint's trainer state
        self.selector = Selector(self.recipe.eval.metric, train.early_stopping, self.trainer_state)
        self.best = self.selector.best  # {"metric", "value", "step"} of the best eval so far
        strategy = self.strategy
        dataset = strategy.distribute_datasets_from_function(
            self._dataset_fn(self.train_files, self.local_batch, train=True, skip_steps=self.start_step)
        )
        self.eval_dataset = None  # the held-out set, for fit's periodic evaluations and the final one
        if self.eval_files:
            self.eval_dataset = strategy.distribute_datasets_from_function(
                self._dataset_fn(self.eval_files, self.eval_batch, train=False)
            )
        validation = self.eval_dataset if evaluation.every else None
        validation_freq = max((evaluation.every or epoch) // epoch, 1)
        first, last = self.start_step // epoch, train.steps // epoch
        self.say(f"training steps {self.start_step + 1} to {train.steps}" if self.start_step else
                 f"training for {train.steps} steps ({self.backend.steps_per_call(self.recipe)} per execution)")
        callback = run_callback(self)
        self.step = self.start_step
        if first < last:
            self.model.fit(
                dataset, epochs=last, initial_epoch=first, steps_per_epoch=epoch, callbacks=[callback], verbose=0,
                validation_data=validation, validation_steps=self.eval_batches or None, validation_freq=validation_freq,
            )

    def evaluate(self) -> dict[str, float]:
        if self.eval_dataset is None:
            return {}
        self.beat(self.step, phase="eval")
        started = time.time()
        sums = self.model.evaluate(self.eval_dataset, steps=self.eval_batches, verbose=0, return_dict=True)
        return self.log_eval(sums, time.time() - started)

    def log_eval(self, sums: dict[str, Any], seconds: float) -> dict[str, float]:
        result = eval_row(sums, classify=self.classify)
        result["eval_seconds"] = round(seconds, 2)
        self.metrics.log(self.step, result)
        if self.classify:
            self.say(f"eval @ {self.step}: loss {result['eval_loss']:.4f} accuracy {result['eval_accuracy']:.4f} "
                     f"({result['eval_examples']} examples)")
        else:
            self.say(f"eval @ {self.step}: loss {result['eval_loss']:.4f} token acc "
                     f"{result['eval_token_accuracy']:.4f} exact match {result['eval_exact_match']:.4f} "
                     f"({result['eval_examples']} examples)")
        return result

    def judge(self, result: dict[str, float]) -> bool:
        """Best-so-far and early stopping, from an evaluation's metric (identical on every replica): the shared
        :class:`~tpuft.worker.selection.Selector`. True when this evaluation is the best so far."""
        verdict = self.selector.judge(self.step, result)
        self.best = self.selector.best
        if verdict.stop:
            self.stopped_early = verdict.reason
            self.say(verdict.reason)
            self.model.stop_training = True
        return verdict.improved

    def wait_for_everyone(self) -> None:
        """A barrier (an all-reduce of one number) at the end: a worker of a MultiWorkerMirrored run that exits while
        the chief still saves and exports is seen by TF's coordination service as crashed, which aborts the chief."""
        if self.ctx.num_workers > 1 and not self.tpu_hosts:
            tf = self.tf
            self.beat(self.step, phase="export")  # waiting for the chief's export, not hung
            self.strategy.reduce("SUM", self.strategy.run(lambda: tf.constant(1.0)), axis=None)

    # -- checkpoints and the end ------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """The chief writes ``checkpoints/step_N`` through a temp dir; the other replicas hold the same weights (and
        wait for the chief in their next collective: their heartbeat says so)."""
        self.beat(self.step, phase="checkpoint")
        if not self.chief:
            return None
        final = LAYOUT.checkpoint_dir(self.ctx.run_dir, self.step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        started = time.time()
        self.model.hf.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        save_optimizer(self.optimizer, tmp / OPTIMIZER_STATE)
        state = {
            "step": self.step, "run_id": self.ctx.run_id, "recipe": self.recipe.name, "backend": "keras",
            "tokenizer": self.recipe.model.tokenizer, "time": time.time(), "elapsed_s": started - self.run_started,
            "replicas": self.replicas, **self.selector.state(),  # best, bad_evals, stopped_early
        }  # fmt: skip
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        LAYOUT.write_manifest(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self._prune()
        self.say(f"checkpoint saved: {final} ({time.time() - started:.1f}s)")
        return final

    def _prune(self) -> None:
        kept = LAYOUT.local_checkpoints(self.ctx.run_dir / LAYOUT.checkpoints)
        keep = {step for step, _ in kept[-self.recipe.train.keep_checkpoints :]}
        if self.recipe.train.keep_best and self.best is not None:
            keep.add(int(self.best["step"]))
        for step, path in kept:
            if step not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def finish(self) -> None:
        result: dict[str, float] = {}
        if self.eval_files and self.last_eval_step != self.step:
            result = self.evaluate()
            self.judge(result)
        elif self.eval_files:
            result = self.last_eval
        ckpt = self.save_checkpoint()
        digest = weights_digest(self.model.hf)
        self.say(f"weights sha256 {digest[:16]} (worker {self.ctx.worker_id})", everyone=True)
        if self.chief and self.recipe.export.hf and ckpt is not None:
            self.beat(self.step, phase="export")
            source = ckpt
            if self.recipe.train.keep_best and self.best is not None:
                source = LAYOUT.checkpoint_dir(self.ctx.run_dir, int(self.best["step"]))
                self.say(f"exporting the best checkpoint: step {self.best['step']} ({self.best['metric']} "
                         f"{self.best['value']:.4f})")
            out = export_hf(self.ctx, source, self.recipe.export.dtype)
            self.say(f"Hugging Face export: {out}")
        self.wait_for_everyone()
        extra = {k: v for k, v in result.items() if k.startswith("eval_")}
        if self.stopped_early:
            extra["stopped_early"] = self.stopped_early
        self.beat(self.step, "finished", params_sha256=digest,
                  train_seconds=round(time.time() - self.run_started, 1), **extra)


def run_callback(run: KerasRun) -> Any:
    """Logging, heartbeats, eval bookkeeping and checkpoints between ``fit``'s executions: a tf.keras Callback,
    its class made here so that this module imports without TensorFlow."""
    tf = run.tf

    class Callback(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.window_start = time.time()
            self.window_steps = 0
            self.warm = False

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            per_epoch = run.epoch
            step = self.params_epoch * per_epoch + batch + 1
            done = step - run.step
            run.step = step
            self.window_steps += done
            train = run.recipe.train
            logged: dict[str, Any] = {}
            if step % train.log_every == 0 or step == train.steps:
                model = run.model
                elapsed = max(time.time() - self.window_start, 1e-9)
                loss = float(model.loss_tracker.result())
                tokens = float(model.token_tracker.result())
                row = {
                    "loss": round(loss, 6),
                    "lr": float(run.schedule(step - 1)),  # the rate of the window's last step
                    "examples_per_s": round(self.window_steps * train.batch_size / elapsed, 2),
                    "tokens_per_s": round(tokens / elapsed, 1),
                    "elapsed_s": round(time.time() - run.run_started, 1),
                }
                model.loss_tracker.reset_state()
                model.token_tracker.reset_state()
                run.metrics.log(step, row)
                logged = {k: row[k] for k in ("loss", "lr", "examples_per_s", "tokens_per_s")}
                run.say(f"step {step}/{train.steps} loss {loss:.4f} lr {row['lr']:.2e} "
                        f"{row['examples_per_s']:.1f} ex/s {row['tokens_per_s']:.0f} tok/s")
                self.window_start, self.window_steps = time.time(), 0
            self.warm = True
            run.beat(step, phase="step", **logged)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.params_epoch = epoch

        def on_test_begin(self, logs: Any = None) -> None:
            run.beat(run.step, phase="eval")
            self.eval_started = time.time()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            logs = logs or {}
            if "val_loss_sum" in logs:
                sums = {k.removeprefix("val_"): v for k, v in logs.items() if k.startswith("val_")}
                result = run.log_eval(sums, time.time() - self.eval_started)
                run.last_eval_step, run.last_eval = run.step, result
                best = run.judge(result)
                if best and run.recipe.train.keep_best and run.step < run.recipe.train.steps:
                    run.save_checkpoint()  # the best so far becomes a checkpoint, whatever checkpoint_every says
                    return
            every = run.recipe.train.checkpoint_every
            if every and run.step % every == 0 and run.step < run.recipe.train.steps:
                run.save_checkpoint()

    return Callback()


def build_trainable(tf: Any, hf: Any, *, classify: bool, start_token: int, clip_norm: float | None,
                    accum_steps: int = 1) -> Any:
    """The Keras model ``fit`` trains: the HF model, our train/test steps and the metrics they keep.

    ``accum_steps`` > 1 accumulates gradients over that many micro-batches of each replica's batch inside one
    ``train_step`` and applies them once: ``fit`` still sees one step per optimizer step, so the optimizer's
    iterations, the learning-rate schedule, the logged loss, checkpoints and the data position all count optimizer
    steps as without accumulation; only the activations of one micro-batch are alive at a time."""

    class Trainable(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf
            self.loss_tracker = tf.keras.metrics.Mean(name="loss")
            self.token_tracker = tf.keras.metrics.Sum(name="tokens")
            self.sums = {name: tf.keras.metrics.Sum(name=name) for name in EVAL_SUMS}

        @property
        def metrics(self) -> list[Any]:
            return [*self.sums.values()]  # reset by Keras before each evaluation; the train trackers by the callback

        def build_all(self, data_cfg: Any) -> None:
            ids = tf.zeros([1, data_cfg.max_source_length], tf.int32)
            labels = tf.zeros([1], tf.int32) if classify else tf.zeros([1, data_cfg.max_target_length], tf.int32)
            self._logits_of({"input_ids": ids, "attention_mask": tf.ones_like(ids), "labels": labels}, training=False)

        def _logits_of(self, batch: dict[str, Any], training: bool) -> Any:
            if classify:
                return self.hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               training=training).logits
            labels = batch["labels"]
            decoder_inputs = tf.concat(
                [tf.fill([tf.shape(labels)[0], 1], start_token), tf.where(labels == IGNORE, 0, labels)[:, :-1]], axis=1
            )
            return self.hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           decoder_input_ids=decoder_inputs, training=training).logits

        def _mask_of(self, batch: dict[str, Any]) -> Any:
            """What counts in the loss: the real target tokens, or the real examples (padding rows weigh 0)."""
            if classify:
                return batch["weight"]
            return tf.cast(batch["labels"] != IGNORE, tf.float32) * batch["weight"][:, None]

        def _item_losses(self, batch: dict[str, Any], logits: Any) -> tuple[Any, Any, Any]:
            """Per-item losses, their mask (target tokens, or examples), and whether each item is right."""
            logits = tf.cast(logits, tf.float32)
            labels = batch["labels"]
            mask = self._mask_of(batch)
            safe = labels if classify else tf.where(labels == IGNORE, 0, labels)
            loss = tf.keras.losses.sparse_categorical_crossentropy(safe, logits, from_logits=True)
            right = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), safe), tf.float32)
            return loss, mask, right

        def train_step(self, batch: dict[str, Any]) -> dict[str, Any]:
            context = tf.distribute.get_replica_context()
            if accum_steps > 1:  # the weights exist already: the trainer builds them before fit (build_all)
                variables = self.hf.trainable_variables
                local_count = tf.reduce_sum(self._mask_of(batch))
                total = context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)
                scaled, grads = self._accumulated(batch, tf.maximum(total, 1.0), variables)
            else:
                with tf.GradientTape() as tape:
                    logits = self._logits_of(batch, training=True)
                    loss, mask, _ = self._item_losses(batch, logits)
                    local_count = tf.reduce_sum(mask)
                    total = context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)
                    scaled = tf.reduce_sum(loss * mask) / tf.maximum(total, 1.0)  # sums over replicas to the global mean
                variables = self.hf.trainable_variables
                grads = tape.gradient(scaled, variables)
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            if clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            self.optimizer.apply_gradients(zip(grads, variables), skip_gradients_aggregation=True)
            global_loss = context.all_reduce(tf.distribute.ReduceOp.SUM, scaled)
            self.loss_tracker.update_state(global_loss)
            tokens = tf.reduce_sum(tf.cast(batch["attention_mask"], tf.float32))
            if not classify:
                tokens += local_count
            self.token_tracker.update_state(tokens)  # a SUM metric: the replicas' tokens add up
            return {"loss": global_loss}

        def _accumulated(self, batch: dict[str, Any], total: Any, variables: list[Any]) -> tuple[Any, list[Any]]:
            """This replica's share of the step's loss and its gradients, summed over ``accum_steps`` micro-batches
            (consecutive slices of the batch). Every micro-batch's summed loss is divided by the tokens (examples) of
            the whole global step, not its own: micro-batches count different tokens, and only this division makes
            the sum the gradient of the big batch's mean. A ``tf.while_loop`` with one iteration at a time keeps a
            single micro-batch's activations alive; the accumulators are dense (an embedding's sparse gradient
            included)."""
            pieces = {key: tf.reshape(value, [accum_steps, -1, *value.shape[1:]]) for key, value in batch.items()}

            def one(index: Any, loss_sum: Any, sums: list[Any]) -> tuple[Any, Any, list[Any]]:
                piece = {key: value[index] for key, value in pieces.items()}
                with tf.GradientTape() as tape:
                    loss, mask, _ = self._item_losses(piece, self._logits_of(piece, training=True))
                    part = tf.reduce_sum(loss * mask) / total
                grads = tape.gradient(part, variables)
                dense = [tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g)
                         for g, v in zip(grads, variables)]
                return index + 1, loss_sum + part, [s + g for s, g in zip(sums, dense)]

            start = (tf.constant(0), tf.constant(0.0), [tf.zeros(v.shape, v.dtype) for v in variables])
            _, scaled, grads = tf.while_loop(lambda index, *_: index < accum_steps, one, start,
                                             parallel_iterations=1, maximum_iterations=accum_steps)
            return scaled, grads

        def test_step(self, batch: dict[str, Any]) -> dict[str, Any]:
            logits = self._logits_of(batch, training=False)
            loss, mask, right = self._item_losses(batch, logits)
            weight = batch["weight"]
            if classify:
                exact = right * weight
                correct = exact
            else:
                correct = right * mask
                exact = tf.cast(tf.reduce_all((right > 0) | (mask == 0), axis=-1), tf.float32) * weight
            values = {"loss_sum": tf.reduce_sum(loss * mask), "tokens": tf.reduce_sum(mask),
                      "correct": tf.reduce_sum(correct), "exact": tf.reduce_sum(exact), "examples": tf.reduce_sum(weight)}
            for name, value in values.items():
                self.sums[name].update_state(value)
            return {f"{name}": metric.result() for name, metric in self.sums.items()}

    return Trainable()


EVAL_SUMS = ("loss_sum", "tokens", "correct", "exact", "examples")


def eval_row(sums: dict[str, Any], *, classify: bool) -> dict[str, Any]:
    """An eval's metrics row from its sums over every replica and batch."""
    total = {k: float(sums[k]) for k in EVAL_SUMS}
    tokens, examples = max(total["tokens"], 1.0), max(total["examples"], 1.0)
    row: dict[str, Any] = {"eval_loss": round(total["loss_sum"] / tokens, 6)}
    if classify:
        row["eval_accuracy"] = round(total["exact"] / examples, 6)
    else:
        row["eval_token_accuracy"] = round(total["correct"] / tokens, 6)
        row["eval_exact_match"] = round(total["exact"] / examples, 6)
    row["eval_examples"] = int(total["examples"])
    return row


# ----------------------------------------------------------------------------------------------------------------
# Small helpers (unit-tested)


def epoch_length(steps: int, eval_every: int | None, checkpoint_every: int | None) -> int:
    """Keras ``fit`` acts between epochs: an "epoch" here is the largest step count that every eval and checkpoint
    step (and the last step) is a multiple of."""
    import math

    length = steps
    for every in (eval_every, checkpoint_every):
        if every:
            length = math.gcd(length, every)
    return length


def _eval_count(cfg: Any, limit: int | None) -> int:
    """How many eval examples the whole run has (every worker pads its shard to the same number of batches)."""
    count = sum(1 for _ in data_mod.iter_shard(cfg.eval, 0, 1, data_mod.Fields.of(cfg)))
    return min(count, limit) if limit is not None else count


def make_schedule(tf: Any, peak: float, steps: int, warmup: int, kind: str) -> Any:
    """The learning rate at optimizer step k (0-based), as ``tpuft.worker.schedule.lr_factor`` defines it."""

    class Schedule(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            warm = float(max(warmup, 1))
            if kind == "inverse_sqrt":
                return peak * tf.sqrt(warm / tf.maximum(step, warm))
            if kind == "constant":
                factor = tf.constant(1.0)
            elif kind == "cosine":
                progress = tf.minimum(1.0, (step - warmup) / max(1, steps - warmup))
                factor = 0.5 * (1.0 + tf.cos(math.pi * progress))
            else:
                factor = tf.maximum(0.0, (steps - step) / max(1, steps - warmup))
            if warmup:
                factor = tf.where(step < warmup, (step + 1.0) / warmup, factor)
            return peak * factor

        def get_config(self) -> dict[str, Any]:
            return {"peak": peak, "steps": steps, "warmup": warmup, "kind": kind}

    return Schedule()


def save_optimizer(optimizer: Any, path: Path) -> None:
    """Every optimizer variable (iterations, moments / factored second moments) by position, with its name."""
    import numpy as np

    arrays = {f"v{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(optimizer.variables)}
    names = np.array([v.name for v in optimizer.variables])
    with open(path, "wb") as handle:
        np.savez(handle, names=names, **arrays)


def restore_optimizer(optimizer: Any, path: Path) -> None:
    import numpy as np

    saved = np.load(path)
    variables = optimizer.variables
    if len(saved.files) - 1 != len(variables):
        raise RuntimeError(f"{path}: {len(saved.files) - 1} optimizer variables saved, the optimizer has {len(variables)}")
    for i, variable in enumerate(variables):
        variable.assign(saved[f"v{i:05d}"])


def weights_digest(model: Any) -> str:
    """sha256 over every weight in name order, each framed by name, dtype and shape: equal means identical."""
    import numpy as np

    digest = hashlib.sha256(f"tpuft-weights-v1 {len(model.weights)}".encode())
    for weight in sorted(model.weights, key=lambda w: w.name):
        value = np.ascontiguousarray(weight.numpy())
        digest.update(f"\0{weight.name}\0{value.dtype}\0{value.shape}\0".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def export_hf(ctx: WorkerContext, checkpoint: Path, dtype: str) -> Path:
    from tpuft.convert.hf_writer import write_hf_model
    from tpuft.convert.sources import open_source

    out = ctx.run_dir / rundir.EXPORT_HF
    write_hf_model(open_source(checkpoint), out, dtype=dtype, overwrite=True)
    return out
