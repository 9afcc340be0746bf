"""The PyTorch/XLA backend's prediction engine: the run's checkpoint folder (the HF weights and tokenizer the
trainer saves, ``prompt.safetensors`` beside them when prompt tuning) on the XLA device (a TPU chip, or PJRT
CPU on the local pod).

Greedy decoding runs on the device with static shapes (:func:`tpuft.worker.torch_xla.parts.greedy_decode`, the
trainer's own eval decoder): every batch is padded to ``job.batch_size`` rows of ``data.max_source_length``
tokens, so one graph is compiled per step shape and reused for the whole input. Beam search (``--num-beams`` >
1) goes through ``generate``: on a TPU on the device (it recompiles as its sequences grow: slower than
   greedy); on the CPU pod on a
host copy of the model, in eager torch (PJRT CPU would recompile every step for no gain: minutes for a few
inputs).

Processes: one per worker on the CPU pod; on a TPU host one per chip, spawned by ``torch_xla.launch`` as the
trainer spawns its replicas, each taking the part of process ``xr.global_ordinal()`` of ``xr.world_size()``.
The parts are independent (no collective), so a process never waits on another until the chief joins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tpuft.data import encode_texts, load_tokenizer
from tpuft.run.predict_job import PredictJob
from tpuft.worker.context import WorkerContext
from tpuft.worker.predict.loop import model_folder, serve
from tpuft.worker.torch_xla.state import PROMPT_FILE


class XlaEngine:
    def __init__(self, folder: Path, recipe: Any, job: PredictJob, *, tpu: bool) -> None:
        import torch
        import torch_xla
        import transformers
        from transformers import AutoTokenizer, T5ForConditionalGeneration

        transformers.utils.logging.disable_progress_bar()
        self.torch, self.torch_xla = torch, torch_xla
        self.device = torch_xla.device()
        has_tokenizer = (folder / "tokenizer_config.json").is_file()
        self.tokenizer = (
            AutoTokenizer.from_pretrained(folder) if has_tokenizer else load_tokenizer(recipe.model.tokenizer)
        )
        self.model = T5ForConditionalGeneration.from_pretrained(folder).to(self.device).eval()
        self.prompt = None
        if (folder / PROMPT_FILE).is_file():
            from safetensors.torch import load_file

            self.prompt = load_file(str(folder / PROMPT_FILE))["prompt"].to(self.device)
        self.batch_size = job.batch_size
        self.max_source = recipe.data.max_source_length
        self.truncation = recipe.data.truncation
        self.length = job.max_new_tokens or recipe.data.max_target_length
        self.num_beams = job.num_beams
        self.beam_device = self.device if tpu else torch.device("cpu")
        beams_on_host = not tpu and job.num_beams > 1
        self.beam_model = (
            T5ForConditionalGeneration.from_pretrained(folder).eval() if beams_on_host else self.model
        )

    def predict(self, sources: list[str]) -> list[str]:
        if not sources:
            return []
        from tpuft.worker.torch_xla import parts as torch_parts

        torch = self.torch
        padded = sources + [""] * (self.batch_size - len(sources))  # one static batch shape
        ids, masks = encode_texts(self.tokenizer, padded, self.max_source, self.truncation)
        input_ids = torch.tensor(ids, device=self.device)
        mask = torch.tensor(masks, device=self.device)
        with torch.no_grad():  # not inference_mode: XLA's in-place index_copy needs version counters
            if self.num_beams > 1:
                prompt = None if self.prompt is None else self.prompt.to(self.beam_device)
                inputs = torch_parts.encoder_inputs(
                    self.beam_model, prompt, input_ids.to(self.beam_device), mask.to(self.beam_device)
                )
                out = self.beam_model.generate(
                    **inputs, max_new_tokens=self.length, num_beams=self.num_beams, do_sample=False
                )
            else:
                out = torch_parts.greedy_decode(
                    self.model, self.prompt, input_ids, mask, self.length, self.torch_xla.sync
                )
        eos = self.tokenizer.eos_token_id
        texts = []
        for row in out[: len(sources)].to("cpu").tolist():
            row = row[: row.index(eos)] if eos in row else row
            texts.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return texts

    def close(self) -> None:
        self.model = None


def _model_folder(job: PredictJob) -> Path:
    folder = model_folder(job.model)
    if not (folder / "config.json").is_file():
        from tpuft.core.errors import UsageError

        raise UsageError(f"{job.model}: not a PyTorch/XLA checkpoint (no config.json)")
    return folder


def main(ctx: WorkerContext, recipe: Any, job: PredictJob) -> int:
    tpu = os.environ.get("PJRT_DEVICE", "CPU").upper() == "TPU"
    if tpu:
        import torch_xla

        torch_xla.launch(_tpu_process, args=(ctx, recipe, job))
        return 0
    return _predict(ctx, recipe, job, ctx.worker_id, ctx.num_workers, tpu=False)


def _tpu_process(local_index: int, ctx: WorkerContext, recipe: Any, job: PredictJob) -> None:
    import torch_xla.runtime as xr

    _predict(ctx, recipe, job, xr.global_ordinal(), xr.world_size(), tpu=True, beats=local_index == 0)


def _predict(
    ctx: WorkerContext,
    recipe: Any,
    job: PredictJob,
    process: int,
    processes: int,
    *,
    tpu: bool,
    beats: bool = True,
) -> int:
    """``beats``: this process writes the worker's heartbeat (one per host: the supervisor watches its
    worker)."""
    engine = XlaEngine(_model_folder(job), recipe, job, tpu=tpu)
    run_dir = ctx.run_dir if ctx.run_url and beats else None
    return serve(
        job,
        engine,
        process=process,
        processes=processes,
        recipe=recipe,
        run_dir=run_dir,
        worker=ctx.worker_id,
    )
