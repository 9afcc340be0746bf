"""pull: copy a run directory home (recipe, run info, metrics, logs, TensorBoard events, the chosen
checkpoints and the Hugging Face export) from the bucket or a local run dir.

The transfer itself is the storage layer's tree download: parallel through transfer_manager for ``gs://``,
every file checked against the size and CRC32C (MD5 for an object without one) that GCS lists, written under a
partial name and renamed only once complete. Files already in the destination with the same size and checksum
are skipped, so pulling again after an interruption (or into a folder that holds an older pull) moves only
what is missing or different. Checkpoints are the bulk of a run, so only the ones asked for come along.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.core.errors import UsageError
from tpuft.readers.runs import layout_for, read_run_info
from tpuft.run import rundir
from tpuft.storage import Storage, open_storage

if TYPE_CHECKING:
    from tpuft.backends.base import RunLayout

CHECKPOINT_MODES = ("latest", "best", "all", "none")
DEFAULT_WORKERS = 16
"""Parallel downloads: a run is mostly many small files (logs, events, sharded checkpoints) where latency
dominates."""


@dataclass
class PullResult:
    run_id: str
    source: str
    """The run dir pulled: a local path or a ``gs://`` URL."""
    dest: Path
    checkpoints_mode: str
    checkpoints: list[int]
    """Steps of the checkpoints pulled (oldest first); empty for ``none`` or a run without checkpoints."""
    files_total: int
    files_fetched: int
    files_skipped: int
    """Files already in ``dest`` with the same size and checksum."""
    bytes_total: int
    bytes_fetched: int
    seconds: float
    pulled_at: str
    """When the pull started, ISO 8601 UTC."""
    run_started: str | None = None
    """When the run started (its run.json), ISO 8601 UTC; None if the run dir has no run.json."""
    run_status: str | None = None
    notes: list[str] = field(default_factory=list)
    """What the user should know: a fallback in choosing the checkpoint, a run without checkpoints."""

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_fetched / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "source": self.source,
            "dest": str(self.dest),
            "checkpoints_mode": self.checkpoints_mode,
            "checkpoints": list(self.checkpoints),
            "files_total": self.files_total,
            "files_fetched": self.files_fetched,
            "files_skipped": self.files_skipped,
            "bytes_total": self.bytes_total,
            "bytes_fetched": self.bytes_fetched,
            "seconds": round(self.seconds, 3),
            "bytes_per_s": round(self.bytes_per_s, 1),
            "pulled_at": self.pulled_at,
            "run_started": self.run_started,
            "run_status": self.run_status,
            "notes": list(self.notes),
        }


def pull(
    run: Path | str,
    dest: Path,
    *,
    checkpoints: str = "latest",
    workers: int = DEFAULT_WORKERS,
    progress: Callable[[int, int], None] | None = None,
    project: str | None = None,
) -> PullResult:
    """Copy the run dir ``run`` (a local path or ``gs://`` URL: a :class:`~tpuft.readers.runs.Run`'s url) into
    ``dest``.

    ``checkpoints``: ``latest`` (highest step), ``best`` (best eval metric in metrics.jsonl), ``all`` or
    ``none``. ``progress(bytes_done, bytes_total)`` is called once the files are listed, then as bytes land
    (from worker threads, one call at a time), and ends at ``(total, total)``. ``project``: the GCP project
    for a ``gs://`` run. Raises :class:`UsageError` for a bad argument or a missing run, :class:`TpuftError`
    when files fail to download (those completed stay; pulling again fetches only the rest)."""
    mode = _check_args(checkpoints, workers)
    source = str(run)
    storage = open_storage(source, project=project)
    _check_dest(storage, Path(dest))
    pulled_at = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    started = time.monotonic()

    info = read_run_info(storage)
    layout = layout_for(info or {}, storage)
    steps = layout.checkpoint_steps(storage)
    if info is None and not steps and not storage.folders() and storage.read_text(rundir.METRICS) is None:
        raise UsageError(
            f"{source}: not a run directory (no {rundir.RUN_INFO}, {rundir.METRICS} or folders in it)"
        )
    eval_rows = eval_rows_of(storage.read_text(rundir.METRICS) or "") if mode == "best" else []
    metric = rundir.recipe_metric(storage.read_text(rundir.RECIPE)) if mode == "best" else None
    chosen, notes = choose_checkpoints(mode, sorted(steps), eval_rows, metric)

    include = _selector(layout, {steps[step] for step in chosen})
    transfer = storage.fetch_tree("", dest, workers=workers, include=include, progress=progress)
    return PullResult(
        run_id=_run_id(source, info),
        source=source,
        dest=Path(dest),
        checkpoints_mode=mode,
        checkpoints=chosen,
        files_total=transfer.files,
        files_fetched=transfer.fetched,
        files_skipped=transfer.skipped,
        bytes_total=transfer.total_bytes,
        bytes_fetched=transfer.fetched_bytes,
        seconds=time.monotonic() - started,
        pulled_at=pulled_at,
        run_started=_iso(info.get("started")) if info else None,
        run_status=str(info["status"]) if info and info.get("status") else None,
        notes=notes,
    )


def choose_checkpoints(
    mode: str, steps: list[int], eval_rows: list[dict[str, Any]], metric: str | None = None
) -> tuple[list[int], list[str]]:
    """The checkpoint steps to pull out of ``steps`` (sorted), and notes on any fallback taken.

    ``best`` ranks evaluations by ``metric``, the run's ``eval.metric`` (what its trainer kept the best
    checkpoint by), else as ``tpuft monitor`` does (``eval_exact_match`` highest first, ... ``eval_loss``
    lowest last). Checkpoints are saved less often than evaluations run, and old ones are deleted, so the best
    eval step may have none: then the closest one before it (the weights that eval measured are gone; those
    are the nearest that led to them), else the first after it."""
    if mode == "none":
        return [], []
    if not steps:
        return [], ["the run has no checkpoints (none saved yet, or checkpointing is off)"]
    if mode == "all":
        return list(steps), []
    if mode == "latest":
        return [steps[-1]], []
    return _best(steps, eval_rows, metric)


def _best(
    steps: list[int], eval_rows: list[dict[str, Any]], metric: str | None
) -> tuple[list[int], list[str]]:
    from tpuft.run.rundir import best_eval_metric, best_eval_row

    ranked = best_eval_metric(best_eval_row(eval_rows, metric), metric)
    if ranked is None:
        return [steps[-1]], [
            f"no eval metrics in {rundir.METRICS}: pulled the latest checkpoint (step {steps[-1]})"
        ]
    name, value, step = ranked
    notes = [f"best eval: {name} = {value:g} at step {step}"]
    before = [s for s in steps if s <= step]
    if before and before[-1] == step:
        return [step], notes
    if before:
        notes.append(f"no checkpoint at step {step}: pulled step {before[-1]}, the closest before it")
        return [before[-1]], notes
    after = steps[0]
    notes.append(f"no checkpoint at or before step {step}: pulled step {after}, the closest after it")
    return [after], notes


def _check_args(checkpoints: str, workers: int) -> str:
    if checkpoints not in CHECKPOINT_MODES:
        raise UsageError(f"--checkpoints {checkpoints!r}: expected one of {', '.join(CHECKPOINT_MODES)}")
    if workers < 1:
        raise UsageError(f"workers must be at least 1, got {workers}")
    return checkpoints


def _check_dest(storage: Storage, dest: Path) -> None:
    """A local run pulled into itself (or below itself) would copy files onto themselves, or into its own
    copy."""
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a folder; give a folder to pull the run into")
    if storage.local_root is None:
        return
    source, target = storage.local_root.resolve(), dest.expanduser().resolve()
    if target == source or source in target.parents:
        raise UsageError(
            f"{dest}: the destination is inside the run dir {storage.root}; choose another folder"
        )


def _selector(layout: RunLayout, chosen: set[str]) -> Callable[[str], bool]:
    """Everything in the run dir except the checkpoint folders not chosen (half-written ones included)."""
    prefix = f"{layout.checkpoints}/"

    def include(rel: str) -> bool:
        if not rel.startswith(prefix):
            return True
        folder, sep, _ = rel[len(prefix) :].partition("/")
        return not sep or folder in chosen

    return include


def eval_rows_of(text: str) -> list[dict[str, Any]]:
    """Eval rows of a metrics.jsonl (``rundir.read_metrics`` on text: the file may be remote); bad lines
    skipped."""
    log = rundir.MetricsLog()
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            log.rows.append(row)
    return log.eval_rows


def _run_id(source: str, info: dict[str, Any] | None) -> str:
    if info and isinstance(info.get("run_id"), str):
        return str(info["run_id"])
    return source.rstrip("/").rsplit("/", 1)[-1]


def _iso(stamp: object) -> str | None:
    if not isinstance(stamp, (int, float)):
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
