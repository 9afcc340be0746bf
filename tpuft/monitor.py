"""Reading a run while it trains or after: progress, losses, eval metrics, throughput, per-worker heartbeats.

Everything comes from the run directory (the contract in ARCHITECTURE.md), so it works the same for every backend
and wherever the run dir lives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft import rundir
from tpuft.config import ClusterConfig
from tpuft.errors import UsageError
from tpuft.storage import open_storage

STALE_AFTER_SECONDS = 120.0
"""A running worker whose heartbeat is older than this is flagged as stale."""


def resolve_run(config: ClusterConfig, run_id: str | None) -> Path | str:
    """A run id (or a unique prefix of one, or None for the latest) -> its run dir (a ``gs://`` URL on GCP)."""
    from tpuft.providers import get_provider

    storage = open_storage(get_provider(config).get().bucket)
    ids = storage.run_ids()
    if not ids:
        raise UsageError(f"no runs in {storage.url}", hint="Start one: tpuft up quickstart")
    if run_id is None or run_id == "latest":
        return storage.run_dir(ids[-1])
    if run_id in ids:
        return storage.run_dir(run_id)
    matches = [i for i in ids if i.startswith(run_id)]
    if len(matches) == 1:
        return storage.run_dir(matches[0])
    shown = ", ".join(ids[-10:])
    what = "is ambiguous" if matches else "does not exist"
    raise UsageError(f"run {run_id!r} {what} in {storage.url}; runs: {shown}")


@dataclass
class WorkerView:
    index: int
    status: str
    step: int | None
    age_s: float | None
    stale: bool
    digest: str | None = None


@dataclass
class RunSnapshot:
    run_id: str
    run_dir: Path
    info: dict[str, Any]
    status: str
    step: int
    total_steps: int
    last_train: dict[str, Any] = field(default_factory=dict)
    last_eval: dict[str, Any] = field(default_factory=dict)
    best_eval: dict[str, Any] = field(default_factory=dict)
    workers: list[WorkerView] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)
    eta_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "status": self.status,
            "step": self.step,
            "total_steps": self.total_steps,
            "eta_s": self.eta_s,
            "last_train": self.last_train,
            "last_eval": self.last_eval,
            "best_eval": self.best_eval,
            "workers": [w.__dict__ for w in self.workers],
            "skipped_metric_lines": self.skipped_lines,
        }


def mirror_small_files(run_store: Any, mirror: Path) -> Path:
    """Copy a remote run's status files (run info, metrics, heartbeats; not checkpoints) into ``mirror``."""
    mirror.mkdir(parents=True, exist_ok=True)
    for name in (rundir.METRICS, rundir.RUN_INFO):
        text = run_store.read_text(name)
        if text is not None:
            (mirror / name).write_text(text)
    run_store.download_tree(rundir.HEARTBEAT_DIR, mirror / rundir.HEARTBEAT_DIR)
    return mirror


def local_view(run: Path | str) -> Path:
    """A folder with the run's status files: the run dir itself, or a fresh local copy of a gs:// one."""
    if not str(run).startswith("gs://"):
        return Path(run)
    from tpuft.paths import tpuft_home

    run_url = str(run).rstrip("/")
    return mirror_small_files(open_storage(run_url), tpuft_home() / "cache" / "runs" / run_url.rsplit("/", 1)[-1])


def snapshot(run_dir: Path, now: float | None = None) -> RunSnapshot:
    now = time.time() if now is None else now
    info = rundir.read_json(run_dir / rundir.RUN_INFO) or {}
    metrics = rundir.read_metrics(run_dir)
    train_rows, eval_rows = metrics.train_rows, metrics.eval_rows
    total = int(info.get("total_steps") or 0)
    workers = []
    for index in range(int(info.get("workers") or 0)):
        beat = rundir.read_json(rundir.heartbeat_path(run_dir, index)) or {}
        age = now - beat["time"] if "time" in beat else None
        status = beat.get("status", "no heartbeat")
        stale = status in {"running", "starting"} and age is not None and age > STALE_AFTER_SECONDS
        workers.append(WorkerView(index, status, beat.get("step"), age, stale, beat.get("params_sha256")))
    step = int(train_rows[-1]["step"]) if train_rows else 0
    status = str(info.get("status", "unknown"))
    if status == "running" and workers and all(w.stale or w.status == "no heartbeat" for w in workers):
        status = "stale"
    eta = None
    elapsed = train_rows[-1].get("elapsed_s") if train_rows else None
    if status == "running" and elapsed and step and total > step:
        eta = round(elapsed / step * (total - step), 1)
    best = max(eval_rows, key=lambda r: r.get("eval_exact_match", -1.0)) if eval_rows else {}
    return RunSnapshot(
        run_id=str(info.get("run_id", run_dir.name)),
        run_dir=run_dir,
        info=info,
        status=status,
        step=step,
        total_steps=total,
        last_train=train_rows[-1] if train_rows else {},
        last_eval=eval_rows[-1] if eval_rows else {},
        best_eval=best,
        workers=workers,
        skipped_lines=metrics.skipped,
        eta_s=eta,
    )
