"""The Keras trainer's test evaluation (``data.test`` or ``data.hf.test_split``), once at the end of training,
before the final checkpoint (``tpuft.worker.loop.run_test`` calls :func:`evaluate`).

Every program predicts its share of the test set with the Keras prediction engine
(``keras_predict.KerasEngine``: greedy decodes on the device, or the classifier's argmax on the device): on
the CPU pod every worker the records ``i`` with ``i % workers == worker``, on a TPU slice the one program all
of them. Its predictions go to ``test/predictions-<worker>.jsonl``; their summable statistics
(``tpuft.scoring.predictions.statistics``) are summed over the workers with the strategy's own all-reduce, so
that every worker returns the same scores. Under ``train.keep_best`` the best checkpoint's weights are loaded
into the model for the test (its ``tf_model.h5``, by weight name as transformers loads it), and the last
weights are put back afterwards: the final checkpoint, the digest and the export see the weights training
ended with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.data.predict_input import Record, fields_for, label_name, records
from tpuft.scoring import predictions
from tpuft.worker.keras import generate as keras_generate


def evaluate(run: Any, folder: Path | None) -> dict[str, Any]:
    """``run``: the trainer (``keras_train.KerasRun``, not imported: it imports this module). This program's
    share of the test set predicted with the weights of ``folder`` (None: those in memory) by the trainer's
    one engine (the one that decodes for eval's BLEU), written, scored over every worker."""
    recipe, ctx, loop = run.recipe, run.ctx, run.loop
    labels = list(recipe.data.labels)
    rank, world = (0, 1) if run.tpu_hosts else (ctx.worker_id, ctx.num_workers)
    share = test_share(recipe.data, rank, world)
    engine = keras_generate.engine(run)
    last = swap_in(run, folder) if folder is not None else None
    try:
        outputs = engine.predict([r.source for r in share])
    finally:
        if last is not None:
            for variable, value in zip(run.model.hf.weights, last):
                variable.assign(value)
    predictions.write_predictions(
        loop.test_predictions_dir() / predictions.shard_name(ctx.worker_id),
        (predictions.row(r.index, r.source, o, r.target) for r, o in zip(share, outputs)),
    )
    scored = [(o, r.target) for o, r in zip(outputs, share) if r.target is not None]
    stats = predictions.statistics([o for o, _ in scored], [t for _, t in scored], labels)
    return predictions.scores(keras_generate.summed(run, stats), labels)


def test_share(cfg: Any, rank: int, world: int) -> list[Record]:
    """This program's records of ``data.test`` (the i-th record if i % world == rank) or of
    ``data.hf.test_split`` (dealt as every held-out set is), a classification target as its label's name."""
    labels = list(cfg.labels)
    if cfg.hf is None:
        return [r for r in records(str(cfg.test), fields_for(cfg), labels) if r.index % world == rank]
    from tpuft.worker.hf_data import held_out

    share = []
    for index, example in held_out(cfg, "test", rank=rank, world=world):
        share.append(Record(index, example.line, example.source, label_name(example.target, labels)))
    return share


def swap_in(run: Any, folder: Path) -> list[Any]:
    """Load the checkpoint's weights into the model; returns the weights it had (to put back). A worker whose
    staging folder lacks the checkpoint (a bucket run's other hosts) fetches it from the bucket."""
    from transformers.modeling_tf_utils import load_tf_weights

    from tpuft.worker.resume import fetch_checkpoint

    if not run.loop.layout.is_complete(folder):
        folder = fetch_checkpoint(run.ctx, run.loop.layout, folder.name)
    hf = run.model.hf
    last = [variable.numpy() for variable in hf.weights]
    if hasattr(hf, "load_prompt"):  # prompt tuning (keras_prompt.PromptedT5): the checkpoint's prompt too
        hf.load_prompt(folder)
    missing, _, mismatched = load_tf_weights(getattr(hf, "inner", hf), str(folder / "tf_model.h5"))
    if missing or mismatched:
        raise RuntimeError(
            f"{folder}: the checkpoint does not fit the model (missing layers {missing}, "
            f"mismatched {mismatched})"
        )
    return last
