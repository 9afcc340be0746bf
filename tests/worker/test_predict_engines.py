"""The real prediction engines against tiny random models, in the PyTorch/XLA backend's venv (torch,
transformers): ``python -m tpuft.worker.predict.main --local`` (the hf engine: length-sorted batches padded to
their longest input) must give, row for row, what an unbatched ``generate`` of each input gives; a classifier
folder predicts the label names of its argmax; the torch_xla engine's static-shape greedy decoder agrees with
the hf engine on the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuft.run.predict_job import PredictJob

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

MAKE_MODELS = r"""
import json, sys, torch
from pathlib import Path
from transformers import BertConfig, BertForSequenceClassification, ByT5Tokenizer, T5Config, T5ForConditionalGeneration
out = Path(sys.argv[1])
torch.manual_seed(0)
tok = ByT5Tokenizer()
t5 = T5ForConditionalGeneration(T5Config(vocab_size=259, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                                         num_decoder_layers=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                         tie_word_embeddings=False))
bert = BertForSequenceClassification(BertConfig(vocab_size=259, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=4, intermediate_size=64, num_labels=2))
with torch.no_grad():  # weights far from init's: decisive, varied decodes (an init T5 says little but padding)
    for p in [*t5.parameters(), *bert.parameters()]:
        p.normal_(0, 0.5)
t5.save_pretrained(out / "t5"); tok.save_pretrained(out / "t5")
bert.save_pretrained(out / "bert"); tok.save_pretrained(out / "bert")
t5 = T5ForConditionalGeneration.from_pretrained(out / "t5").eval()  # the truth of the weights on disk
bert = BertForSequenceClassification.from_pretrained(out / "bert").eval()
sources = [json.loads(line)["words"] for line in open(sys.argv[2])]
with torch.inference_mode():
    one_by_one = [tok.decode(t5.generate(**tok([s], return_tensors="pt"), max_new_tokens=6)[0],
                             skip_special_tokens=True) for s in sources]
    texts = [json.loads(line)["text"] for line in open(sys.argv[3])]
    picked = [int(bert(**tok([t], return_tensors="pt")).logits.argmax(-1)) for t in texts]
print(json.dumps({"t5": one_by_one, "bert": picked}))
"""  # noqa: E501 (a script run in another interpreter)


def _job(tmp_path: Path, name: str, source: Path, model: Path, recipe: str, **extra: object) -> Path:
    job = PredictJob(
        input=str(source),
        shards=str(tmp_path / f"{name}-shards"),
        output=str(tmp_path / f"{name}.jsonl"),
        backend="torch_xla",
        model=str(model),
        recipe=recipe,
        batch_size=4,
        shard_lines=6,
        max_new_tokens=6,
        **extra,
    )  # type: ignore[arg-type]
    path = tmp_path / f"{name}.job.json"
    path.write_text(job.to_json())
    return path


def _predict(torch_python: str, job: Path, tmp_path: Path, *, local: bool) -> list[dict]:
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TOKENIZERS_PARALLELISM": "false",
        "TPUFT_RUN_ID": "p",
        "TPUFT_RUN_DIR": str(tmp_path / "run"),
        "TPUFT_WORKER_ID": "0",
        "TPUFT_NUM_WORKERS": "1",
    }
    argv = [torch_python, "-m", "tpuft.worker.predict.main", "--job", str(job)] + (
        ["--local"] if local else []
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[tpuft] predict result " in done.stdout
    output = json.loads(job.read_text())["output"]
    return [json.loads(line) for line in Path(output).read_text().splitlines()]


def test_engines_predict_what_unbatched_generate_and_argmax_give(torch_python: str, tmp_path: Path) -> None:
    numbers = tmp_path / "numbers.jsonl"
    lines = (ROOT / "tpuft" / "recipes" / "data" / "numbers" / "eval.jsonl").read_text().splitlines()[:13]
    numbers.write_text("\n".join(lines) + "\n")
    reviews = tmp_path / "reviews.jsonl"
    texts = ["a fine film", "dull", "long and slow, but the end!"]
    reviews.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    made = subprocess.run(
        [torch_python, "-c", MAKE_MODELS, str(tmp_path), str(numbers), str(reviews)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    truth = json.loads(made.stdout.strip().splitlines()[-1])

    quickstart = (ROOT / "tpuft" / "recipes" / "quickstart.yaml").read_text()
    rows = _predict(
        torch_python, _job(tmp_path, "hf", numbers, tmp_path / "t5", quickstart), tmp_path, local=True
    )
    assert [row["prediction"] for row in rows] == truth["t5"]
    # the decodes differ: a test that padding or order mixed up rows can fail
    assert len(set(truth["t5"])) > 3
    assert [row["id"] for row in rows] == list(range(13)) and all("target" in row for row in rows)

    # The command a user types: --local over 2 engine processes, each its share of every shard, joined in
    # order.
    out = tmp_path / "cli.jsonl"
    env = {
        **os.environ,
        "TPUFT_VENV_CACHE": str(Path(torch_python).parents[2]),
        "TPUFT_HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuft",
            "predict",
            str(tmp_path / "t5"),
            "-i",
            str(numbers),
            "-o",
            str(out),
            "--recipe",
            str(ROOT / "tpuft" / "recipes" / "quickstart.yaml"),
            "--local",
            "--processes",
            "2",
            "--batch-size",
            "4",
            "--shard-lines",
            "6",
            "--max-new-tokens",
            "6",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [json.loads(line)["prediction"] for line in out.read_text().splitlines()] == truth["t5"]
    assert json.loads(done.stdout)["rows"] == 13 and "[p1] [tpuft] predict shard 1" in done.stderr

    xla = _predict(
        torch_python, _job(tmp_path, "xla", numbers, tmp_path / "t5", quickstart), tmp_path, local=False
    )
    assert [row["prediction"] for row in xla] == truth["t5"]  # the static-shape greedy decoder, on PJRT CPU
    assert json.loads((tmp_path / "run" / "heartbeat" / "worker-0.json").read_text())["step"] == 13

    classifier = (ROOT / "tpuft" / "recipes" / "keras_classification_quickstart.yaml").read_text()
    labels = _predict(
        torch_python, _job(tmp_path, "cls", reviews, tmp_path / "bert", classifier), tmp_path, local=True
    )
    assert [row["prediction"] for row in labels] == [["negative", "positive"][i] for i in truth["bert"]]
    assert "target" not in labels[0]
