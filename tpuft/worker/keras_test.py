"""The Keras trainer's test evaluation (``data.test``), once at the end of training, before the final checkpoint
(``tpuft.worker.loop.run_test`` calls :func:`evaluate`).

Every program predicts its share of the test set with the Keras prediction engine (``keras_predict.KerasEngine``:
greedy decodes on the device, or the classifier's argmax on the device): on the CPU pod every worker the records
``i`` with ``i % workers == worker``, on a TPU slice the one program all of them. Its predictions go to
``test/predictions-<worker>.jsonl``; their summable statistics (``tpuft.worker.predictions.statistics``) are summed
over the workers with the strategy's own all-reduce, so that every worker returns the same scores. Under
``train.keep_best`` the best checkpoint's weights are loaded into the model for the test (its ``tf_model.h5``, by
weight name as transformers loads it), and the last weights are put back afterwards: the final checkpoint, the
digest and the export see the weights training ended with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.worker import predictions
from tpuft.worker.keras_predict import KerasEngine
from tpuft.worker.predict_input import fields_for, records


def evaluate(run: Any, folder: Path | None) -> dict[str, Any]:
    """``run``: the trainer (``keras_train.KerasRun``, not imported: it imports this module). This program's share of the test set predicted with the weights of ``folder`` (None: those in memory),
    written, scored over every worker."""
    recipe, ctx, loop = run.recipe, run.ctx, run.loop
    cfg = recipe.data
    assert cfg.test is not None
    labels = list(cfg.labels)
    rank, world = (0, 1) if run.tpu_hosts else (ctx.worker_id, ctx.num_workers)
    share = [r for r in records(str(cfg.test), fields_for(cfg), labels) if r.index % world == rank]
    engine = KerasEngine(run.tf, run.strategy, run.model.hf, run.tokenizer, recipe,
                         batch_size=run.data.eval_batch * len(run.strategy.extended.worker_devices))
    last = swap_in(run, folder) if folder is not None else None
    try:
        outputs = engine.predict([r.source for r in share])
    finally:
        engine.close()
        if last is not None:
            for variable, value in zip(run.model.hf.weights, last):
                variable.assign(value)
    predictions.write_predictions(loop.test_predictions_dir() / predictions.shard_name(ctx.worker_id),
                                  (predictions.row(r.index, r.source, o, r.target) for r, o in zip(share, outputs)))
    scored = [(o, r.target) for o, r in zip(outputs, share) if r.target is not None]
    stats = predictions.statistics([o for o, _ in scored], [t for _, t in scored], labels)
    return predictions.scores(summed(run, stats), labels)


def swap_in(run: Any, folder: Path) -> list[Any]:
    """Load the checkpoint's weights into the model; returns the weights it had (to put back). A worker whose
    staging folder lacks the checkpoint (a bucket run's other hosts) fetches it from the bucket."""
    from transformers.modeling_tf_utils import load_tf_weights

    from tpuft.worker.resume import fetch_checkpoint

    if not run.loop.layout.is_complete(folder):
        folder = fetch_checkpoint(run.ctx, run.loop.layout, folder.name)
    hf = run.model.hf
    last = [variable.numpy() for variable in hf.weights]
    missing, _, mismatched = load_tf_weights(hf, str(folder / "tf_model.h5"))
    if missing or mismatched:
        raise RuntimeError(f"{folder}: the checkpoint does not fit the model (missing layers {missing}, "
                           f"mismatched {mismatched})")
    return last


def summed(run: Any, stats: list[float]) -> list[float]:
    """``stats`` summed over the workers of a CPU pod run (one all-reduce; one local replica of each worker brings
    them, the others zeros); a TPU program has every prediction already."""
    if run.tpu_hosts or run.ctx.num_workers == 1:
        return stats
    tf, strategy = run.tf, run.strategy
    local = len(strategy.extended.worker_devices)
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(stats if context.replica_id_in_sync_group % local == 0 else [0.0] * len(stats),
                                    tf.float64)
    )
    total = strategy.reduce("SUM", values, axis=None)
    return [float(x) for x in total.numpy()]
