"""Runs pieces of the Keras trainer in this process (the Keras venv, one CPU worker) and prints what
``tests/worker/test_keras_eval_keys.py`` checks, one JSON line per case.

``python keras_harness.py CASES.json``: CASES is a list of {"kind": ..., "recipe": path, "set": [overrides],
"run_dir": path}, run in order in this one process (TensorFlow is imported once):

* ``records``: ``RecordData.prepare`` only: the TFRecords' rows (ids, labels, weight) as the trainer wrote
  them, and the test set's share (``keras_test.test_share``).
* ``train``: the whole trainer (``KerasRun.run``); the model's weights (the HF model's, without the soft
  prompt) and the soft prompt before and after, as sha256 digests; the checkpoints left.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    # TensorFlow takes its thread counts once per process; the trainer sets them at its setup, which only the
    # first case here may (the cases share the process)
    tf.config.threading.set_intra_op_parallelism_threads = lambda count: None
    tf.config.threading.set_inter_op_parallelism_threads = lambda count: None
    out = [case(cfg) for cfg in json.loads(Path(sys.argv[1]).read_text())]
    print(json.dumps(out))


def context(run_dir: Path) -> Any:
    from tpuft.worker.context import WorkerContext

    run_dir.mkdir(parents=True, exist_ok=True)
    return WorkerContext.from_env(
        {
            "TPUFT_RUN_ID": run_dir.name,
            "TPUFT_RUN_DIR": str(run_dir),
            "TPUFT_WORKER_ID": "0",
            "TPUFT_NUM_WORKERS": "1",
        }
    )


def case(cfg: dict[str, Any]) -> dict[str, Any]:
    from tpuft.config import load_recipe

    if cfg["kind"] == "save":
        return save(cfg["folder"], cfg["splits"])
    recipe = load_recipe(Path(cfg["recipe"]), cfg.get("set", [])).value
    ctx = context(Path(cfg["run_dir"]))
    return records(ctx, recipe) if cfg["kind"] == "records" else train(ctx, recipe)


def save(folder: str, splits: dict[str, str]) -> dict[str, Any]:
    """A dataset folder (``save_to_disk`` of a DatasetDict) of JSON-lines files, one per split."""
    import datasets

    rows = {
        name: [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for name, path in splits.items()
    }
    datasets.DatasetDict({name: datasets.Dataset.from_list(r) for name, r in rows.items()}).save_to_disk(
        folder
    )
    return {"saved": {name: len(r) for name, r in rows.items()}}


def records(ctx: Any, recipe: Any) -> dict[str, Any]:
    import tensorflow as tf

    from tpuft import data as data_mod
    from tpuft.worker.keras.data import RecordData
    from tpuft.worker.keras.testset import test_share

    tokenizer = data_mod.load_tokenizer(recipe.model.tokenizer)
    data = RecordData(
        tf, ctx, recipe, tokenizer, classify=False, replicas=1, tpu_hosts=0, say=lambda *a, **k: None
    )
    data.prepare()

    def rows(files: list[str]) -> list[list[Any]]:
        out = []
        for record in tf.data.TFRecordDataset(files):
            features = tf.train.Example.FromString(record.numpy()).features.feature
            out.append(
                [list(features[k].int64_list.value) for k in ("input_ids", "attention_mask", "labels")]
                + [list(features["weight"].float_list.value)]
            )
        return out

    share = (
        test_share(recipe.data, 0, 1)
        if recipe.data.test or (recipe.data.hf and recipe.data.hf.test_split)
        else []
    )
    return {
        "train": rows(data.train_files),
        "eval": rows(data.eval_files),
        "eval_batches": data.eval_batches,
        "test": [[r.index, r.source, r.target] for r in share],
    }


def digest(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(array.tobytes())
    return h.hexdigest()


def train(ctx: Any, recipe: Any) -> dict[str, Any]:
    from tpuft.worker.keras.train import KerasRun

    run = KerasRun(ctx, recipe)
    run.setup()
    hf = run.model.hf
    inner = getattr(hf, "inner", hf)

    def state() -> dict[str, Any]:
        prompt = getattr(hf, "prompt", None)
        return {
            "model": digest([w.numpy() for w in sorted(inner.weights, key=lambda w: w.name)]),
            "prompt": None if prompt is None else digest([prompt.numpy()]),
        }

    before = state()
    try:
        run.train()
        run.finish()
    finally:
        if run.loop.metrics is not None:
            run.loop.metrics.close()
    checkpoints = sorted(
        p.name for p in (ctx.run_dir / "checkpoints").iterdir() if p.name.startswith("step_")
    )
    return {
        "before": before,
        "after": state(),
        "checkpoints": checkpoints,
        "generated": generate(
            ctx.run_dir,
            checkpoints,
            run.data.eval_examples[: recipe.eval.generate_examples],
            recipe.data.max_target_length,
            recipe.model.tokenizer,
        )
        if recipe.model.prompt_tuning is None
        else {},
        "trainable": [v.name for v in hf.trainable_variables],
        "samples": [[e.source, text] for e, text in getattr(run, "last_decodes", [])],
    }


def generate(
    run_dir: Path, checkpoints: list[str], examples: list[Any], length: int, tokenizer_name: str
) -> dict[str, list[str]]:
    """Each checkpoint's greedy decodes of ``examples`` by transformers' own TF ``generate`` (not tpuft's
    engine): the test recomputes each evaluation's BLEU from them."""
    import transformers

    from tpuft import data as data_mod

    out: dict[str, list[str]] = {}
    if not examples:
        return out
    tokenizer = data_mod.load_tokenizer(tokenizer_name)
    for name in checkpoints:
        folder = run_dir / "checkpoints" / name
        model = transformers.TFT5ForConditionalGeneration.from_pretrained(folder)
        enc = tokenizer([e.source for e in examples], return_tensors="tf", padding=True)
        ids = model.generate(**enc, max_new_tokens=length, do_sample=False, num_beams=1)
        out[name] = tokenizer.batch_decode(ids.numpy(), skip_special_tokens=True)
    return out


if __name__ == "__main__":
    main()
