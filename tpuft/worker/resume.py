"""Where a resumed run starts (``TPUFT_RESUME=1``, set by the controller when it restarts a run): the run's
latest complete checkpoint, listed where the run dir really is and fetched to this worker. Shared by the
trainers whose checkpoints are folders with a manifest (PyTorch/XLA and Keras); T5X restores from its
MODEL_DIR itself."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.backends.spec import RunLayout
from tpuft.worker.context import WorkerContext
from tpuft.worker.metrics import MetricsWriter, fetch_missing_metrics

RESUME_ENV = "TPUFT_RESUME"
"""Set to 1 by the controller when it restarts a run: go on from the latest complete checkpoint."""
TRAINER_STATE = "trainer_state.json"
"""In every checkpoint: the step, the elapsed training time and what else the trainer needs to go on."""


@dataclass
class ResumePoint:
    step: int = 0
    checkpoint: Path | None = None
    """The checkpoint this run resumes from (a local folder), None when it starts from step 0."""
    state: dict[str, Any] = field(default_factory=dict)
    """Its ``trainer_state.json``."""


def resuming() -> bool:
    return os.environ.get(RESUME_ENV, "") not in ("", "0")


def find_resume_checkpoint(ctx: WorkerContext, layout: RunLayout) -> tuple[int, str] | None:
    """(step, folder name) of the run's latest complete checkpoint, where the run dir really is (the bucket
    for a ``gs://`` run: the local staging folder may be stale, or empty on a new host); None when there is
    none."""
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
    """The checkpoint ``name`` as a local folder: in place for a local run dir, else downloaded from the
    bucket into the staging folder (files already there intact are kept). Processes that share the staging
    folder (one per chip on a TPU host) download one at a time under a file lock; the later ones find the
    files in place."""
    local = ctx.run_dir / layout.checkpoints / name
    if ctx.remote:
        import fcntl

        from tpuft.storage import open_storage

        local.parent.mkdir(parents=True, exist_ok=True)
        with open(local.parent / f".{name}.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            open_storage(ctx.run_url).download_tree(f"{layout.checkpoints}/{name}", local)
    if not layout.is_complete(local):
        raise RuntimeError(
            f"{local}: the checkpoint is incomplete (a file in its {layout.manifest} is missing or short)"
        )
    return local


def load_resume_point(
    ctx: WorkerContext,
    layout: RunLayout,
    found: tuple[int, str] | None,
    total_steps: int,
    say: Callable[[str], None],
) -> ResumePoint:
    """The checkpoint ``find_resume_checkpoint`` found, fetched here with its trainer state; said either
    way."""
    if found is None:
        if resuming():
            say(f"{RESUME_ENV} is set but the run has no complete checkpoint: training from step 0")
        return ResumePoint()
    checkpoint = fetch_checkpoint(ctx, layout, found[1])
    state = json.loads((checkpoint / TRAINER_STATE).read_text())
    say(f"resuming from checkpoint {found[1]} (step {found[0]} of {total_steps})")
    return ResumePoint(found[0], checkpoint, state)


def open_metrics(ctx: WorkerContext, *, chief: bool, restart_at: int | None) -> MetricsWriter:
    """The run's metrics writer. A resumed run (``restart_at``: its step) first takes the bucket's metrics
    when this host has no staging copy of them, then forgets what was logged after its checkpoint."""
    if restart_at is not None and chief and ctx.remote:
        fetch_missing_metrics(ctx)
    metrics = MetricsWriter(ctx.run_dir, chief=chief)
    if restart_at is not None:
        metrics.restart_at(restart_at)
    return metrics
