"""The T5X backend's prediction engine for ``tpuft predict``: a T5X run's ``checkpoint_N`` (local or gs://)
decoded with T5X's own decoding on the mesh, by :class:`tpuft.worker.t5x.decode.T5xDecoder`, the decoder of
the test evaluation that ends a run: greedy (one beam, as T5X's inference eval decodes) or ``job.num_beams``
beam search, at most ``job.max_new_tokens`` tokens (the recipe's ``data.max_target_length`` by default).

The model is the one the run trained: its gin is generated again from the job's recipe (the run's resolved
recipe), as the trainer generates it, and parsed as ``t5x.train`` would; the mesh is the recipe's
(``backend.num_partitions``, the local pod's CPU devices cut as the trainer cuts them). One JAX process per
host, all of them in one multi-controller job as in a training: process ``p`` of ``P`` takes its part of every
shard of the input (:mod:`tpuft.worker.predict.loop`), and every call of the decoder is a step of all of them
together.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tpuft.core.errors import UsageError
from tpuft.run.predict_job import PredictJob
from tpuft.worker.context import WorkerContext
from tpuft.worker.predict.loop import serve


def decoder_for(recipe: Any, job: PredictJob, run_id: str) -> Any:
    """The job's engine: the run gin written to a temporary folder and parsed, the checkpoint restored, the
    decode step compiled for ``job.batch_size`` inputs per process."""
    import os

    from tpuft.worker.t5x.decode import T5xDecoder, model_and_partitioner, parse_run_gin
    from tpuft.worker.t5x.gin import initial_step, run_gin, task_spec
    from tpuft.worker.t5x.hooks import install_hooks

    if recipe.backend.task != "finetune":
        raise UsageError(
            f"{job.model}: a {recipe.backend.task} run's model does not predict (it trains a text-to-text "
            "model for a fine-tuning to start from)"
        )
    if not job.model.startswith("gs://") and not Path(job.model).expanduser().is_dir():
        raise UsageError(f"{job.model}: no such T5X checkpoint folder")
    install_hooks()  # the local pod's mesh, cut as the trainer's (T5X's own CPU mesh ignores num_partitions)
    with tempfile.TemporaryDirectory(prefix="tpuft-t5x-predict-") as folder:
        gin_file = Path(folder) / "run.gin"
        gin_file.write_text(
            run_gin(
                recipe,
                task_spec(run_id, recipe),
                model_dir=f"{folder}/checkpoints",
                initial_step=initial_step(recipe),
                cpu=os.environ.get("JAX_PLATFORMS") == "cpu",
            )
        )
        parse_run_gin(gin_file)
    model, partitioner = model_and_partitioner()
    return T5xDecoder(
        model,
        partitioner,
        job.model.rstrip("/"),
        batch_size=job.batch_size,
        inputs_length=recipe.data.max_source_length,
        decode_length=job.max_new_tokens or recipe.data.max_target_length,
        num_beams=job.num_beams,
        truncation=recipe.data.truncation,
    )


def main(ctx: WorkerContext, recipe: Any, job: PredictJob) -> int:
    import jax

    from tpuft.worker.t5x.hooks import exit_on_sigterm
    from tpuft.worker.t5x.train import start_jax

    exit_on_sigterm()
    start_jax(ctx, recipe)
    engine = decoder_for(recipe, job, ctx.run_id)
    return serve(
        job,
        engine,
        process=jax.process_index(),
        processes=jax.process_count(),
        recipe=recipe,
        run_dir=ctx.run_dir if ctx.run_url else None,
        worker=ctx.worker_id,
    )
