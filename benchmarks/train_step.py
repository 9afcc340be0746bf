"""Training speed of the PyTorch/XLA backend against Hugging Face's own ``Seq2SeqTrainer``, side by side in
one run.

The same task and model for both: the quickstart (English number words -> digits, the byte vocabulary), its
tiny T5 (d_model 128, 4 heads of 32, gated-GELU MLP 256, 2+2 layers), inputs padded to 48 and targets to 8
tokens, global batch 32, AdamW at 1e-3 with 10 warm-up steps and linear decay, gradient clipping at 1.0,
float32 (or ``--precision bf16``: our XLA autocast against the Trainer's ``bf16=True``), no evaluation, no
checkpoints.

* ``tpuft 1 worker``: ``tpuft train quickstart`` on a 1-worker local pod (one PJRT CPU process).
* ``tpuft 2 workers``: the same on the 2-worker pod (data-parallel over gloo; each worker pinned to its own
  core).
* ``Seq2SeqTrainer``: transformers' trainer in one process of the same venv (eager PyTorch on the CPU, every
  core).

Examples/s is the steady state: tpuft's logged windows after the first, the Trainer's steps after the first
10. "first step" is from the process's start-up (model, data) to the end of the first optimizer step,
    compilation
included. Run: ``python benchmarks/train_step.py --steps 300``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from backends import Pod, timing_settings  # noqa: E402 - the benchmarks' shared local-pod helpers

HF_TRAINER = textwrap.dedent(
    """
    import json, sys, time
    started = time.time()
    import torch
    from transformers import (ByT5Tokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments, T5Config,
                              T5ForConditionalGeneration, TrainerCallback)
    cfg = json.loads(sys.argv[1])
    torch.manual_seed(0)
    tok = ByT5Tokenizer()
    rows = [json.loads(line) for line in open(cfg["data"])]
    enc = tok([r["words"] for r in rows], max_length=48, padding="max_length", truncation=True)
    dec = tok([r["digits"] for r in rows], max_length=8, padding="max_length", truncation=True)
    data = []
    for ids, mask, labels, lmask in zip(enc["input_ids"], enc["attention_mask"], dec["input_ids"], dec["attention_mask"]):
        data.append({"input_ids": ids, "attention_mask": mask,
                     "labels": [t if m else -100 for t, m in zip(labels, lmask)]})
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=len(tok), d_model=128, d_kv=32, num_heads=4, d_ff=256, num_layers=2, num_decoder_layers=2,
        feed_forward_proj="gated-gelu", dropout_rate=0.0, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id))
    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.time())

    args = Seq2SeqTrainingArguments(
        output_dir=cfg["out"], per_device_train_batch_size=32, max_steps=cfg["steps"], learning_rate=1e-3,
        warmup_steps=10, lr_scheduler_type="linear", max_grad_norm=1.0, weight_decay=0.0, optim="adamw_torch",
        logging_steps=10**9, save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, bf16=cfg["precision"] == "bf16", seed=0, disable_tqdm=True)
    Seq2SeqTrainer(model=model, args=args, train_dataset=data, callbacks=[Clock()]).train()
    steady = times[10:]
    speed = 32 * (len(steady) - 1) / (steady[-1] - steady[0])
    print(json.dumps({"examples_per_s": speed, "first_step_s": times[0] - started}))
    """  # noqa: E501 (a script run in another interpreter)
)


def tpuft_run(workers: int, steps: int, precision: str) -> dict[str, float]:
    settings = timing_settings(
        steps, log_every=25, more={"train.precision": precision, "model.config.dropout_rate": 0.0}
    )
    with tempfile.TemporaryDirectory() as tmp:
        pod = Pod(Path(tmp))
        pod.cluster.write_text(pod.cluster.read_text().replace("workers: 2", f"workers: {workers}"))
        pod.tpuft("create")
        pod.tpuft("setup", "quickstart")
        done = pod.tpuft("train", "quickstart", "--json", "--stop-on-interrupt", *settings)
        if done.returncode != 0:
            raise SystemExit(f"tpuft train: {done.stderr[-3000:]}")
        run = Path(json.loads(done.stdout)["run_dir"])
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        speeds = [row["examples_per_s"] for row in rows if "examples_per_s" in row][1:]
        first = next(row["first_step_s"] for row in rows if "first_step_s" in row)
        return {"examples_per_s": statistics.mean(speeds), "first_step_s": first}


def hf_run(steps: int, precision: str) -> dict[str, float]:
    from tpuft.backends.torch_xla import BACKEND, TorchXlaBackend
    from tpuft.config import LocalConfig
    from tpuft.core.paths import venv_cache
    from tpuft.host.bootstrap import ensure_venv

    spec = BACKEND.env_spec(TorchXlaBackend(), "cpu", LocalConfig().python)
    python = ensure_venv(venv_cache(), spec.payload()) / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "data": str(REPO / "tpuft" / "recipes" / "data" / "numbers" / "train.jsonl"),
            "out": tmp,
            "steps": steps,
            "precision": precision,
        }
        done = subprocess.run(
            [str(python), "-c", HF_TRAINER, json.dumps(cfg)], capture_output=True, text=True, timeout=3600
        )
        if done.returncode != 0:
            raise SystemExit(f"Seq2SeqTrainer: {done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--precision", choices=("float32", "bf16"), default="float32")
    args = parser.parse_args()
    started = time.monotonic()
    results = {
        "Seq2SeqTrainer (1 process)": hf_run(args.steps, args.precision),
        "tpuft torch_xla, 1 worker": tpuft_run(1, args.steps, args.precision),
        "tpuft torch_xla, 2 workers": tpuft_run(2, args.steps, args.precision),
    }
    base = results["Seq2SeqTrainer (1 process)"]["examples_per_s"]
    print(f"\n{args.steps} steps, batch 32, {args.precision}, {time.monotonic() - started:.0f} s in all\n")
    print(f"| {'run':<28} | examples/s | vs Seq2SeqTrainer | first step s |")
    print(f"|{'-' * 30}|------------|-------------------|--------------|")
    for name, row in results.items():
        print(
            f"| {name:<28} | {row['examples_per_s']:>10.1f} | {row['examples_per_s'] / base:>16.2f}x | "
            f"{row['first_step_s']:>12.1f} |"
        )


if __name__ == "__main__":
    main()
