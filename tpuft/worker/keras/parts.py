"""The Keras trainer's engine parts, TensorFlow passed in (this module imports without it): the Keras model
``fit`` trains (our ``train_step``: the global-mean loss scaling, gradient accumulation, explicit all-reduce
and clipping; our ``test_step``: eval sums on the device), the eval row from those sums, the learning-rate
schedule, the optimizer state by position, and the weight digest. Unit-tested in
``tests/worker/test_keras_parts.py`` against the real stack."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

IGNORE = -100
"""Label of a padded target position (no loss, not counted)."""


def build_trainable(
    tf: Any,
    hf: Any,
    *,
    classify: bool,
    start_token: int,
    clip_norm: float | None,
    accum_steps: int = 1,
    label_smoothing: float = 0.0,
) -> Any:
    """The Keras model ``fit`` trains: the HF model, our train/test steps and the metrics they keep.

    ``accum_steps`` > 1 accumulates gradients over that many micro-batches of each replica's batch inside one
    ``train_step`` and applies them once: ``fit`` still sees one step per optimizer step, so the optimizer's
    iterations, the learning-rate schedule, the logged loss, checkpoints and the data position all count
    optimizer steps as without accumulation; only the activations of one micro-batch are alive at a time.

    ``label_smoothing`` smooths the training loss as PyTorch's ``cross_entropy(label_smoothing=)`` does (the
    target weighs 1 - e, every class e / classes); evaluations report the plain cross-entropy, comparable
    across runs."""

    class Trainable(tf.keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf
            self.loss_tracker = tf.keras.metrics.Mean(name="loss")
            self.token_tracker = tf.keras.metrics.Sum(name="tokens")
            self.sums = {name: tf.keras.metrics.Sum(name=name) for name in EVAL_SUMS}

        @property
        def metrics(self) -> list[Any]:
            # reset by Keras before each evaluation; the train trackers by the callback
            return [*self.sums.values()]

        def build_all(self, data_cfg: Any) -> None:
            ids = tf.zeros([1, data_cfg.max_source_length], tf.int32)
            labels = (
                tf.zeros([1], tf.int32) if classify else tf.zeros([1, data_cfg.max_target_length], tf.int32)
            )
            self._logits_of(
                {"input_ids": ids, "attention_mask": tf.ones_like(ids), "labels": labels}, training=False
            )

        def _logits_of(self, batch: dict[str, Any], training: bool) -> Any:
            if classify:
                return self.hf(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], training=training
                ).logits
            labels = batch["labels"]
            decoder_inputs = tf.concat(
                [
                    tf.fill([tf.shape(labels)[0], 1], start_token),
                    tf.where(labels == IGNORE, 0, labels)[:, :-1],
                ],
                axis=1,
            )
            return self.hf(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=decoder_inputs,
                training=training,
            ).logits

        def _mask_of(self, batch: dict[str, Any]) -> Any:
            """What counts in the loss: the real target tokens, or the real examples (padding rows weigh
            0)."""
            if classify:
                return batch["weight"]
            return tf.cast(batch["labels"] != IGNORE, tf.float32) * batch["weight"][:, None]

        def _item_losses(
            self, batch: dict[str, Any], logits: Any, smoothing: float = 0.0
        ) -> tuple[Any, Any, Any]:
            """Per-item losses (in float32 whatever the compute precision), their mask (target tokens, or
            examples), and whether each item is right."""
            logits = tf.cast(logits, tf.float32)
            labels = batch["labels"]
            mask = self._mask_of(batch)
            safe = labels if classify else tf.where(labels == IGNORE, 0, labels)
            loss = smoothed_cross_entropy(tf, safe, logits, smoothing)
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
                    loss, mask, _ = self._item_losses(batch, logits, label_smoothing)
                    local_count = tf.reduce_sum(mask)
                    total = context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)
                    # sums over replicas to the global mean
                    scaled = tf.reduce_sum(loss * mask) / tf.maximum(total, 1.0)
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

        def _accumulated(
            self, batch: dict[str, Any], total: Any, variables: list[Any]
        ) -> tuple[Any, list[Any]]:
            """This replica's share of the step's loss and its gradients, summed over ``accum_steps``
            micro-batches (consecutive slices of the batch). Every micro-batch's summed loss is divided by the
            tokens (examples) of the whole global step, not its own: micro-batches count different tokens, and
            only this division makes the sum the gradient of the big batch's mean. A ``tf.while_loop`` with
            one iteration at a time keeps a single micro-batch's activations alive; the accumulators are dense
            (an embedding's sparse gradient included)."""
            pieces = {
                key: tf.reshape(value, [accum_steps, -1, *value.shape[1:]]) for key, value in batch.items()
            }

            def one(index: Any, loss_sum: Any, sums: list[Any]) -> tuple[Any, Any, list[Any]]:
                piece = {key: value[index] for key, value in pieces.items()}
                with tf.GradientTape() as tape:
                    loss, mask, _ = self._item_losses(
                        piece, self._logits_of(piece, training=True), label_smoothing
                    )
                    part = tf.reduce_sum(loss * mask) / total
                grads = tape.gradient(part, variables)
                dense = [
                    tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g)
                    for g, v in zip(grads, variables)
                ]
                return index + 1, loss_sum + part, [s + g for s, g in zip(sums, dense)]

            start = (tf.constant(0), tf.constant(0.0), [tf.zeros(v.shape, v.dtype) for v in variables])
            _, scaled, grads = tf.while_loop(
                lambda index, *_: index < accum_steps,
                one,
                start,
                parallel_iterations=1,
                maximum_iterations=accum_steps,
            )
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
            values = {
                "loss_sum": tf.reduce_sum(loss * mask),
                "tokens": tf.reduce_sum(mask),
                "correct": tf.reduce_sum(correct),
                "exact": tf.reduce_sum(exact),
                "examples": tf.reduce_sum(weight),
            }
            for name, value in values.items():
                self.sums[name].update_state(value)
            return {f"{name}": metric.result() for name, metric in self.sums.items()}

    return Trainable()


def smoothed_cross_entropy(tf: Any, labels: Any, logits: Any, smoothing: float) -> Any:
    """Cross-entropy of each item against its label smoothed by ``smoothing``: (1 - e) of the label's negative
    log-likelihood plus e of the mean over all classes (PyTorch's definition, so both backends train the same
    loss)."""
    plain = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    if not smoothing:
        return plain
    uniform = -tf.reduce_mean(tf.nn.log_softmax(logits, axis=-1), axis=-1)
    return (1.0 - smoothing) * plain + smoothing * uniform


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


def epoch_length(steps: int, eval_every: int | None, checkpoint_every: int | None, start: int = 0) -> int:
    """Keras ``fit`` acts between epochs: an "epoch" here is the largest step count that every eval and
    checkpoint step (and the last step) is a multiple of, and the step a resumed run starts at: ``fit`` starts
    at an epoch's beginning, and a checkpoint may be anywhere (asked for on demand, or the time limit's)."""
    length = steps
    for every in (eval_every, checkpoint_every, start):
        if every:
            length = math.gcd(length, every)
    return length


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
        raise RuntimeError(
            f"{path}: {len(saved.files) - 1} optimizer variables saved, the optimizer has {len(variables)}"
        )
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
