"""The Hugging Face export at the end of a run, one code for the engines whose checkpoints tpuft's
converters read (Keras, T5X): the checkpoint the sequencer picked becomes ``run_dir/export/hf``."""

from __future__ import annotations

from pathlib import Path

from tpuft.run import rundir
from tpuft.worker.context import WorkerContext


def export_hf(ctx: WorkerContext, checkpoint: Path, dtype: str) -> Path:
    """``checkpoint`` (a complete local folder) to ``run_dir/export/hf`` in ``dtype``; the folder written."""
    from tpuft.convert.hf_writer import write_hf_model
    from tpuft.convert.sources import open_source

    out = ctx.run_dir / rundir.EXPORT_HF
    write_hf_model(open_source(checkpoint), out, dtype=dtype, overwrite=True)
    return out
