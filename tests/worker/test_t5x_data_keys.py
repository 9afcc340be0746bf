"""The T5X backend's data-side shared keys, in its seqio task (``tpuft/worker/t5x/tasks.py``,
``t5x_data.py``), read back from seqio itself in the T5X venv (one subprocess, no training):

* ``data.source_transforms`` / ``target_transforms`` / ``preprocess`` with a template and a prefix give the
  sources and targets written out here by hand (the shared ``make_example``, not a copy of it);
* ``data.truncation``: ``head``, ``tail`` and ``head+tail`` keep the tokens
  :func:`tpuft.data.keep_tokens` keeps for the other backends, before seqio's trim and EOS, and the
  test evaluation's decoder keeps the same ones; a short input is untouched;
* ``data.hf``: a ``save_to_disk`` folder and the ``csv`` builder over data files give the same examples, split
  for split, as the JSON lines of the same rows;
* ``eval.metric: bleu | rouge_l``: the task's metric_fns are the shared scorer's numbers on the same strings
  (``tpuft.scoring.text_metrics``), and exact match is the test evaluation's.

The controller-side parts (the spec, the capability matrix, the recipe checks) are tested without the venv."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.worker.test_t5x_parts import run_script
from tpuft.backends.registry import capabilities
from tpuft.config import load_recipe
from tpuft.core.errors import ConfigError
from tpuft.data import keep_tokens
from tpuft.scoring import text_metrics

QUICKSTART = REPO / "tpuft" / "recipes" / "t5x_quickstart.yaml"
ROWS = [
    {"q": "Ștefan  ȘI Țara", "a": " Yes ", "lang": "ro", "drop": False},
    {"q": "Ana are mere", "a": "No", "lang": "ro", "drop": True},
    {"q": "ÎNCĂ o dată", "a": "maybe ", "lang": "ro", "drop": False},
    {"q": "café au lait", "a": " oui", "lang": "fr", "drop": False},
]
"""Diacritics and case for the transforms, a row the hook drops, a field the hook adds."""
HOOK = """
def keep(record):
    if record.get("drop"):
        return None
    return {**record, "n": len(record["q"])}
"""
EXPECTED = [
    ("ask: stefan  si tara [ro/15]", "Yes"),
    ("ask: inca o data [ro/11]", "maybe"),
    ("ask: cafe au lait [fr/12]", "oui"),
]
"""What the data keys make of ROWS (``data`` below), written out by hand."""
LONG = "abcdefghijklmnopqrstuvwxyz"
INPUTS_LENGTH = 8


def data_section(**extra: Any) -> dict[str, Any]:
    return {
        "source_field": "q",
        "target_field": "a",
        "source_template": "{q} [{lang}/{n}]",
        "prefix": "ask: ",
        "source_transforms": ["strip_diacritics", "lowercase"],
        "target_transforms": ["strip"],
        **extra,
    }


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import datasets, seqio
    from tpuft.config import DataConfig
    from tpuft.worker.t5x import tasks as t5x_tasks

    cfg = json.loads(sys.argv[1])
    datasets.Dataset.from_list(cfg["rows"]).save_to_disk(cfg["single"])
    datasets.DatasetDict({"train": datasets.Dataset.from_list(cfg["rows"]),
                          "validation": datasets.Dataset.from_list(cfg["rows"][::-1])}).save_to_disk(cfg["folder"])

    def task(name, data, text_metrics=False):
        data = DataConfig.model_validate(data, context={"check_files": False}).model_dump(mode="json")
        spec = {"name": name, "task": "finetune", "vocabulary": "byt5", "extra_ids": 0, "data": data,
                "text_metrics": text_metrics}
        return seqio.get_mixture_or_task(t5x_tasks.register(spec))

    def rows(task, split, lengths):
        ds = task.get_dataset(lengths, split=split, shuffle=False, seed=0)
        return [[ex["inputs_pretokenized"].decode(), ex["targets_pretokenized"].decode(), ex["inputs"].tolist()]
                for ex in ds.as_numpy_iterator()]

    out = {"examples": {}, "cut": {}, "splits": {}}
    lengths = {"inputs": 64, "targets": 16}
    for name, data in cfg["sources"].items():
        t = task("tpuft_keys_" + name, data)
        out["splits"][name] = sorted(t.splits)
        out["examples"][name] = {split: rows(t, split, lengths) for split in sorted(t.splits)}
    for mode in ("head", "tail", "head+tail"):
        t = task("tpuft_cut_" + mode.replace("+", "_"), dict(cfg["long"], truncation=mode))
        out["cut"][mode] = rows(t, "train", {"inputs": cfg["inputs_length"], "targets": 16})
        out["cut"][mode + " unlimited"] = rows(t, "train", None)  # T5X's inference eval: lengths from the data
    # tf.data's autotuning off for the whole pipeline seqio builds (tasks.without_autotune), on both kinds
    jsonl_task = seqio.get_mixture_or_task("tpuft_keys_jsonl")
    out["autotune"] = [
        jsonl_task.get_dataset(lengths, split="train", shuffle=True, seed=0).options().autotune.enabled,
        t5x_tasks._corpus_dataset("train", False, files=[cfg["long"]["train"]]).options().autotune.enabled,
    ]
    scored = task("tpuft_scored", cfg["sources"]["jsonl"], text_metrics=True)
    plain = task("tpuft_plain", cfg["sources"]["jsonl"])
    out["metric_fns"] = [[f.__name__ for f in t.metric_fns] for t in (scored, plain)]
    out["scores"] = {f.__name__: f(cfg["targets"], cfg["predictions"]) for f in scored.metric_fns}
    from tpuft.worker.t5x.decode import T5xDecoder  # the test evaluation's and predict's tokens: no model needed
    decoder = T5xDecoder.__new__(T5xDecoder)
    decoder.vocabulary, decoder.batch_size, decoder.inputs_length = seqio.ByteVocabulary(), 2, cfg["inputs_length"]
    for mode in ("head", "tail", "head+tail"):
        decoder.truncation = mode
        out["cut"][mode + " decoder"] = decoder.tokens([cfg["long_text"], "abc"]).tolist()
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="module")
def stack(t5x_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("t5x-data-keys")
    jsonl = folder / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS), encoding="utf-8")
    reversed_jsonl = folder / "reversed.jsonl"
    reversed_jsonl.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS[::-1]))
    tables = {"train": folder / "rows.csv", "validation": folder / "reversed.csv"}
    for split, rows in (("train", ROWS), ("validation", ROWS[::-1])):
        with tables[split].open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=["q", "a", "lang", "drop"])
            writer.writeheader()
            for row in rows:
                # the hook drops a non-empty text
                writer.writerow({**row, "drop": "yes" if row["drop"] else ""})
    hook = folder / "hook.py"
    hook.write_text(HOOK)
    preprocess = f"{hook}:keep"
    long_file = folder / "long.jsonl"
    long_file.write_text(
        json.dumps({"source": LONG, "target": "x"})
        + "\n"
        + json.dumps({"source": "abc", "target": "y"})
        + "\n"
    )
    sources = {
        "jsonl": data_section(train=str(jsonl), eval=str(reversed_jsonl), preprocess=preprocess),
        "saved": data_section(
            hf={"path": str(folder / "saved"), "eval_split": "validation"}, preprocess=preprocess
        ),
        "saved_one_split": data_section(hf={"path": str(folder / "single")}, preprocess=preprocess),
        "csv": data_section(
            hf={
                "path": "csv",
                "data_files": {split: [str(path)] for split, path in tables.items()},
                "eval_split": "validation",
                "streaming": True,
            },
            preprocess=preprocess,
        ),
    }
    config = {
        "rows": ROWS,
        "folder": str(folder / "saved"),
        "single": str(folder / "single"),
        "sources": sources,
        "long": {"train": str(long_file)},
        "inputs_length": INPUTS_LENGTH,
        "long_text": LONG,
        "targets": ["the cat sat on the mat", "a b c", "42", "hello world"],
        "predictions": ["the cat sat on a mat", "a  b c ", "24", "hello there world"],
    }
    return run_script(t5x_python, SCRIPT, config, folder, timeout=300)


@pytest.mark.slow
def test_transforms_template_prefix_and_hook_make_the_shared_examples(stack: dict[str, Any]) -> None:
    train = stack["examples"]["jsonl"]["train"]
    assert [(source, target) for source, target, _ in train] == EXPECTED
    # ByT5 ids of the built text, EOS
    assert train[0][2] == [byte + 3 for byte in EXPECTED[0][0].encode()] + [1]
    assert [(s, t) for s, t, _ in stack["examples"]["jsonl"]["validation"]] == EXPECTED[::-1]


@pytest.mark.slow
def test_the_pipelines_run_without_tf_datas_autotuning(stack: dict[str, Any]) -> None:
    """Autotuning's teardown held T5X's hosts idle up to a minute after every evaluation (tasks.py)."""
    assert stack["autotune"] == [False, False]


@pytest.mark.slow
def test_a_hugging_face_dataset_gives_the_examples_of_the_same_json_lines(stack: dict[str, Any]) -> None:
    """A saved DatasetDict, a saved single Dataset (its one split is data.hf.split) and the csv builder,
    streamed."""
    assert stack["splits"]["saved"] == stack["splits"]["csv"] == ["train", "validation"]
    assert stack["splits"]["saved_one_split"] == ["train"]
    for name in ("saved", "csv"):
        assert stack["examples"][name] == stack["examples"]["jsonl"], name
    assert stack["examples"]["saved_one_split"]["train"] == stack["examples"]["jsonl"]["train"]


@pytest.mark.slow
def test_truncation_keeps_the_tokens_the_other_backends_keep(stack: dict[str, Any]) -> None:
    ids = [byte + 3 for byte in LONG.encode()]
    limit = INPUTS_LENGTH - 1  # room for EOS
    expected = {"head": ids[:7], "tail": ids[-7:], "head+tail": ids[:4] + ids[-3:]}
    for mode, kept in expected.items():
        assert kept == keep_tokens(ids, limit, mode)
        (long_row, short_row) = stack["cut"][mode]
        assert long_row[2] == kept + [1], mode
        assert short_row[2] == [byte + 3 for byte in b"abc"] + [1], mode  # shorter than the limit: as it is
        assert long_row[0] == LONG  # the text the logs and predictions show is the whole input
        assert stack["cut"][mode + " unlimited"][0][2] == ids + [1], mode  # no lengths: nothing to cut
        assert stack["cut"][mode + " decoder"] == [long_row[2], short_row[2] + [0] * (INPUTS_LENGTH - 4)], (
            mode
        )


@pytest.mark.slow
def test_bleu_and_rouge_l_are_the_shared_scorers(stack: dict[str, Any]) -> None:
    targets = ["the cat sat on the mat", "a b c", "42", "hello world"]
    predictions = ["the cat sat on a mat", "a  b c ", "24", "hello there world"]
    assert stack["metric_fns"] == [["exact_match", "text_scores"], ["exact_match"]]
    scores = stack["scores"]
    # "a  b c " is "a b c" once whitespace runs collapse
    assert scores["exact_match"] == {"exact_match": 0.25}
    normalized = [" ".join(p.split()) for p in predictions]
    assert scores["text_scores"]["bleu"] == pytest.approx(
        text_metrics.corpus_bleu(normalized, targets), abs=1e-4
    )
    assert scores["text_scores"]["rouge_l"] == pytest.approx(
        text_metrics.rouge_l(normalized, targets), abs=1e-4
    )
    assert 0 < scores["text_scores"]["bleu"] < 100 and 0 < scores["text_scores"]["rouge_l"] < 100


# ----------------------------------------------------------------------------------------------------------
# the controller side: no venv


def test_samples_are_shown_as_the_torch_trainer_shows_them() -> None:
    from tpuft.worker.t5x.data import sample_lines

    decodes = [
        {"input": "two", "prediction": "2 ", "target": "2"},
        {"input": "ten", "prediction": "1", "target": "10"},
        {"input": "six", "prediction": "6", "target": "6"},
    ]
    assert sample_lines(decodes, 2) == [
        "'two' -> '2 ' (expected '2') ok",
        "'ten' -> '1' (expected '10') MISS",
    ]
    assert sample_lines(decodes, 0) == []


def recipe_with(tmp_path: Path, overrides: list[str]) -> Any:
    return load_recipe(QUICKSTART, overrides).value


def test_the_spec_carries_the_data_section_and_the_text_metrics(tmp_path: Path) -> None:
    from tpuft.worker.t5x.data import finetune_spec

    recipe = recipe_with(
        tmp_path, ["data.truncation=tail", "data.source_transforms=[lowercase]", "eval.metric=bleu"]
    )
    spec = finetune_spec(recipe)
    assert spec["data"] == recipe.data.model_dump(mode="json")
    assert spec["data"]["truncation"] == "tail" and spec["data"]["source_transforms"] == ["lowercase"]
    assert spec["text_metrics"] is True
    assert recipe.eval.generate_examples == 256  # shown as samples at each eval
    assert finetune_spec(recipe_with(tmp_path, []))["text_metrics"] is False
    assert finetune_spec(recipe_with(tmp_path, ["eval.generate_examples=3"]))["text_metrics"] is True


def test_t5x_declares_the_data_keys_and_says_why_not_labels() -> None:
    declared = capabilities()["t5x"]
    for key in ("truncation", "source_transforms", "target_transforms", "preprocess", "hf"):
        assert ("data", key) in declared.keys
    assert ("eval", "generate_examples") in declared.keys
    assert {"bleu", "rouge_l"} <= declared.metrics
    assert "text-to-text" in declared.why_not["data.label_field"]
    assert "data.labels" in declared.why_not


def test_a_hugging_face_dataset_replaces_data_train_and_a_label_field_is_refused(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    recipe = load_recipe(
        QUICKSTART,
        [
            "data.train=null",
            "data.eval=null",
            "data.test=null",
            f"data.hf.path={saved}",
            "data.hf.eval_split=validation",
            "data.hf.test_split=test",
        ],
    ).value
    assert recipe.data.hf is not None and recipe.data.train is None
    from tpuft.backends.base import ClusterShape, get_backend

    shape = ClusterShape(hosts=2, chips_per_host=1, target="cpu")
    # the hf eval split is evaluated: its batch must split too
    assert get_backend("t5x").check(
        recipe.model_copy(update={"eval": recipe.eval.model_copy(update={"batch_size": 3})}), shape
    )
    with pytest.raises(ConfigError) as info:
        load_recipe(QUICKSTART, ["data.label_field=digits"])
    assert "data.label_field" in str(info.value) and "T5X trains text-to-text models" in str(info.value)


@pytest.mark.parametrize(
    ("metric", "ranked_by"),
    [
        ("bleu", "eval_bleu"),
        ("rouge_l", "eval_rouge_l"),
        ("loss", "eval_exact_match"),
        (None, "eval_exact_match"),
    ],
)
def test_keep_best_ranks_the_inference_evals_by_eval_metric(
    tmp_path: Path, metric: str | None, ranked_by: str
) -> None:
    """BLEU and ROUGE-L rank T5X's inference evals like any metric; the teacher-forced eval's loss is a row of
    its own, so its metric falls back to exact match there."""
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.t5x.train import T5xRun

    recipe = load_recipe(QUICKSTART, [f"eval.metric={metric}" if metric else "eval.metric=null"]).value
    ctx = WorkerContext(
        run_id="r",
        run_dir=tmp_path,
        worker_id=0,
        num_workers=1,
        coordinator="127.0.0.1:1",
        run_url=str(tmp_path),
    )
    run = T5xRun(ctx, recipe)
    rows = {
        10: {"eval_exact_match": 0.5, "eval_bleu": 20.0, "eval_rouge_l": 60.0},
        20: {"eval_exact_match": 0.9, "eval_bleu": 10.0, "eval_rouge_l": 50.0},
    }
    for step, row in rows.items():
        run.loop.judge(step, row)
    best = 20 if ranked_by == "eval_exact_match" else 10
    assert run.loop.best == {"metric": ranked_by, "value": rows[best][ranked_by], "step": best}
