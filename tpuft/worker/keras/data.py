"""The Keras trainer's input: each program's examples tokenized once into TFRecords, read back by ``tf.data``.

Why TFRecords: the same files feed a CPU pod and a TPU slice, and on a pod slice the input pipelines run on
every host, which cannot read worker 0's disk: there the records go to the run's bucket. Shapes are static
(inputs padded to ``max_source_length``/``max_target_length``, batches ``drop_remainder``), and the eval set
is padded with weight-0 rows to a whole number of global batches, so that on the CPU pod every worker runs the
same number of eval steps (their steps meet in collectives). A resumed run skips the batches its checkpoint
had consumed, so it sees the data the original would have. ``data.hf`` is streamed into the files
(``hf_data.split_examples``: a program's share, in the split's order, tokenized a chunk at a time) and read
from disk each epoch rather than cached in memory; its eval and test splits are dealt as the held-out files
are (``hf_data.held_out``). TensorFlow is passed in: this module imports without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from tpuft import data as data_mod
from tpuft.core.errors import UsageError
from tpuft.worker.keras.parts import IGNORE

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.worker.context import WorkerContext

WRITE_CHUNK = 1024
"""Examples tokenized and written at a time: a streamed ``data.hf`` split is never in memory whole."""


class RecordData:
    """The run's train and eval TFRecords and the per-replica datasets over them (``prepare`` writes them)."""

    def __init__(
        self,
        tf: Any,
        ctx: WorkerContext,
        recipe: RecipeConfig,
        tokenizer: Any,
        *,
        classify: bool,
        replicas: int,
        tpu_hosts: int,
        say: Callable[..., None],
    ) -> None:
        self.tf, self.ctx, self.recipe, self.tokenizer = tf, ctx, recipe, tokenizer
        self.classify, self.replicas, self.tpu_hosts, self.say = classify, replicas, tpu_hosts, say
        self.local_batch = recipe.train.batch_size // replicas  # per replica
        self.eval_batch = recipe.eval.batch_size // replicas
        self.eval_examples: list[data_mod.Example] = []
        self.train_files: list[str] = []
        self.eval_files: list[str] = []
        self.eval_batches = 0

    def prepare(self) -> None:
        """Tokenize this program's examples once, into TFRecords that tf.data reads (the same on CPU and
        TPU)."""
        cfg = self.recipe.data
        train = self.recipe.train
        # MWMS: one program per worker, each on its shard. TPU: one program feeds every replica.
        rank, world = (0, 1) if self.tpu_hosts else (self.ctx.worker_id, self.ctx.num_workers)
        self.data_dir = self._data_dir()
        tag = f"w{self.ctx.worker_id}" if not self.tpu_hosts else "all"
        shards = max(self.tpu_hosts, 1)
        # data.hf streams into the files (never held whole); the files' order is the split's, so a resumed run
        # writes the same records and skips the batches its checkpoint consumed, as with JSON lines
        self.train_files, train_count = self._write_records(
            f"train-{tag}", self._train_examples(rank, world), shards=shards
        )
        if not train_count:
            raise data_mod.DataError(
                self._where(), f"worker {self.ctx.worker_id} of {world} got no training examples"
            )
        self.eval_examples = eval_examples = self._eval_examples(rank, world)
        self.say(
            f"data: {train_count} train / {len(eval_examples)} eval examples on worker {self.ctx.worker_id} "
            f"(batch {self.local_batch} per replica, {train.batch_size} global"
            f"{f', {train.grad_accum_steps} micro-batches a step' if train.grad_accum_steps > 1 else ''})",
            everyone=True,
        )
        if eval_examples:
            # Static shapes, and on the CPU pod every worker runs the same number of eval batches (their steps
            # meet in collectives): each program pads its examples with weight-0 rows to whole batches.
            total = eval_count(cfg, self.recipe.eval.max_examples) if world > 1 else len(eval_examples)
            per_program = self.eval_batch * (self.replicas // world)  # a program's batches feed its replicas
            largest_share = -(-total // world)  # ceil: the worker with the most examples
            self.eval_batches = -(-largest_share // per_program)
            padding = [data_mod.Example("", "", 0)] * (self.eval_batches * per_program - len(eval_examples))
            self.eval_files, _ = self._write_records(
                f"eval-{tag}", eval_examples + padding, shards=shards, real=len(eval_examples)
            )

    def _train_examples(self, rank: int, world: int) -> Iterable[data_mod.Example]:
        cfg = self.recipe.data
        if cfg.hf is not None:
            from tpuft.worker.hf_data import split_examples

            return split_examples(cfg, cfg.hf.split, rank=rank, world=world)
        return data_mod.load_shard(cfg.train, rank, world, data_mod.Fields.of(cfg))

    def _eval_examples(self, rank: int, world: int) -> list[data_mod.Example]:
        """The first ``eval.max_examples`` of the held-out set (wherever their shard is): this program's
        share."""
        from tpuft.worker.hf_data import has_held_out, held_out

        cfg = self.recipe.data
        if not has_held_out(cfg, "eval"):
            return []
        return [
            e for _, e in held_out(cfg, "eval", rank=rank, world=world, limit=self.recipe.eval.max_examples)
        ]

    def _where(self, role: str = "train") -> str:
        """Where a role's examples come from, for a located error: the file, or the data.hf split."""
        cfg = self.recipe.data
        if cfg.hf is None:
            return str(getattr(cfg, role))
        split = cfg.hf.split if role == "train" else getattr(cfg.hf, f"{role}_split")
        return f"hf:{cfg.hf.path}[{split}]"

    def _data_dir(self) -> str:
        if self.tpu_hosts > 1:  # the input pipelines run on every host of the slice: they read the bucket
            if not self.ctx.remote:
                raise UsageError(
                    "the Keras backend on a TPU pod slice reads its data and writes its run dir in a "
                    "bucket (every host runs an input pipeline): give the cluster file a bucket"
                )
            return f"{self.ctx.run_url}/data"
        return str(self.ctx.run_dir / "data")

    def _write_records(
        self, name: str, examples: Iterable[data_mod.Example], *, shards: int, real: int | None = None
    ) -> tuple[list[str], int]:
        """The examples as TFRecords, tokenized ``WRITE_CHUNK`` at a time (a streamed split is never held
        whole); after the first ``real`` (all when None) come weight-0 padding rows. Returns the files and the
        real count."""
        tf = self.tf
        tf.io.gfile.makedirs(self.data_dir)
        paths = [f"{self.data_dir}/{name}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        written = count = 0
        iterator = iter(examples)
        while chunk := list(itertools.islice(iterator, WRITE_CHUNK)):
            for row in self._encode(chunk, first=written, real=real):
                writers[written % shards].write(row)
                if real is None or written < real:
                    count += 1
                written += 1
        for writer in writers:
            writer.close()
        if self.tpu_hosts > 1:
            self.say(f"data: {written} examples written as TFRecords to {self.data_dir}/{name}-*")
        return paths, count

    def _encode(self, examples: list[data_mod.Example], *, first: int, real: int | None) -> list[bytes]:
        """Serialized ``tf.train.Example``s of ``examples`` (the ``first``-th of the file onwards)."""
        tf = self.tf
        cfg = self.recipe.data
        weights = [1.0 if real is None or first + i < real else 0.0 for i in range(len(examples))]
        sources, masks = data_mod.encode_texts(
            self.tokenizer, [e.source for e in examples], cfg.max_source_length, cfg.truncation
        )
        if self.classify:
            targets = [[self._label_id(e)] if w else [0] for e, w in zip(examples, weights)]
        else:
            enc = self.tokenizer(
                [e.target for e in examples],
                max_length=cfg.max_target_length,
                padding="max_length",
                truncation=True,
            )
            targets = [
                [t if m else IGNORE for t, m in zip(ids, mask)]
                for ids, mask in zip(enc["input_ids"], enc["attention_mask"])
            ]
        int_list = tf.train.Int64List
        rows = []
        for ids, mask, target, weight in zip(sources, masks, targets, weights):
            feature = {
                "input_ids": tf.train.Feature(int64_list=int_list(value=ids)),
                "attention_mask": tf.train.Feature(int64_list=int_list(value=mask)),
                "labels": tf.train.Feature(int64_list=int_list(value=target)),
                "weight": tf.train.Feature(float_list=tf.train.FloatList(value=[weight])),
            }
            rows.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return rows

    def _label_id(self, example: data_mod.Example) -> int:
        labels = self.recipe.data.labels
        if example.target in labels:
            return labels.index(example.target)
        if example.target.isdigit() and int(example.target) < len(labels):
            return int(example.target)
        where = f"{self._where('eval' if example in self.eval_examples else 'train')}:{example.line}"
        raise data_mod.DataError(
            where,
            f"label {example.target!r} is not one of data.labels ({', '.join(labels)}) "
            f"nor an index into them",
        )

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

    def dataset_fn(self, files: list[str], batch: int, *, train: bool, skip_steps: int = 0) -> Any:
        """For ``strategy.distribute_datasets_from_function``: one input pipeline's per-replica batches."""
        tf = self.tf
        seed = self.recipe.train.seed + 7919 * self.ctx.worker_id

        def make(context: Any) -> Any:
            ds = tf.data.Dataset.from_tensor_slices(files)
            if context.num_input_pipelines > 1 and self.tpu_hosts:  # one pipeline per host of the slice
                ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
            ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=1)
            ds = ds.map(self._parse, num_parallel_calls=tf.data.AUTOTUNE)
            if train:
                if (
                    self.recipe.data.hf is None
                ):  # a JSON-lines shard is in memory anyway; a streamed split is not
                    ds = ds.cache()
                hf = self.recipe.data.hf  # a streamed split's buffer is the recipe's (data.hf.shuffle_buffer)
                buffer = 100_000 if hf is None else hf.shuffle_buffer
                if self.recipe.data.shuffle and buffer > 1:
                    ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
                ds = ds.repeat()
            # Per-replica batches (tf.distribute hands a pipeline's batches to its replicas in turn): a
            # resumed run skips every batch its pipeline's replicas consumed before the checkpoint.
            ds = ds.batch(batch, drop_remainder=True)
            if skip_steps:
                ds = ds.skip(
                    skip_steps * (context.num_replicas_in_sync // max(context.num_input_pipelines, 1))
                )
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            options.deterministic = True
            return ds.with_options(options).prefetch(2)

        return make


def eval_count(cfg: Any, limit: int | None) -> int:
    """How many eval examples the whole run has (every worker pads its shard to the same number of
    batches)."""
    if cfg.hf is not None:
        from tpuft.worker.hf_data import held_out

        return len(held_out(cfg, "eval", rank=0, world=1, limit=limit))
    count = sum(1 for _ in data_mod.iter_shard(cfg.eval, 0, 1, data_mod.Fields.of(cfg)))
    return min(count, limit) if limit is not None else count
