"""convert: a training checkpoint -> a Hugging Face model directory (config, safetensors, tokenizer)."""

from __future__ import annotations

from pathlib import Path

from tpuft import rundir
from tpuft.config import ClusterConfig
from tpuft.convert.torch_ckpt import CheckpointError, ExportResult, export_checkpoint, find_checkpoint
from tpuft.errors import UsageError
from tpuft.monitor import resolve_run


def convert(
    checkpoint: Path | None,
    out_dir: Path | None,
    *,
    run_id: str | None = None,
    config: ClusterConfig | None = None,
    step: int | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
) -> ExportResult:
    if run_id is not None:
        if config is None:
            raise UsageError("--run needs a cluster file to find the run's storage")
        found = resolve_run(config, run_id)
        if str(found).startswith("gs://"):
            raise UsageError(
                f"{found}: converting straight from a bucket is not supported yet",
                hint=f"Copy the checkpoint home first (gsutil -m cp -r {found}/checkpoints .), then: tpuft convert checkpoints OUT_DIR",
            )
        run_dir = Path(found)
        source = run_dir
        if out_dir is None:
            out_dir = run_dir / rundir.EXPORT_HF
            overwrite = True
    elif checkpoint is None or out_dir is None:
        raise UsageError("give CHECKPOINT and OUT_DIR, or --run RUN_ID [OUT_DIR]")
    else:
        source = checkpoint
    try:
        ckpt = find_checkpoint(source, step)
        return export_checkpoint(ckpt, out_dir, dtype=dtype, overwrite=overwrite)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
