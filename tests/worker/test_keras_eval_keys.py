"""The Keras trainer's shared keys of issue 28 that read data and decode, on the real stack (the Keras venv,
one CPU worker, a tiny random T5), the trainer run in one process by ``tests/worker/keras_harness.py``:

* ``data.hf``: a saved dataset folder and a csv builder over data files give the TFRecords (every token, label
  and weight), the eval set and the test set that the JSON lines of the same rows give;
* ``eval.generate_examples`` and ``eval.metric: bleu``: every evaluation's BLEU is the corpus BLEU of what
  transformers' own ``generate`` decodes with that checkpoint, and keep-best keeps (and the test evaluates)
  the checkpoint with the best BLEU, a training from ``data.hf`` throughout;
* ``model.prompt_tuning``: only the soft prompt changes, the T5's weights stay bit-identical; the prompt is in
  the checkpoint and beside the export.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_keras_parts import run_in_venv
from tpuft.scoring import text_metrics

pytestmark = pytest.mark.slow

HARNESS = Path(__file__).with_name("keras_harness.py")

RECIPE = """
name: keras-eval-keys
backend: {kind: keras}
model:
  tokenizer: byt5
  config: {d_model: 32, d_kv: 8, num_heads: 2, d_ff: 64, num_layers: 1, num_decoder_layers: 1, dropout_rate: 0.0}
data:
  max_source_length: 12
  max_target_length: 12
train: {steps: 40, batch_size: 16, learning_rate: 1.0e-2, warmup_steps: 0, schedule: constant, log_every: 10, seed: 0}
eval: {every: 10, batch_size: 16}
export: {hf: false}
"""  # noqa: E501 (a script run in another interpreter)


def rows(count: int, seed: int) -> list[dict[str, str]]:
    """A copy task of short letter sequences: BLEU moves as a tiny model learns it."""
    rng = random.Random(seed)
    return [
        {"text": " ".join(rng.choice("abcde") for _ in range(rng.randint(2, 5))), "id": str(i)}
        for i in range(count)
    ]


def write_jsonl(path: Path, items: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def write_csv(path: Path, items: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "id"])
        writer.writeheader()
        writer.writerows(items)
    return path


@pytest.fixture(scope="module")
def results(keras_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case in one process of the Keras venv (TensorFlow imported once)."""
    root = tmp_path_factory.mktemp("keras_eval_keys")
    splits = {"train": rows(64, 1), "validation": rows(16, 2), "test": rows(8, 3)}
    jsonl = {name: write_jsonl(root / f"{name}.jsonl", items) for name, items in splits.items()}
    csvs = {name: str(write_csv(root / f"{name}.csv", items)) for name, items in splits.items()}
    (root / "recipe.yaml").write_text(RECIPE)
    fields = ["data.source_field=text", "data.target_field=text"]
    hf_folder = [
        "data.hf.path=" + str(root / "saved"),
        "data.hf.eval_split=validation",
        "data.hf.test_split=test",
    ]
    cases = [
        {"kind": "save", "folder": str(root / "saved"), "splits": {k: str(v) for k, v in jsonl.items()}},
        {
            "kind": "records",
            "run_dir": str(root / "jsonl"),
            "set": [
                *fields,
                f"data.train={jsonl['train']}",
                f"data.eval={jsonl['validation']}",
                f"data.test={jsonl['test']}",
            ],
        },
        {"kind": "records", "run_dir": str(root / "folder"), "set": [*fields, *hf_folder]},
        {
            "kind": "records",
            "run_dir": str(root / "csv"),
            "set": [
                *fields,
                "data.hf.path=csv",
                "data.hf.eval_split=validation",
                "data.hf.test_split=test",
                "data.hf.data_files=" + json.dumps({k: [v] for k, v in csvs.items()}),
            ],
        },
        {
            "kind": "train",
            "run_dir": str(root / "bleu"),
            "set": [
                *fields,
                *hf_folder,
                "eval.metric=bleu",
                "eval.generate_examples=16",
                "train.keep_best=true",
                "train.checkpoint_every=10",
                "train.keep_checkpoints=10",
                # 70 steps: the copy task's BLEU peaks before its eval loss bottoms out, so a keep-best
                # that ranked by the loss would pick another checkpoint. Where is a matter of float
                # arithmetic (the CPU's kernels, the venv's versions): 40 and 80 on an earlier CI machine,
                # 50 and 60 here (at 80 steps, both 80 here); 70 parts them on both
                "train.steps=70",
            ],
        },
        {
            "kind": "train",
            "run_dir": str(root / "prompt"),
            "set": [
                *fields,
                f"data.train={jsonl['train']}",
                "train.steps=6",
                "train.log_every=3",
                "eval.every=null",
                "train.learning_rate=0.3",
                "model.prompt_tuning.tokens=4",
                "export.hf=true",
            ],
        },
        {
            "kind": "train",
            "run_dir": str(root / "limited"),
            "set": [
                *fields,
                f"data.train={jsonl['train']}",
                f"data.test={jsonl['test']}",
                "train.steps=100000",
                "train.log_every=2",
                "eval.every=null",
                "train.time_limit=1",
                "export.hf=true",
            ],
        },
    ]
    for case in cases[1:]:
        case["recipe"] = str(root / "recipe.yaml")
    (root / "cases.json").write_text(json.dumps(cases))
    out = run_in_venv(
        keras_python,
        f"import runpy, sys; sys.argv = ['h', {str(root / 'cases.json')!r}]; "
        f"runpy.run_path({str(HARNESS)!r}, run_name='__main__')",
        timeout=900,
    )
    return {
        "root": root,
        "splits": splits,
        "saved": out[0],
        "jsonl": out[1],
        "folder": out[2],
        "csv": out[3],
        "bleu": out[4],
        "prompt": out[5],
        "limited": out[6],
    }


def test_data_hf_gives_the_records_of_the_same_json_lines(results: dict[str, Any]) -> None:
    assert results["saved"] == {"saved": {"train": 64, "validation": 16, "test": 8}}
    jsonl = results["jsonl"]
    assert len(jsonl["train"]) == 64 and len(jsonl["eval"]) == 16 and len(jsonl["test"]) == 8
    assert jsonl["test"][0][1:] == [results["splits"]["test"][0]["text"]] * 2
    for kind in ("folder", "csv"):
        assert results[kind] == jsonl, kind


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_bleu_ranks_the_checkpoints_for_keep_best(results: dict[str, Any]) -> None:
    run_dir, out = results["root"] / "bleu", results["bleu"]
    evals = {row["step"]: row for row in metrics_rows(run_dir) if "eval_bleu" in row}
    assert sorted(evals) == [10, 20, 30, 40, 50, 60, 70]
    references = [row["text"] for row in results["splits"]["validation"]]
    for (
        step,
        row,
    ) in evals.items():  # the trainer's decodes are transformers' greedy ones, scored by the one scorer
        decoded = out["generated"][f"step_{step:08d}"]
        assert row["eval_decoded"] == 16
        assert row["eval_bleu"] == pytest.approx(text_metrics.corpus_bleu(decoded, references), abs=1e-3), (
            step
        )
        assert row["eval_rouge_l"] == pytest.approx(text_metrics.rouge_l(decoded, references), abs=1e-3), step
    bleus = [evals[step]["eval_bleu"] for step in sorted(evals)]
    assert len(set(bleus)) > 1, f"BLEU did not move ({bleus}): the ranking would test nothing"
    best = max(sorted(evals), key=lambda step: (evals[step]["eval_bleu"], -step))  # the first of the best
    test_row = next(row for row in metrics_rows(run_dir) if "test_bleu" in row)
    assert test_row["test_checkpoint_step"] == best and test_row["test_examples"] == 8
    assert best != min(evals, key=lambda step: evals[step]["eval_loss"]), "the loss would pick this one too"
    state = json.loads((run_dir / "checkpoints" / "step_00000070" / "trainer_state.json").read_text())
    assert state["best"]["step"] == best and state["best"]["metric"] == "eval_bleu", state["best"]
    assert len(out["samples"]) == 16  # the last evaluation's decodes (the first 3 are said at the end)


def test_prompt_tuning_trains_the_prompt_alone(results: dict[str, Any]) -> None:
    out, run_dir = results["prompt"], results["root"] / "prompt"
    assert out["trainable"] == ["soft_prompt:0"]
    assert out["after"]["model"] == out["before"]["model"]  # the T5 bit-identical
    assert out["after"]["prompt"] != out["before"]["prompt"]
    assert (run_dir / "checkpoints" / "step_00000006" / "prompt.safetensors").is_file()
    assert (run_dir / "export" / "prompt.safetensors").is_file() and (run_dir / "export" / "hf").is_dir()
    rows = [row for row in metrics_rows(run_dir) if "loss" in row]
    assert len(rows) == 2 and all(row["loss"] > 0 for row in rows)


def test_the_time_limit_ends_the_keras_run_saved_tested_and_exported(results: dict[str, Any]) -> None:
    """``train.time_limit`` (the sequencer's alone) under ``fit``: a 1 s budget against 100000 steps ends
    training at the first ``log_every`` boundary past it; the run saves there, tests, exports and finishes."""
    run_dir = results["root"] / "limited"
    beat = json.loads((run_dir / "heartbeat" / "worker-0.json").read_text())
    step = beat["step"]
    assert beat["status"] == "finished" and beat["ended"] == "time_limit" and 0 < step < 100000, beat
    assert step % 2 == 0 and results["limited"]["checkpoints"] == [f"step_{step:08d}"]
    state = json.loads((run_dir / "checkpoints" / f"step_{step:08d}" / "trainer_state.json").read_text())
    assert state["ended"] == "time_limit" and "test" not in state  # a resume tests its later weights again
    tests = [row for row in metrics_rows(run_dir) if "test_examples" in row]
    assert [(row["step"], row["test_examples"], row["ended"]) for row in tests] == [(step, 8, "time_limit")]
    assert (run_dir / "export" / "hf").is_dir()
