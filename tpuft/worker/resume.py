"""Where a resumed run starts (``TPUFT_RESUME=1``, set by the controller when it restarts a run): the run's latest
complete checkpoint, listed where the run dir really is and fetched to this worker. Shared by the trainers whose
checkpoints are folders with a manifest (PyTorch/XLA and Keras); T5X restores from its MODEL_DIR itself."""

from __future__ import annotations

import os
from pathlib import Path

from tpuft.backends.base import RunLayout
from tpuft.worker.context import WorkerContext

RESUME_ENV = "TPUFT_RESUME"
"""Set to 1 by the controller when it restarts a run: go on from the latest complete checkpoint."""


def resuming() -> bool:
    return os.environ.get(RESUME_ENV, "") not in ("", "0")


def find_resume_checkpoint(ctx: WorkerContext, layout: RunLayout) -> tuple[int, str] | None:
    """(step, folder name) of the run's latest complete checkpoint, where the run dir really is (the bucket for a
    ``gs://`` run: the local staging folder may be stale, or empty on a new host); None when there is none."""
    if ctx.remote:
        from tpuft.storage import open_storage

        steps = layout.checkpoint_steps(open_storage(ctx.run_url))
    else:
        steps = {step: path.name for step, path in layout.local_checkpoints(ctx.run_dir / layout.checkpoints)}
    if not steps:
        return None
    latest = max(steps)
    return latest, steps[latest]


def fetch_checkpoint(ctx: WorkerContext, layout: RunLayout, name: str) -> Path:
    """The checkpoint ``name`` as a local folder: in place for a local run dir, else downloaded from the bucket into
    the staging folder (files already there intact are kept). Processes that share the staging folder (one per chip
    on a TPU host) download one at a time under a file lock; the later ones find the files in place."""
    local = ctx.run_dir / layout.checkpoints / name
    if ctx.remote:
        import fcntl

        from tpuft.storage import open_storage

        local.parent.mkdir(parents=True, exist_ok=True)
        with open(local.parent / f".{name}.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            open_storage(ctx.run_url).download_tree(f"{layout.checkpoints}/{name}", local)
    if not layout.is_complete(local):
        raise RuntimeError(f"{local}: the checkpoint is incomplete (a file in its {layout.manifest} is missing or short)")
    return local
