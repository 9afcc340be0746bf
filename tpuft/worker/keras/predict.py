"""The Keras prediction engine: a trained Keras model's predictions computed on the device, under the run's
``tf.distribute`` strategy. One engine for the test evaluation that ends a training run
(``tpuft/worker/keras/testset.py``) and for ``tpuft predict`` (:func:`main`, through the shared shard loop
``tpuft/worker/predict/loop.py``), so that ``test_*`` and ``predict``'s scores come from the same decodes.

* Text to text: greedy decoding as one ``tf.function`` of static shapes run by ``strategy.run`` on every
  replica (the encoder once, then ``max_new_tokens`` decoder passes over a fixed-length buffer, each filling
  one position: XLA-friendly, so a TPU compiles it once); ``num_beams`` > 1 runs transformers' TF beam search
  the same way, inside ``strategy.run``. Only the token ids come back to the host, where they are cut at EOS
  and detokenized.
* Classification: the argmax is taken on the device, inside the step, so only a class index per example comes
  back to the host (seed 002's way); the host maps it to the label's name.

A batch is this process's: its rows are split evenly over its local replicas (a TPU program's every core, a
CPU worker's logical devices) and padded to a static size; the padding rows' outputs are dropped. The step has
no collective, so processes need not call it in lock-step (they do, through the shard loop, anyway).
TensorFlow is passed in: this module imports without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tpuft import data as data_mod
from tpuft.core.errors import UsageError
from tpuft.worker.keras import model as keras_model
from tpuft.worker.keras import prompt as keras_prompt

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.run.predict_job import PredictJob
    from tpuft.worker.context import WorkerContext


class KerasEngine:
    """:class:`tpuft.run.predict_job.Engine` over a Keras (HF TF) model already built in ``strategy``'s
    scope."""

    def __init__(
        self,
        tf: Any,
        strategy: Any,
        hf: Any,
        tokenizer: Any,
        recipe: RecipeConfig,
        *,
        batch_size: int,
        max_new_tokens: int | None = None,
        num_beams: int = 1,
    ) -> None:
        self.tf, self.strategy, self.hf, self.tokenizer = tf, strategy, hf, tokenizer
        self.data = recipe.data
        self.classify = getattr(recipe.backend, "task", "") == "classification"
        self.labels = list(recipe.data.labels)
        self.local = len(strategy.extended.worker_devices)
        """This process's replicas: a batch's rows are split over them."""
        self.per_replica = max(-(-batch_size // self.local), 1)
        self.batch = self.per_replica * self.local
        self.max_new_tokens = max_new_tokens or recipe.data.max_target_length
        self.num_beams = num_beams
        self.eos = tokenizer.eos_token_id
        self._step = tf.function(lambda ids, mask: strategy.run(self._replica_step, args=(ids, mask)))

    # -- on the device --------------------------------------------------------------------------------------
    def _replica_step(self, ids: Any, mask: Any) -> Any:
        tf, hf = self.tf, self.hf
        if self.classify:
            logits = hf(ids, attention_mask=mask, training=False).logits
            return tf.argmax(logits, -1, output_type=tf.int32)  # a class index per row leaves the device
        if self.num_beams > 1:
            return hf.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                num_beams=self.num_beams,
                do_sample=False,
            )[:, 1:]  # without the decoder's start token
        return self._greedy(ids, mask)

    def _greedy(self, ids: Any, mask: Any) -> Any:
        """Greedy decoding with static shapes: position t of a fixed ``[rows, max_new_tokens]`` buffer is the
        argmax of the decoder's logits at t given the positions before it (causal attention: later ones do not
        matter). The encoder runs once."""
        tf, hf, length = self.tf, self.hf, self.max_new_tokens
        start = int(hf.config.decoder_start_token_id or 0)
        encoded = hf.get_encoder()(input_ids=ids, attention_mask=mask, training=False)
        rows = tf.shape(ids)[0]
        positions = tf.range(length)[None, :]
        decoder = tf.fill([rows, length], start)
        out = tf.zeros([rows, length], tf.int32)
        for t in tf.range(length):
            logits = hf(
                ids, encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=decoder, training=False
            ).logits
            token = tf.argmax(logits[:, t], -1, output_type=tf.int32)[:, None]
            out = tf.where(positions == t, token, out)
            decoder = tf.where(positions == t + 1, token, decoder)
        return out

    # -- on the host ----------------------------------------------------------------------------------------
    def predict(self, sources: list[str]) -> list[str]:
        out: list[str] = []
        for begin in range(0, len(sources), self.batch):
            out += self._predict_batch(sources[begin : begin + self.batch])
        return out

    def _predict_batch(self, sources: list[str]) -> list[str]:
        import numpy as np

        if not sources:
            return []
        ids, masks = data_mod.encode_texts(
            self.tokenizer, sources, self.data.max_source_length, self.data.truncation
        )
        pad = self.batch - len(sources)  # static shapes: copies of the first row, their outputs dropped
        ids_np = np.asarray(ids + [ids[0]] * pad, np.int32)
        mask_np = np.asarray(masks + [masks[0]] * pad, np.int32)
        size, local, tf = self.per_replica, self.local, self.tf

        def per_replica(array: Any) -> Any:
            return self.strategy.experimental_distribute_values_from_function(
                lambda context: tf.constant(array[(context.replica_id_in_sync_group % local) * size :][:size])
            )

        results = self.strategy.experimental_local_results(
            self._step(per_replica(ids_np), per_replica(mask_np))
        )
        if self.classify:
            indices = np.concatenate([np.asarray(r).reshape(-1) for r in results])[: len(sources)]
            return [self.labels[int(i)] for i in indices]
        texts: list[str] = []
        for result in results:
            texts += [self.decode(row) for row in np.asarray(result)]
        return texts[: len(sources)]

    def decode(self, tokens: Any) -> str:
        """A row of generated ids as text: up to its first EOS, special tokens dropped."""
        kept = []
        for token in tokens.tolist():
            if token == self.eos:
                break
            kept.append(token)
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    def close(self) -> None:
        self._step = None


def main(ctx: WorkerContext, recipe: RecipeConfig, job: PredictJob) -> int:
    """``tpuft predict`` on a Keras run's checkpoint: the strategy as the trainer sets it up for this many
    workers (one program over a TPU slice; on the CPU pod every worker with its logical devices), the model
    from ``job.model``, the engine, and the shared shard loop (``predict_loop.serve``: this process's part of
    every unfinished shard; worker 0 joins them)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tpuft.worker.predict import loop as predict_loop

    hosts = keras_model.tpu_hosts()
    strategy = keras_model.make_strategy(tf, ctx, hosts)
    precision = keras_model.set_precision(tf, recipe.backend, hosts)  # type: ignore[arg-type]
    keras_model.quiet_transformers()
    folder = predict_loop.model_folder(job.model)
    if not (folder / "tf_model.h5").is_file():
        raise UsageError(f"{job.model}: not a Keras checkpoint (no tf_model.h5)")
    named = recipe.model.tokenizer  # byt5 needs no files; an HF tokenizer is in the checkpoint (no download)
    saved = named != "byt5" and (folder / "tokenizer_config.json").is_file()
    tokenizer = data_mod.load_tokenizer(str(folder) if saved else named)
    with strategy.scope():
        hf = keras_prompt.wrap(tf, keras_model.build_hf_model(recipe, tokenizer, folder), recipe, folder)
    engine = KerasEngine(
        tf,
        strategy,
        hf,
        tokenizer,
        recipe,
        batch_size=job.batch_size,
        max_new_tokens=job.max_new_tokens,
        num_beams=job.num_beams,
    )
    process, processes = (0, 1) if hosts else (ctx.worker_id, ctx.num_workers)
    print(
        f"[tpuft] keras predict: {type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas, "
        f"{precision}, process {process} of {processes}, {engine.batch} examples per call",
        flush=True,
    )
    return predict_loop.serve(
        job,
        engine,
        process=process,
        processes=processes,
        recipe=recipe,
        run_dir=ctx.run_dir if ctx.run_url else None,
        worker=ctx.worker_id,
    )
