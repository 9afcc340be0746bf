"""The prediction engine for a Hugging Face model folder (any backend's export, or any seq2seq or classifier
model saved with ``save_pretrained``), with transformers and torch: ``tpuft predict --local``, and the engine
a backend can fall back on for its export.

Text to text: ``model.generate`` (greedy, or beam search with ``num_beams``), at most ``max_new_tokens`` new
tokens (default: the recipe's ``data.max_target_length``), the KV cache on. Each batch is padded to its
longest input only: the loop sorts a part by length, so batches are of like lengths and padding costs little.
Inputs are truncated to ``data.max_source_length`` tokens as ``data.truncation`` says, exactly as training saw
them.

A classifier (a ``*ForSequenceClassification`` folder): the argmax of the logits, named by the recipe's
``data.labels`` (else the model's ``id2label``).

The device: ``settings["device"]`` (default ``cpu``); ``settings["threads"]`` caps torch's intra-op threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.data import encode_texts, load_tokenizer
from tpuft.run.predict_job import PredictJob
from tpuft.worker.context import WorkerContext
from tpuft.worker.predict.loop import model_folder, serve


class HfEngine:
    def __init__(self, folder: Path, recipe: Any, job: PredictJob) -> None:
        import torch
        from transformers import AutoConfig

        self.torch = torch
        if job.settings.get("threads"):
            torch.set_num_threads(int(job.settings["threads"]))
        self.device = torch.device(job.settings.get("device", "cpu"))
        self.tokenizer = _tokenizer(folder, recipe)
        config = AutoConfig.from_pretrained(folder)
        self.classify = not config.is_encoder_decoder and any(
            name.endswith("ForSequenceClassification") for name in (config.architectures or [])
        )
        if self.classify:
            from transformers import AutoModelForSequenceClassification as auto
        else:
            from transformers import AutoModelForSeq2SeqLM as auto
        self.model = auto.from_pretrained(folder).to(self.device).eval()
        labels = list(recipe.data.labels)
        self.labels = labels or [config.id2label[i] for i in range(len(config.id2label))]
        self.max_source = recipe.data.max_source_length
        self.truncation = recipe.data.truncation
        self.generate = {
            "max_new_tokens": job.max_new_tokens or recipe.data.max_target_length,
            "num_beams": job.num_beams,
            "do_sample": False,
            "use_cache": True,
        }

    def encode(self, sources: list[str]) -> dict[str, Any]:
        """Token ids and mask padded to the batch's longest input (truncated as training truncated)."""
        torch = self.torch
        if self.truncation == "head":
            enc = self.tokenizer(
                sources, max_length=self.max_source, truncation=True, padding="longest", return_tensors="pt"
            )
            return {key: enc[key].to(self.device) for key in ("input_ids", "attention_mask")}
        ids, masks = encode_texts(self.tokenizer, sources, self.max_source, self.truncation)
        width = max(sum(mask) for mask in masks)
        return {
            "input_ids": torch.tensor([row[:width] for row in ids], device=self.device),
            "attention_mask": torch.tensor([row[:width] for row in masks], device=self.device),
        }

    def predict(self, sources: list[str]) -> list[str]:
        if not sources:
            return []
        inputs = self.encode(sources)
        with self.torch.inference_mode():
            if self.classify:
                picked = self.model(**inputs).logits.argmax(-1).tolist()
                return [self.labels[i] for i in picked]
            out = self.model.generate(**inputs, **self.generate)
        return self.tokenizer.batch_decode(out, skip_special_tokens=True)

    def close(self) -> None:
        self.model = None


def _tokenizer(folder: Path, recipe: Any) -> Any:
    """The folder's own tokenizer when it has one (an export saves it), else the recipe's
    ``model.tokenizer``."""
    has_files = any(
        (folder / name).is_file()
        for name in ("tokenizer_config.json", "tokenizer.json", "spiece.model", "vocab.txt")
    )
    if has_files:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    return load_tokenizer(recipe.model.tokenizer)


def main(ctx: WorkerContext, recipe: Any, job: PredictJob) -> int:
    engine = HfEngine(model_folder(job.model), recipe, job)
    run_dir = ctx.run_dir if ctx.run_url else None  # a supervised worker beats; --local has no supervisor
    return serve(
        job, engine, process=ctx.worker_id, processes=ctx.num_workers, recipe=recipe, run_dir=run_dir
    )
