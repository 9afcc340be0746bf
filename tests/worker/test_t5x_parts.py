"""The T5X trainer's parts against the real stack (the T5X venv: jax, flax, seqio, gin, TensorFlow, t5x):

* span corruption (``tpuft/worker/t5x/tasks.py``) through seqio, with ByT5's bytes and with a SentencePiece
  vocabulary plus extra ids: exact lengths, sentinels, masking statistics, and the corpus rebuilt from the
  outputs;
* the fine-tuning task: shards, fields/templates/prefix, the metric;
* the generated run gin parsed by gin as ``t5x.train`` parses it, and what it binds (steps, model, vocabulary,
  qualified overrides, the learning-rate schedule built by T5X itself);
* a few real training steps in one process, and the Hugging Face export's logits against T5X's own.

Each stack-side check runs once in a subprocess of the T5X venv and prints JSON; the assertions are made
here."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tpuft.config import dump_recipe, load_recipe
from tpuft.run.predict_job import PredictJob
from tpuft.scoring import predictions
from tpuft.worker.selection import score
from tpuft.worker.t5x.gin import initial_step, network_module, task_name

QUICKSTART = REPO / "tpuft" / "recipes" / "t5x_quickstart.yaml"
NUMBERS = REPO / "tpuft" / "recipes" / "data" / "numbers"
INPUTS_LENGTH = 128
SENTINEL_WINDOW = 60
"""Ids within this many of the top of the vocabulary are sentinels here (the test corpus never reaches
them)."""


def stack_env(**extra: str) -> dict[str, str]:
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if "TPUFT_HOME" in os.environ:
        env["TPUFT_HOME"] = os.environ["TPUFT_HOME"]
    return {**env, **extra}


def run_script(python: str, script: str, config: dict[str, Any], folder: Path, timeout: int = 600) -> Any:
    """Run ``script`` (its argv[1] is ``config`` as JSON) with ``python`` from the repository root; the JSON
    it printed last."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"script_{abs(hash(script)) % 10**8}.py"
    path.write_text(script)
    proc = subprocess.run(
        [python, str(path), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=stack_env(),
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-5000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------
# inputs shared by the tests: a generated corpus and a tiny SentencePiece model trained on it


def write_corpus(path: Path) -> Path:
    """~400 documents of made-up words (ASCII), with blank and whitespace-only lines that must be skipped."""
    rng = random.Random(0)
    syllables = [
        "ka",
        "lo",
        "mi",
        "ne",
        "ru",
        "sa",
        "to",
        "vi",
        "ze",
        "pa",
        "qu",
        "bo",
        "di",
        "fe",
        "gu",
        "ha",
        "ji",
        "wo",
        "xy",
        "ce",
    ]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    lines = []
    for index in range(400):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
        if index % 97 == 0:
            lines.append("   ")
        if index % 53 == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TRAIN_SENTENCEPIECE = textwrap.dedent(
    """
    import json, sys
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    cfg = json.loads(sys.argv[1])
    # T5's id layout: pad 0, EOS 1, unk 2, no BOS (seqio pads with 0 and appends the model's EOS)
    spm.SentencePieceTrainer.train(input=cfg["corpus"], model_prefix=cfg["prefix"], vocab_size=100,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=1.0, num_threads=1, minloglevel=2)
    # The same model with 5 sentinel pieces of its own at the top, <extra_id_0> last (as T5's vocabularies have them)
    proto = pb.ModelProto()
    proto.ParseFromString(open(cfg["prefix"] + ".model", "rb").read())
    for i in reversed(range(5)):
        proto.pieces.add(piece=f"<extra_id_{i}>", score=0.0, type=pb.ModelProto.SentencePiece.USER_DEFINED)
    open(cfg["prefix"] + "_sentinels.model", "wb").write(proto.SerializeToString())
    print(json.dumps({"model": cfg["prefix"] + ".model", "with_sentinels": cfg["prefix"] + "_sentinels.model"}))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("t5x-parts")


@pytest.fixture(scope="module")
def corpus(stack_dir: Path) -> Path:
    return write_corpus(stack_dir / "corpus.txt")


@pytest.fixture(scope="module")
def sentencepiece(t5x_python: str, corpus: Path, stack_dir: Path) -> dict[str, str]:
    return run_script(
        t5x_python,
        TRAIN_SENTENCEPIECE,
        {"corpus": str(corpus), "prefix": str(stack_dir / "sp")},
        stack_dir,
        timeout=300,
    )


# ----------------------------------------------------------------------------------------------------------
# span corruption


SPAN = textwrap.dedent(
    """
    import json, sys
    import seqio
    from tpuft.core.errors import UsageError
    from tpuft.worker.t5x import tasks as t5x_tasks

    cfg = json.loads(sys.argv[1])
    corpus, L = cfg["corpus"], cfg["inputs_length"]
    out = {"helper_512": list(t5x_tasks.random_spans_helper(512, 0.15, 3.0)),
           "helper": list(t5x_tasks.random_spans_helper(L, 0.15, 3.0))}
    lines = [line.rstrip("\\n") for line in open(corpus, encoding="utf-8")]
    for kind, vocabulary, extra in (("byte", "byt5", 0), ("sp", cfg["sp_model"], 100)):
        spec = {"name": f"tpuft_test_span_{kind}", "task": "span_corruption", "vocabulary": vocabulary,
                "extra_ids": extra, "corpus": [corpus], "inputs_length": L, "noise_density": 0.15,
                "mean_noise_span_length": 3.0}
        name = t5x_tasks.register(spec)
        vocab = t5x_tasks.vocabulary(spec)
        lengths = {"inputs": L, "targets": out["helper"][1]}
        runs = {}
        for tag, seed in (("a", 7), ("b", 7), ("c", 8)):
            ds = seqio.get_mixture_or_task(name).get_dataset(lengths, split="train", shuffle=False, seed=seed)
            runs[tag] = [{k: ex[k].tolist() for k in ("inputs", "targets")} for ex in ds.as_numpy_iterator()]
        out[kind] = {
            "vocab_size": vocab.vocab_size, "eos": vocab.eos_id, "pieces": vocab.vocab_size - extra,
            "stream": [t for line in lines if line.strip() for t in vocab.encode(line)],
            "examples": runs["a"], "same_seed": runs["b"], "other_seed": runs["c"],
        }

    # sentinel ids: a SentencePiece vocabulary without extra ids is refused unless its top pieces are sentinels
    checks = {}
    for label, model, extra in (("plain_0", cfg["sp_model"], 0), ("own_sentinels_0", cfg["sp_sentinels"], 0),
                                ("plain_100", cfg["sp_model"], 100), ("byte_0", "byt5", 0)):
        spec = {"name": f"tpuft_test_check_{label}", "task": "span_corruption", "vocabulary": model,
                "extra_ids": extra, "corpus": [corpus], "inputs_length": L, "noise_density": 0.15,
                "mean_noise_span_length": 3.0}
        try:
            t5x_tasks.check_sentinels(t5x_tasks.vocabulary(spec), spec)
            direct = None
        except UsageError as exc:  # one located line on the worker, exit 2
            direct = str(exc)
        try:
            t5x_tasks.register(spec)
            registered = None
        except UsageError as exc:
            registered = str(exc)
        vocab = t5x_tasks.vocabulary(spec)
        checks[label] = {"direct": direct, "register": registered, "vocab_size": vocab.vocab_size,
                         "top": vocab.tokenizer.id_to_piece(vocab.vocab_size - 1) if hasattr(vocab, "tokenizer") else None}
    out["checks"] = checks
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="module")
def span(t5x_python: str, corpus: Path, sentencepiece: dict[str, str], stack_dir: Path) -> dict[str, Any]:
    config = {
        "corpus": str(corpus),
        "inputs_length": INPUTS_LENGTH,
        "sp_model": sentencepiece["model"],
        "sp_sentinels": sentencepiece["with_sentinels"],
    }
    return run_script(t5x_python, SPAN, config, stack_dir)


def split_at_sentinels(tokens: list[int], floor: int) -> tuple[list[list[int]], list[int]]:
    parts: list[list[int]] = [[]]
    sentinels = []
    for token in tokens:
        if token >= floor:
            sentinels.append(token)
            parts.append([])
        else:
            parts[-1].append(token)
    return parts, sentinels


def decode_examples(result: dict[str, Any], examples: list[dict[str, list[int]]]) -> dict[str, Any]:
    """Inputs and targets merged back by their sentinels: the token stream, and each example's span
    lengths."""
    vs, eos = result["vocab_size"], result["eos"]
    floor = vs - SENTINEL_WINDOW
    stream: list[int] = []
    spans: list[list[int]] = []
    kept: list[list[int]] = []
    for number, example in enumerate(examples):
        inputs, targets = example["inputs"], example["targets"]
        assert inputs[-1] == eos and targets[-1] == eos, number
        assert eos not in inputs[:-1] and eos not in targets[:-1], number
        in_parts, in_sentinels = split_at_sentinels(inputs[:-1], floor)
        out_parts, out_sentinels = split_at_sentinels(targets[:-1], floor)
        expected = list(range(vs - 1, vs - 1 - len(in_sentinels), -1))
        assert in_sentinels == expected, (number, in_sentinels)  # counting down from vocab_size - 1
        # the same, in the same order
        assert out_sentinels == in_sentinels, (
            number,
            in_sentinels,
            out_sentinels,
        )
        assert len(in_sentinels) >= 1
        # T5's mask starts with kept tokens and ends with a masked span: inputs open with text and end with a
        # sentinel, targets open with the first sentinel
        assert in_parts[0] and in_parts[-1] == [] and out_parts[0] == [], number
        masked = out_parts[1:]
        assert all(masked), number  # a sentinel never stands for an empty span
        for text, span_tokens in zip(in_parts[:-1], masked):
            stream += text + span_tokens
        spans.append([len(s) for s in masked])
        kept.append([len(t) for t in in_parts[:-1]])
    return {"stream": stream, "spans": spans, "kept": kept}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_span_corruption_fills_the_inputs_exactly(span: dict[str, Any], kind: str) -> None:
    """T5's arithmetic: the piece length is chosen so that kept tokens + one sentinel per span + EOS fill the
    inputs length exactly; the targets (the spans, their sentinels, EOS) are exactly the helper's targets
    length."""
    assert span["helper_512"] == [568, 114]
    tokens_length, targets_length = span["helper"]
    assert (tokens_length, targets_length) == (141, 29)  # 128 inputs at 0.15 / 3.0: 21 masked in 7 spans
    examples = span[kind]["examples"]
    assert len(examples) > 30
    *full, last = examples
    assert [len(e["inputs"]) for e in full] == [INPUTS_LENGTH] * len(full)
    assert [len(e["targets"]) for e in full] == [targets_length] * len(full)
    # the corpus's tail is a shorter piece (as in T5): never longer than the features
    assert len(last["inputs"]) <= INPUTS_LENGTH and len(last["targets"]) <= targets_length


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_span_corruption_round_trips_to_the_corpus(span: dict[str, Any], kind: str) -> None:
    """Inputs and targets merged back by their sentinels are the corpus, tokenized and concatenated (blank
    lines skipped), nothing lost or repeated; sentinels are ids of their own (extra ids for SentencePiece)."""
    result = span[kind]
    vs = result["vocab_size"]
    # the test's premise: no corpus token looks like a sentinel
    assert max(result["stream"]) < vs - SENTINEL_WINDOW
    if kind == "sp":
        # 100 pieces + 100 extra ids: sentinels are ids 199, 198...
        assert (vs, result["pieces"]) == (
            200,
            100,
        )
    else:
        assert vs == 259  # 256 bytes + pad, EOS, unk: ByT5's sentinels are the top byte values
    decoded = decode_examples(result, result["examples"])
    assert len(decoded["stream"]) == len(result["stream"])
    assert decoded["stream"] == result["stream"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_span_corruption_masks_15_percent_in_spans_of_mean_3(span: dict[str, Any], kind: str) -> None:
    result = span[kind]
    decoded = decode_examples(result, result["examples"])
    for spans, kept in zip(decoded["spans"], decoded["kept"]):
        length = sum(spans) + sum(kept)
        noise = round(length * 0.15)
        assert sum(spans) == min(max(noise, 1), length - 1)  # T5's count, per piece
        assert len(spans) == max(round(noise / 3.0), 1)
    all_spans = [n for spans in decoded["spans"] for n in spans]
    masked = sum(all_spans)
    total = masked + sum(n for kept in decoded["kept"] for n in kept)
    assert 0.14 <= masked / total <= 0.16
    assert 2.7 <= masked / len(all_spans) <= 3.3
    assert len(set(all_spans)) >= 4  # random span lengths, not fixed ones
    assert min(all_spans) == 1 and max(all_spans) >= 6
    # spans are placed at random: the first masked span does not always start at the same offset
    assert len({kept[0] for kept in decoded["kept"]}) > 5


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_span_corruption_is_reproducible_by_seed(span: dict[str, Any], kind: str) -> None:
    result = span[kind]
    assert result["same_seed"] == result["examples"]
    assert result["other_seed"] != result["examples"]
    # other masks, same text
    assert decode_examples(result, result["other_seed"])["stream"] == result["stream"]


@pytest.mark.slow
def test_sentinel_check_refuses_a_sentencepiece_vocabulary_without_sentinels(span: dict[str, Any]) -> None:
    checks = span["checks"]
    plain = checks["plain_0"]
    assert plain["vocab_size"] == 100 and plain["top"] not in (None, "") and "extra_id" not in plain["top"]
    for message in (plain["direct"], plain["register"]):
        assert message is not None
        assert "backend.extra_ids" in message and repr(plain["top"]) in message
    # sentinel pieces of its own at the top of the .model, or seqio's extra ids, or ByT5's bytes: accepted
    own = checks["own_sentinels_0"]
    assert own["top"] == "<extra_id_0>" and own["vocab_size"] == 105
    for label in ("own_sentinels_0", "plain_100", "byte_0"):
        assert checks[label]["direct"] is None and checks[label]["register"] is None, (label, checks[label])
    assert checks["plain_100"]["vocab_size"] == 200


# ----------------------------------------------------------------------------------------------------------
# fine-tuning task


FINETUNE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import seqio
    from tpuft.config import load_recipe
    from tpuft.worker.t5x import tasks as t5x_tasks
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.t5x.train import T5xRun

    cfg = json.loads(sys.argv[1])
    out = {}
    recipe = load_recipe(Path(cfg["recipe"])).value
    run_dir = Path(cfg["run_dir"])
    ctx = WorkerContext(run_id="numbers-1", run_dir=run_dir, worker_id=0, num_workers=1, coordinator="127.0.0.1:1",
                        run_url=str(run_dir))
    spec = T5xRun(ctx, recipe).task_spec()  # the spec the trainer registers
    out["spec"] = spec
    task = seqio.get_mixture_or_task(t5x_tasks.register(spec))
    lengths = {"inputs": 64, "targets": 8}

    def rows(task, split, shard=None):
        ds = task.get_dataset(lengths, split=split, shuffle=False, seed=0, shard_info=shard)
        return [{k: (v.decode() if isinstance(v, bytes) else v.tolist()) for k, v in ex.items()}
                for ex in ds.as_numpy_iterator()]

    out["splits"] = sorted(task.splits)
    out["shards"] = [rows(task, "validation", seqio.ShardInfo(i, 2)) for i in range(2)]
    out["train_count"] = sum(1 for _ in task.get_dataset(lengths, split="train", shuffle=False).as_numpy_iterator())
    vocab = t5x_tasks.vocabulary(spec)
    out["encoded"] = {text: vocab.encode(text) for ex in out["shards"][0][:5]
                      for text in (ex["inputs_pretokenized"], ex["targets_pretokenized"])}

    templated = dict(spec, name="tpuft_test_templated",
                     data=dict(spec["data"], train=cfg["templated"], eval=None, test=None, source_field="source",
                               target_field="answer", source_template="{question} ({meta.lang})", prefix="solve: "))
    task = seqio.get_mixture_or_task(t5x_tasks.register(templated))
    out["templated_splits"] = sorted(task.splits)
    out["templated"] = rows(task, "train")
    out["exact_match"] = [t5x_tasks.exact_match(["12", "7"], ["12", "7"]),
                          t5x_tasks.exact_match(["12", "7", "3", "4"], [" 12 ", "8", "3", "44"]),
                          t5x_tasks.exact_match(["a", "b"], ["b", "a"])]
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="module")
def finetune(t5x_python: str, stack_dir: Path) -> dict[str, Any]:
    templated = stack_dir / "templated.jsonl"
    templated.write_text(
        '{"question": "two plus two", "meta": {"lang": "en"}, "answer": "4"}\n\n'
        '{"question": "drei mal drei", "meta": {"lang": "de"}, "answer": "9"}\n'
    )
    config = {"recipe": str(QUICKSTART), "run_dir": str(stack_dir / "run-ft"), "templated": str(templated)}
    return run_script(t5x_python, FINETUNE, config, stack_dir)


@pytest.mark.slow
def test_the_finetune_spec_is_the_recipes(finetune: dict[str, Any]) -> None:
    recipe = load_recipe(QUICKSTART).value
    assert finetune["spec"] == {
        "name": "tpuft_numbers_1",
        "task": "finetune",
        "vocabulary": "byt5",
        "extra_ids": 0,
        "data": recipe.data.model_dump(mode="json"),
        "text_metrics": False,
    }
    assert finetune["spec"]["data"]["train"] == str(NUMBERS / "train.jsonl")
    assert finetune["splits"] == ["train", "validation"]


@pytest.mark.slow
def test_finetune_shards_are_disjoint_and_cover_the_validation_split(finetune: dict[str, Any]) -> None:
    """Each host reads its shard of the eval data: two shards together are every held-out example, once."""
    expected = Counter()
    for line in (NUMBERS / "eval.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            expected[(record["words"], record["digits"])] += 1
    assert sum(expected.values()) == 500
    assert len(expected) == 500  # every held-out example is different: shards can be told apart
    shards = [
        Counter((r["inputs_pretokenized"], r["targets_pretokenized"]) for r in rows)
        for rows in finetune["shards"]
    ]
    assert all(200 <= sum(shard.values()) <= 300 for shard in shards)
    assert not set(shards[0]) & set(shards[1])
    assert shards[0] + shards[1] == expected
    assert finetune["train_count"] == 9000


@pytest.mark.slow
def test_finetune_tokens_are_the_vocabularys_with_eos(finetune: dict[str, Any]) -> None:
    for row in finetune["shards"][0][:5]:
        assert row["inputs"] == finetune["encoded"][row["inputs_pretokenized"]] + [1]
        assert row["targets"] == finetune["encoded"][row["targets_pretokenized"]] + [1]
        assert row["inputs"] == [b + 3 for b in row["inputs_pretokenized"].encode()] + [1]  # ByT5: byte + 3


@pytest.mark.slow
def test_finetune_applies_the_template_and_the_prefix(finetune: dict[str, Any]) -> None:
    assert finetune["templated_splits"] == ["train"]  # no eval file, no validation split
    rows = finetune["templated"]
    assert [(r["inputs_pretokenized"], r["targets_pretokenized"]) for r in rows] == [
        ("solve: two plus two (en)", "4"),
        ("solve: drei mal drei (de)", "9"),
    ]
    assert rows[0]["inputs"] == [b + 3 for b in b"solve: two plus two (en)"] + [1]


@pytest.mark.slow
def test_exact_match(finetune: dict[str, Any]) -> None:
    assert finetune["exact_match"] == [{"exact_match": 1.0}, {"exact_match": 0.5}, {"exact_match": 0.0}]


# ----------------------------------------------------------------------------------------------------------
# the run gin, parsed by gin as t5x.train parses it


GIN = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import gin, t5x, __main__
    import t5x.train as train_script
    from t5x import gin_utils, utils
    from tpuft.config import load_recipe
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.t5x.gin import GIN_IMPORTS, initial_step, learning_rate_bindings, qualify, run_gin
    from tpuft.worker.t5x.train import T5xRun

    __main__.train = train_script.train  # the gin binds `__main__.train`: t5x.train runs as __main__
    SEARCH = [os.path.dirname(os.path.dirname(t5x.__file__))]
    cfg = json.loads(sys.argv[1])
    out = {"cases": {}}

    def value(text):
        try:
            return gin.query_parameter(text)
        except Exception as exc:  # noqa: BLE001
            return f"ERROR {type(exc).__name__}: {exc}"

    def plain(x):
        return x if isinstance(x, (int, float, str, bool, type(None), list, dict)) else repr(x)

    for case in cfg["cases"]:
        recipe = load_recipe(Path(case["recipe"]), case["overrides"]).value
        run_dir = Path(cfg["run_dir"])
        ctx = WorkerContext(run_id="gin-1", run_dir=run_dir, worker_id=0, num_workers=1, coordinator="127.0.0.1:1",
                            run_url=str(run_dir))
        start = initial_step(recipe)
        text = run_gin(recipe, T5xRun(ctx, recipe).task_spec(), model_dir="/nowhere/checkpoints",
                       initial_step=start, cpu=True)
        path = Path(cfg["run_dir"]) / f"{case['label']}.gin"
        path.write_text(text)
        gin.clear_config()
        gin_utils.parse_gin_flags(gin_search_paths=SEARCH, gin_files=[str(path)], gin_bindings=[])
        result = {"text": text, "initial_step": start, "steps": recipe.train.steps,
                  "values": {q: plain(value(q)) for q in case["queries"]}}
        model = gin.query_parameter("%MODEL").scoped_configurable_fn()
        config = model.module.config
        result["network"] = {k: plain(getattr(config, k)) for k in (
            "vocab_size", "dtype", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_encoder_layers",
            "num_decoder_layers", "dropout_rate")}
        vocab = gin.query_parameter("%VOCABULARY").scoped_configurable_fn()
        result["vocabulary"] = {"class": type(vocab).__name__, "size": vocab.vocab_size,
                                "extra_ids": getattr(vocab, "extra_ids", None),
                                "file": getattr(vocab, "sentencepiece_model_file", None)}
        result["model_vocabulary_is_input"] = type(model.input_vocabulary).__name__ == type(vocab).__name__
        # the schedule T5X builds from this gin vs the one built from tpuft's bindings
        from_gin = gin.query_parameter("trainer.Trainer.learning_rate_fn").scoped_configurable_fn()
        direct = utils.create_learning_rate_scheduler(
            **{k.rsplit(".", 1)[1]: v for k, v in learning_rate_bindings(recipe, start).items()})
        points = [start + s for s in case["lr_steps"]]
        result["lr_gin"] = [float(from_gin(p)) for p in points]
        result["lr_direct"] = [float(direct(p)) for p in points]
        out["cases"][case["label"]] = result

    # tpuft's schedules, built by T5X: a run of 100 steps after an initial checkpoint at step 1000, 10 warm-up
    schedules = {}
    for label, overrides in cfg["schedules"].items():
        recipe = load_recipe(Path(cfg["quickstart"]), overrides).value
        bindings = learning_rate_bindings(recipe, 1000)
        fn = utils.create_learning_rate_scheduler(**{k.rsplit(".", 1)[1]: v for k, v in bindings.items()})
        schedules[label] = {"peak": recipe.train.learning_rate, "lr": [float(fn(1000 + s)) for s in range(0, 101)]}
    out["schedules"] = schedules
    out["qualify"] = {name: qualify(name, {**GIN_IMPORTS, "network": "t5x.examples.t5.network"})
                      for name in cfg["qualify"]}
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)

SPAN_RECIPE = """\
name: span-sp
backend:
  kind: t5x
  task: span_corruption
  family: t5_1_1
  size: small
  vocabulary: {vocabulary}
  extra_ids: 100
  gin_overrides:
    network.T5Config.vocab_size: 256
    network.T5Config.emb_dim: 64
    PjitPartitioner.num_partitions: 2
    Trainer.num_microbatches: 4
    EncoderDecoderModel.z_loss: 0.0002
    infer_eval/DatasetConfig.batch_size: 16
    Adafactor.decay_rate: 0.7
    DROPOUT_RATE: 0.05
data:
  corpus: [{corpus}]
  max_source_length: 64
  max_target_length: 4
train:
  steps: 50
  batch_size: 8
  optimizer: adafactor
  learning_rate: 0.01
  warmup_steps: 10
  schedule: inverse_sqrt
"""


@pytest.fixture(scope="module")
def gin_parsed(
    t5x_python: str, corpus: Path, sentencepiece: dict[str, str], stack_dir: Path
) -> dict[str, Any]:
    span_recipe = stack_dir / "span-sp.yaml"
    span_recipe.write_text(SPAN_RECIPE.format(vocabulary=sentencepiece["model"], corpus=corpus))
    cases = [
        {
            "label": "initial",
            "recipe": str(QUICKSTART),
            "lr_steps": [0, 5, 10, 20],
            "overrides": [
                "backend.initial_checkpoint=/tmp/x/checkpoint_1000000",
                "train.steps=20",
                "train.warmup_steps=5",
            ],
            "queries": [
                "%TRAIN_STEPS",
                "%USE_CACHED_TASKS",
                "%BATCH_SIZE",
                "%INITIAL_CHECKPOINT_PATH",
                "%MODEL_DIR",
                "%LOSS_NORMALIZING_FACTOR",
                "%TASK_FEATURE_LENGTHS",
                "%MIXTURE_OR_TASK_NAME",
                "%RANDOM_SEED",
                "train/utils.DatasetConfig.seed",
                "network.T5Config.emb_dim",
                "partitioning.PjitPartitioner.num_partitions",
                "train_script.train.stats_period",
                "utils.SaveCheckpointConfig.period",
            ],
        },
        {
            "label": "scratch",
            "recipe": str(QUICKSTART),
            "overrides": [],
            "lr_steps": [0, 100, 400],
            "queries": ["%TRAIN_STEPS", "%INITIAL_CHECKPOINT_PATH", "%LOSS_NORMALIZING_FACTOR"],
        },
        {
            "label": "span",
            "recipe": str(span_recipe),
            "overrides": [],
            "lr_steps": [0, 10, 40],
            "queries": [
                "%TRAIN_STEPS",
                "%TASK_FEATURE_LENGTHS",
                "%LOSS_NORMALIZING_FACTOR",
                "%DROPOUT_RATE",
                "partitioning.PjitPartitioner.num_partitions",
                "trainer.Trainer.num_microbatches",
                "models.EncoderDecoderModel.z_loss",
                "infer_eval/utils.DatasetConfig.batch_size",
                "adafactor.Adafactor.decay_rate",
                "train_script.train.infer_eval_dataset_cfg",
                "train_script.train.train_eval_dataset_cfg",
            ],
        },
    ]
    warm = ["train.steps=100", "train.warmup_steps=10"]
    schedules = {
        "linear": [*warm, "train.schedule=linear"],
        "inverse_sqrt": [*warm, "train.schedule=inverse_sqrt"],
        "constant": [*warm, "train.schedule=constant"],
        "cosine": [*warm, "train.schedule=cosine"],
        "constant_no_warmup": ["train.steps=100", "train.warmup_steps=0", "train.schedule=constant"],
    }
    qualify = [
        "PjitPartitioner.num_partitions",
        "infer_eval/DatasetConfig.batch_size",
        "Trainer.num_microbatches",
        "T5Config.emb_dim",
        "network.T5Config.emb_dim",
        "utils.SaveCheckpointConfig.period",
        "DROPOUT_RATE",
        "train_script.train.eval_period",
        "Evaluator.num_examples",
        "NoSuchThing.value",
    ]
    config = {
        "cases": cases,
        "schedules": schedules,
        "quickstart": str(QUICKSTART),
        "qualify": qualify,
        "run_dir": str(stack_dir / "run-gin"),
    }
    (stack_dir / "run-gin").mkdir(exist_ok=True)
    return run_script(t5x_python, GIN, config, stack_dir)


@pytest.mark.slow
def test_the_run_gin_counts_steps_after_the_initial_checkpoint(gin_parsed: dict[str, Any]) -> None:
    case = gin_parsed["cases"]["initial"]
    values = case["values"]
    assert case["initial_step"] == 1_000_000
    assert values["%TRAIN_STEPS"] == 1_000_020  # T5X's TRAIN_STEPS is absolute
    assert values["%INITIAL_CHECKPOINT_PATH"] == "/tmp/x/checkpoint_1000000"
    assert values["%LOSS_NORMALIZING_FACTOR"] == 193536.0  # a public ByT5 checkpoint's pretraining batch
    assert values["%USE_CACHED_TASKS"] is False
    assert values["%BATCH_SIZE"] == 32
    assert values["%MODEL_DIR"] == "/nowhere/checkpoints"
    assert values["%MIXTURE_OR_TASK_NAME"] == "tpuft_gin_1"
    assert values["%TASK_FEATURE_LENGTHS"] == {"inputs": 48, "targets": 8}
    # reproducible data order
    assert values["%RANDOM_SEED"] == 0 and values["train/utils.DatasetConfig.seed"] == 0
    assert values["partitioning.PjitPartitioner.num_partitions"] == 1
    assert values["train_script.train.stats_period"] == 50
    assert values["utils.SaveCheckpointConfig.period"] > 0
    scratch = gin_parsed["cases"]["scratch"]
    assert scratch["initial_step"] == 0
    assert scratch["values"]["%TRAIN_STEPS"] == scratch["steps"]
    assert scratch["values"]["%INITIAL_CHECKPOINT_PATH"] is None
    assert scratch["values"]["%LOSS_NORMALIZING_FACTOR"] is None  # from scratch: per batch


@pytest.mark.slow
def test_the_run_gin_builds_the_recipes_model_and_vocabulary(gin_parsed: dict[str, Any]) -> None:
    quick = gin_parsed["cases"]["initial"]
    assert quick["values"]["network.T5Config.emb_dim"] == 128
    assert quick["network"] == {
        "vocab_size": 384,
        "dtype": "float32",
        "emb_dim": 128,
        "num_heads": 4,
        "head_dim": 32,
        "mlp_dim": 256,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "dropout_rate": 0.0,
    }
    assert quick["vocabulary"]["class"] == "ByteVocabulary" and quick["vocabulary"]["size"] == 259
    assert quick["model_vocabulary_is_input"]
    span = gin_parsed["cases"]["span"]
    assert span["vocabulary"] == {
        "class": "SentencePieceVocabulary",
        "size": 200,
        "extra_ids": 100,
        "file": span["vocabulary"]["file"],
    }
    assert Path(span["vocabulary"]["file"]).name == "sp.model"
    assert span["model_vocabulary_is_input"]
    assert span["network"]["vocab_size"] == 256 and span["network"]["emb_dim"] == 64
    assert span["network"]["dropout_rate"] == 0.05  # DROPOUT_RATE from gin_overrides: a macro, left as it is
    values = span["values"]
    assert values["%TASK_FEATURE_LENGTHS"] == {"inputs": 64, "targets": 14}  # raised to what the spans need
    assert values["%LOSS_NORMALIZING_FACTOR"] is None
    assert values["%TRAIN_STEPS"] == 50
    assert values["train_script.train.infer_eval_dataset_cfg"] is None  # no eval data for span corruption
    assert values["train_script.train.train_eval_dataset_cfg"] is None


@pytest.mark.slow
def test_short_form_overrides_are_qualified_and_win(gin_parsed: dict[str, Any]) -> None:
    span = gin_parsed["cases"]["span"]
    overrides = span["text"].split("# backend.gin_overrides", 1)[1]
    for line in (
        "partitioning.PjitPartitioner.num_partitions = 2",
        "trainer.Trainer.num_microbatches = 4",
        "models.EncoderDecoderModel.z_loss = 0.0002",
        "infer_eval/utils.DatasetConfig.batch_size = 16",
        "adafactor.Adafactor.decay_rate = 0.7",
        "network.T5Config.vocab_size = 256",
        "DROPOUT_RATE = 0.05",
    ):
        assert line in overrides.splitlines(), (line, overrides)
    values = span["values"]
    # the override, after the recipe's own 1
    assert values["partitioning.PjitPartitioner.num_partitions"] == 2
    assert values["trainer.Trainer.num_microbatches"] == 4
    assert values["models.EncoderDecoderModel.z_loss"] == 0.0002
    assert values["infer_eval/utils.DatasetConfig.batch_size"] == 16
    assert values["adafactor.Adafactor.decay_rate"] == 0.7
    assert values["%DROPOUT_RATE"] == 0.05
    assert gin_parsed["qualify"] == {
        "PjitPartitioner.num_partitions": "partitioning.PjitPartitioner.num_partitions",
        "infer_eval/DatasetConfig.batch_size": "infer_eval/utils.DatasetConfig.batch_size",
        "Trainer.num_microbatches": "trainer.Trainer.num_microbatches",
        "T5Config.emb_dim": "network.T5Config.emb_dim",
        "network.T5Config.emb_dim": "network.T5Config.emb_dim",
        "utils.SaveCheckpointConfig.period": "utils.SaveCheckpointConfig.period",
        "DROPOUT_RATE": "DROPOUT_RATE",
        "train_script.train.eval_period": "train_script.train.eval_period",
        "Evaluator.num_examples": "seqio.Evaluator.num_examples",
        "NoSuchThing.value": "NoSuchThing.value",
    }


@pytest.mark.slow
def test_the_gin_schedule_is_tpufts_offset_by_the_initial_step(gin_parsed: dict[str, Any]) -> None:
    """The learning rate T5X computes from the parsed gin, at steps counted from the initial checkpoint."""
    case = gin_parsed["cases"]["initial"]  # linear, 5 warm-up steps of 20, peak 0.01
    assert case["lr_gin"] == pytest.approx(case["lr_direct"], rel=1e-6)
    at_0, at_5, at_10, at_20 = case["lr_gin"]
    assert (
        at_0 < 1e-6
        and at_5 == pytest.approx(0.01, rel=1e-5)
        and at_10 == pytest.approx(0.01 * 10 / 15, rel=1e-5)
    )
    assert at_20 < 1e-6
    span = gin_parsed["cases"]["span"]  # inverse_sqrt from scratch, 10 warm-up steps, peak 0.01
    assert span["lr_gin"] == pytest.approx([0.01, 0.01, 0.01 * math.sqrt(10 / 40)], rel=1e-5)


@pytest.mark.slow
def test_learning_rate_schedules_built_by_t5x(gin_parsed: dict[str, Any]) -> None:
    """100 steps after an initial checkpoint at step 1000, 10 warm-up steps (index = step within this run)."""
    schedules = gin_parsed["schedules"]
    linear = schedules["linear"]
    peak, lr = linear["peak"], linear["lr"]
    # T5X's step is absolute: the schedule starts at the initial checkpoint, not at step 0
    assert lr[0] < 1e-6
    assert lr[5] == pytest.approx(peak / 2, rel=1e-5)
    assert lr[10] == pytest.approx(peak, rel=1e-5)  # the peak at the end of warm-up
    assert lr[55] == pytest.approx(peak / 2, rel=1e-5)
    assert lr[100] < 1e-6  # ~0 at the last step
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))
    inverse = schedules["inverse_sqrt"]
    peak, lr = inverse["peak"], inverse["lr"]
    assert lr[:11] == pytest.approx([peak] * 11, rel=1e-5)  # T5's: the peak during warm-up
    for step in (20, 40, 90, 100):
        assert lr[step] == pytest.approx(peak * math.sqrt(10 / step), rel=1e-5)
    constant = schedules["constant"]
    peak, lr = constant["peak"], constant["lr"]
    assert lr[5] == pytest.approx(peak / 2, rel=1e-5) and lr[10:] == pytest.approx([peak] * 91, rel=1e-5)
    flat = schedules["constant_no_warmup"]
    assert flat["lr"] == pytest.approx([flat["peak"]] * 101, rel=1e-5)
    cosine = schedules["cosine"]
    peak, lr = cosine["peak"], cosine["lr"]
    assert lr[5] == pytest.approx(peak / 2, rel=1e-5) and lr[10] == pytest.approx(peak, rel=1e-5)
    assert lr[55] == pytest.approx(peak / 2, rel=1e-5) and lr[99] < peak * 1e-3  # half a cosine to ~0
    assert all(a >= b for a, b in zip(lr[10:100], lr[11:100]))


# ----------------------------------------------------------------------------------------------------------
# a real run of a few steps; the Hugging Face export against T5X's own logits


T5X_LOGITS = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import gin, jax, t5x, __main__
    import orbax.checkpoint as ocp
    import t5x.train as train_script
    from t5x import gin_utils

    cfg = json.loads(sys.argv[1])
    __main__.train = train_script.train
    # the model exactly as the run built it: from the run's own gin
    gin_utils.parse_gin_flags(gin_search_paths=[os.path.dirname(os.path.dirname(t5x.__file__))],
                              gin_files=[cfg["gin"]], gin_bindings=[])
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(cfg["checkpoint"], "state"))
    params = jax.tree_util.tree_map(np.asarray, restored["target"])
    vocab = model.input_vocabulary
    pairs = cfg["pairs"]
    width = max(len(vocab.encode(s)) for s, _ in pairs) + 4
    enc = np.zeros((len(pairs), width), np.int32)
    targets = [vocab.encode(t) + [1] for _, t in pairs]
    assert len({len(t) for t in targets}) == 1  # no decoder padding: T5X masks padded target positions, HF does not
    dec_t = np.array(targets, np.int32)
    for i, (source, _) in enumerate(pairs):
        ids = vocab.encode(source) + [1]
        enc[i, : len(ids)] = ids
    dec_i = np.concatenate([np.zeros((len(pairs), 1), np.int32), dec_t[:, :-1]], axis=1)
    logits = model.module.apply({"params": params}, enc, dec_i, dec_t, enable_dropout=False)
    np.savez(cfg["out"], encoder_input_tokens=enc, decoder_input_tokens=dec_i, decoder_target_tokens=dec_t,
             logits=np.asarray(logits, np.float32))
    print(json.dumps({"shape": list(np.shape(logits)), "step": int(np.asarray(restored["state"]["step"])),
                      "dtype": str(np.asarray(logits).dtype)}))
    """  # noqa: E501 (a script run in another interpreter)
)

HF_LOGITS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch, transformers
    cfg = json.loads(sys.argv[1])
    ref = np.load(cfg["reference"])
    model, info = transformers.T5ForConditionalGeneration.from_pretrained(cfg["model"], output_loading_info=True,
                                                                         dtype=torch.float32)
    ids = torch.from_numpy(ref["encoder_input_tokens"].astype(np.int64))
    dec = torch.from_numpy(ref["decoder_input_tokens"].astype(np.int64))
    with torch.no_grad():
        logits = model.eval()(input_ids=ids, attention_mask=ids > 0, decoder_input_ids=dec).logits.float().numpy()
    tokenizer = transformers.AutoTokenizer.from_pretrained(cfg["model"])
    print(json.dumps({"diff": float(np.abs(logits - ref["logits"]).max()), "scale": float(np.abs(ref["logits"]).max()),
                      "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
                      "ids": tokenizer(cfg["text"]).input_ids}))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.mark.slow
def test_a_short_run_exports_a_model_with_t5xs_logits(
    t5x_python: str, torch_python: str, tmp_path: Path
) -> None:
    recipe = load_recipe(
        QUICKSTART,
        [
            "train.steps=4",
            "train.checkpoint_every=null",
            "train.log_every=2",
            "train.warmup_steps=1",
            "train.batch_size=8",
            "eval.every=null",
            "eval.max_examples=32",
        ],
    ).value  # T5X's inference eval once, at the end, on the first 32 held-out numbers; the test on all 500
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
    env = stack_env(
        TPUFT_RUN_ID="t5x-parts-1", TPUFT_RUN_DIR=str(run_dir), TPUFT_WORKER_ID="0", TPUFT_NUM_WORKERS="1"
    )
    proc = subprocess.run(
        [t5x_python, "-m", "tpuft.worker"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    checkpoint = run_dir / "checkpoints" / "checkpoint_4"
    assert (checkpoint / "manifest.json").is_file()
    heartbeat = json.loads((run_dir / "heartbeat" / "worker-0.json").read_text())
    assert (
        heartbeat["status"] == "finished"
        and heartbeat["step"] == 4
        and heartbeat["exported_from"] == "checkpoint_4"
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [2, 4]
    assert all(math.isfinite(row["loss"]) and row["loss"] > 0 for row in rows if "loss" in row)
    assert (run_dir / "t5x" / "run.gin").is_file() and (run_dir / "export" / "hf" / "config.json").is_file()
    test_row = [row for row in rows if "test_examples" in row]
    assert len(test_row) == 1 and test_row[0]["step"] == 4 and test_row[0]["test_checkpoint_step"] == 4, rows
    tested = predictions.merged(run_dir / "test")
    assert test_row[0]["test_examples"] == 500 and [row["id"] for row in tested] == list(range(500))
    assert sorted(path.name for path in (run_dir / "test").iterdir()) == ["predictions-00000.jsonl"]
    assert test_row[0]["test_exact_match"] == round(sum(row["correct"] for row in tested) / 500, 6)
    assert heartbeat["test_exact_match"] == test_row[0]["test_exact_match"]

    # tpuft predict's engine on the same checkpoint: T5X's own inference eval, row for row (one decoder: the
    # test's)
    evaluated = [
        json.loads(line)
        for line in (run_dir / "eval" / "predictions-00000004.jsonl").read_text().splitlines()
    ]
    source = tmp_path / "eval32.jsonl"
    source.write_text(
        "".join(json.dumps({"words": r["input"], "digits": r["target"]}) + "\n" for r in evaluated)
    )
    for beams in (1, 2):
        job = PredictJob(
            input=str(source),
            shards=str(tmp_path / f"shards-{beams}"),
            output=str(tmp_path / f"out-{beams}.jsonl"),
            backend="t5x",
            model=str(checkpoint),
            recipe=dump_recipe(recipe),
            batch_size=8,
            shard_lines=20,
            num_beams=beams,
        )
        (tmp_path / "job.json").write_text(job.to_json())
        done = subprocess.run(
            [t5x_python, "-m", "tpuft.worker.predict.main", "--job", str(tmp_path / "job.json")],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={**env, "TPUFT_RUN_DIR": str(tmp_path / "p")},
        )
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
        out = [json.loads(line) for line in Path(job.output or "").read_text().splitlines()]
        assert [row["id"] for row in out] == list(range(32)) and all("correct" in row for row in out)
        if beams == 1:
            assert [row["prediction"] for row in out] == [row["prediction"] for row in evaluated]

    pairs = [["four thousand two", "4002"], ["nine hundred one", "9170"], ["seven", "7000"]]
    reference = tmp_path / "t5x_logits.npz"
    t5x = run_script(
        t5x_python,
        T5X_LOGITS,
        {
            "gin": str(run_dir / "t5x" / "run.gin"),
            "checkpoint": str(checkpoint),
            "out": str(reference),
            "pairs": pairs,
        },
        tmp_path,
    )
    assert t5x["shape"] == [3, 5, 384] and t5x["step"] == 4 and t5x["dtype"] == "float32"
    hf = run_script(
        torch_python,
        HF_LOGITS,
        {"reference": str(reference), "model": str(run_dir / "export" / "hf"), "text": pairs[0][0]},
        tmp_path,
    )
    assert hf["missing"] == [] and hf["unexpected"] == []
    assert hf["scale"] > 1.0  # real logits, not a degenerate model
    assert hf["diff"] < 1e-4, hf
    # the exported tokenizer encodes as T5X did
    assert hf["ids"] == [b + 3 for b in pairs[0][0].encode()] + [1]


# ----------------------------------------------------------------------------------------------------------
# pure helpers (no stack needed)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], 0),
        (["backend.initial_checkpoint=gs://b/t5x/checkpoint_1000000"], 1_000_000),
        (["backend.initial_checkpoint=gs://b/t5x/checkpoint_1000000/"], 1_000_000),
        (["backend.initial_checkpoint=gs://b/t5x/ckpt", "backend.initial_step=524288"], 524288),
    ],
)
def test_initial_step(overrides: list[str], expected: int) -> None:
    assert initial_step(load_recipe(QUICKSTART, overrides).value) == expected


def test_small_helpers() -> None:
    assert task_name("t5x_quickstart-20260101-ab12") == "tpuft_t5x_quickstart_20260101_ab12"
    assert network_module("byt5", []) == network_module("t5_1_1", []) == "t5x.examples.t5.network"
    assert network_module("umt5", []) == "t5x.examples.scalable_t5.network"
    assert network_module(None, ["import seqio\nfrom my.models import network\n"]) == "my.models.network"
    assert network_module(None, ["import seqio\n"]) is None
    assert score({"eval_exact_match": 0.5, "eval_loss": 0.1}) == 0.5
    assert score({"eval_token_accuracy": 0.7}) == 0.7
    assert score({"eval_loss": 2.0}) == -2.0
    assert score({"loss": 2.0}) is None


def t5x_adapter_run(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *, resume: bool
) -> dict[str, Any]:
    """What T5X's hooks report for a 40-step run (a row, an evaluation of each kind and a checkpoint every 10
    steps; exact match 0.5, 0.8, 0.7, 0.75), fed to the trainer's adapter without T5X; resumed, from the
    latest checkpoint on."""
    import numpy as np

    from tpuft.worker.context import WorkerContext
    from tpuft.worker.t5x import testset as t5x_test
    from tpuft.worker.t5x import train as t5x_train

    exported: list[int] = []
    tested: list[tuple[str, int]] = []

    def fake_test(loop: Any, recipe: Any, gin_file: Path, checkpoint: str) -> dict[str, Any]:
        step = int(checkpoint.rsplit("_", 1)[-1]) - t5x_train.initial_step(recipe)
        tested.append((checkpoint.replace(str(run_dir), "RUN"), step))
        return {"examples": 3, "exact_match": 0.5}

    monkeypatch.setattr(t5x_test, "test_checkpoint", fake_test)
    monkeypatch.setattr(t5x_test, "agree", list)  # one host: its own values
    monkeypatch.setattr(t5x_train, "remove_checkpoint", shutil.rmtree)
    monkeypatch.setattr(
        t5x_train,
        "export_checkpoint",
        lambda ctx, model_dir, step, dtype: exported.append(step) or run_dir / "export" / "hf",
    )
    monkeypatch.setattr(t5x_train.T5xRun, "_process_count", staticmethod(lambda: 1))
    if resume:
        monkeypatch.setenv("TPUFT_RESUME", "1")
    else:
        monkeypatch.delenv("TPUFT_RESUME", raising=False)
    recipe = load_recipe(
        QUICKSTART,
        [
            "train.steps=40",
            "train.keep_checkpoints=1",
            "train.warmup_steps=5",
            "eval.every=10",
            "train.checkpoint_every=10",
        ],
    ).value
    ctx = WorkerContext(
        run_id="adapter-1",
        run_dir=run_dir,
        worker_id=0,
        num_workers=1,
        coordinator="127.0.0.1:1",
        run_url=str(run_dir),
    )
    run = t5x_train.T5xRun(ctx, recipe)
    run._resume()
    batch = {
        "decoder_target_tokens": np.array([[5, 6, 0], [7, 0, 0]]),  # 3 + 4 real tokens, 2 examples a row
        "encoder_input_tokens": np.array([[1, 2, 3], [4, 0, 0]]),
    }
    exact = {10: 0.5, 20: 0.8, 30: 0.7, 40: 0.75}
    start = run.step
    for taken in range(start, 40):
        run.on_batch(taken, taken == start, batch)
        step = taken + 1
        if step % 10:
            continue
        run.on_train_scalars(
            step,
            {
                "loss": 2.0 / step,
                "loss_per_nonpadding_target_token": 1.0 / step,
                "learning_rate": 0.001,
                "timing/seqs_per_second": 100.0,
                "accuracy": step / 100,
            },
        )
        run.on_eval_scalars(step, {"loss_per_nonpadding_target_token": 0.9 / step, "accuracy": 0.99})
        run.on_inference_eval(
            step, {"exact_match": exact[step]}, [{"input": "a", "prediction": "1", "target": "1"}]
        )
        checkpoint = run_dir / "checkpoints" / f"checkpoint_{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "state").write_text("x" * step)
        run.on_checkpoint_saved(step)
    run.finish()
    assert run.loop.metrics is not None
    run.loop.metrics.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "rows": [{k: v for k, v in row.items() if k not in ("time", "elapsed_s")} for row in rows],
        "lines": capsys.readouterr().out.replace(str(run_dir), "RUN").splitlines(),
        "exported": exported,
        "tested": tested,
        "kept": sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir()),
        "beat": json.loads((run_dir / "heartbeat" / "worker-0.json").read_text()),
    }


def test_the_t5x_adapter_reports_through_the_run_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """T5X's reports become the run's rows, lines and heartbeats; the best inference evaluation's checkpoint
    is kept besides the last and exported, and still is after a resume (the teacher-forced rows' token
    accuracy, higher than any exact match, does not rank: the rows are judged as they were during the run)."""
    first = t5x_adapter_run(tmp_path, monkeypatch, capsys, resume=False)
    expected_rows = []
    for step in (10, 20, 30, 40):
        expected_rows += [
            {
                "step": step,
                "loss": round(1.0 / step, 6),
                "lr": 0.001,
                "examples_per_s": 100.0,
                "tokens_per_s": 350.0,
                "token_accuracy": step / 100,
            },  # T5X's rows per second, times this host's examples and real tokens a row
            {"step": step, "eval_loss": round(0.9 / step, 6), "eval_token_accuracy": 0.99},
            {
                "step": step,
                "eval_exact_match": {10: 0.5, 20: 0.8, 30: 0.7, 40: 0.75}[step],
                "eval_examples": 1,
                "checkpoint": f"checkpoint_{step}",
            },
        ]
    test_row = {
        "step": 40,
        "test_examples": 3,
        "test_exact_match": 0.5,
        "test_seconds": 0.0,  # the fake test takes no time (the sequencer times it)
        "test_checkpoint_step": 40,
    }
    # the last checkpoint (no keep_best) tested once, at the end, before the export
    expected_rows.append(test_row)
    assert first["rows"] == expected_rows
    assert first["tested"] == [("RUN/checkpoints/checkpoint_40", 40)]
    split = (
        "[tpuft] batch split: this host feeds 2 of each batch's 32 rows"  # the log line every host now writes
    )
    assert first["lines"].count(split) == 1
    first["lines"].remove(split)
    assert first["lines"][:3] == [
        "[tpuft] step 10/40 loss 0.1000 lr 1.00e-03 100.0 ex/s 350 tok/s",
        "[tpuft] eval @ 10: exact_match 0.5000 (1 examples)",
        "[tpuft] checkpoint saved: RUN/checkpoints/checkpoint_10",
    ]
    assert first["lines"][-2:] == [
        "[tpuft] test (checkpoint step 40): exact match 0.5000 (3 examples)",
        "[tpuft] Hugging Face export of checkpoint_20: RUN/export/hf",
    ]
    assert first["kept"] == [20, 40] and first["exported"] == [20]
    beat = first["beat"]
    assert beat["status"] == "finished" and beat["step"] == 40 and beat["phase"] == "step"
    assert beat["exported_from"] == "checkpoint_20" and beat["loss"] == 0.025 and "train_seconds" in beat
    assert (tmp_path / "eval" / "predictions-00000040.jsonl").is_file()

    # as if the run had died after its checkpoint at 20
    shutil.rmtree(tmp_path / "checkpoints" / "checkpoint_40")
    resumed = t5x_adapter_run(tmp_path, monkeypatch, capsys, resume=True)
    assert [line for line in resumed["lines"] if line != split][
        0
    ] == "[tpuft] resuming from checkpoint_20 (step 20 of 40)"
    assert resumed["rows"] == expected_rows  # the rows after the checkpoint forgotten, then logged anew
    assert resumed["kept"] == [20, 40] and resumed["exported"] == [20]
    # the test row had gone with step 40's rows
    assert resumed["tested"] == [("RUN/checkpoints/checkpoint_40", 40)]

    again = t5x_adapter_run(tmp_path, monkeypatch, capsys, resume=True)  # resumed from the final checkpoint
    assert again["tested"] == [] and again["rows"] == expected_rows  # tested already: exactly one test row
    assert {k: again["beat"][k] for k in ("test_exact_match", "test_checkpoint_step")} == {
        "test_exact_match": 0.5,
        "test_checkpoint_step": 40,
    }
