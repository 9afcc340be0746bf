"""A run, as the controller sees it: where it lives, its one local mirror, its status and summary.

A run is named by its id and lives under the cluster's run storage (``runs/<id>``): a local folder, or a
``gs://`` prefix. :class:`Run` is the one reference every verb uses (monitor, runs, logs, pull, convert --run,
tensorboard, train), so finding a run by prefix, mirroring a bucket run to this machine, and reading its
status are written once.

A bucket run has exactly one local mirror, ``$TPUFT_HOME/runs/<bucket>/<prefix>/<run_id>``: ``tpuft train``
writes the live worker logs there, ``monitor``/``runs`` refresh its status files (and the appended part of
each log), and ``tensorboard`` mirrors its events there. A local run is its own mirror.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.backends.spec import RunOutcome
from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.run import rundir
from tpuft.run.rundir import best_eval_metric, best_eval_row
from tpuft.storage import Storage, open_storage

if TYPE_CHECKING:
    from tpuft.backends.spec import RunLayout

STALE_AFTER_SECONDS = 120.0
"""A running worker whose heartbeat is older than this is flagged as stale."""


@dataclass(frozen=True)
class Run:
    """One run: its id, its run dir (a folder or a ``gs://`` URL), and the GCP project that owns the
    bucket."""

    id: str
    url: str
    project: str | None = None

    @classmethod
    def from_url(cls, url: str | Path, project: str | None = None) -> Run:
        """Any run dir (a folder or a ``gs://`` URL): its id is its last path part."""
        text = str(url).rstrip("/")
        return cls(text.rsplit("/", 1)[-1], text, project)

    @property
    def remote(self) -> bool:
        return self.url.startswith("gs://")

    @functools.cached_property
    def storage(self) -> Storage:
        """The run dir as a storage: ``read_text("run.json")``, ``list("logs")``, ..."""
        return open_storage(self.url, project=self.project)

    @property
    def mirror(self) -> Path:
        """The run's one folder on this machine (the run dir itself when it is local)."""
        if not self.remote:
            return Path(self.url)
        from tpuft.core.paths import tpuft_home

        return tpuft_home() / "runs" / self.url.removeprefix("gs://").rstrip("/")

    def info(self) -> dict[str, Any]:
        """run.json (empty when it is missing or being rewritten)."""
        return read_run_info(self.storage) or {}

    def local_view(self, *, logs: bool = False) -> Path:
        """A folder with the run's status files: the run dir itself, or the mirror refreshed from the bucket
        (with ``logs``, the new part of each worker log too)."""
        if not self.remote:
            return self.mirror
        return mirror_small_files(self.storage, self.mirror, logs=logs)

    def layout(self) -> RunLayout:
        """Where this run's backend put things (see :func:`layout_for`)."""
        return layout_for(self.info(), self.storage)

    def snapshot(self, *, logs: bool = False, node_state: str | None = None) -> RunSnapshot:
        snap = snapshot(self.local_view(logs=logs), node_state=node_state)
        snap.run_dir = self.url  # type: ignore[assignment]  # where it lives, not the local copy
        return snap


def read_run_info(storage: Storage) -> dict[str, Any] | None:
    """A run dir's run.json; None when it is missing, not JSON (being rewritten) or not an object."""
    import json

    text = storage.read_text(rundir.RUN_INFO)
    try:
        info = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return info if isinstance(info, dict) else None


def layout_of(info: dict[str, Any]) -> RunLayout | None:
    """The layout of the backend that wrote the run (run.json names it); None when tpuft does not know that
    backend (a run dir written by another tool, or by an older tpuft)."""
    from tpuft.backends.registry import MODULES, layout

    kind = info.get("backend")
    return layout(kind) if isinstance(kind, str) and kind in MODULES else None


def layout_for(info: dict[str, Any], storage: Storage) -> RunLayout:
    """:func:`layout_of`, or for a run of unknown origin the first known layout whose checkpoints it holds."""
    known = layout_of(info)
    if known is not None:
        return known
    from tpuft.backends.registry import MODULES, layout
    from tpuft.backends.spec import RunLayout

    for kind in MODULES:
        candidate = layout(kind)
        if candidate.checkpoint_steps(storage):
            return candidate
    return RunLayout()


def run_storage(config: ClusterConfig) -> Storage:
    """The cluster's run storage (known without asking the cloud API)."""
    from tpuft.providers import get_provider

    return open_storage(get_provider(config).storage_url(), project=config.gcp.project)


def run_at(storage: Storage, run_id: str, project: str | None = None) -> Run:
    return Run(run_id, str(storage.run_dir(run_id)), project)


def list_runs(config: ClusterConfig) -> list[Run]:
    """Every run in the cluster's storage, oldest first (by the start time in the id)."""
    storage = run_storage(config)
    return [run_at(storage, run_id, config.gcp.project) for run_id in storage.run_ids()]


def resolve_run(config: ClusterConfig, run_id: str | None) -> Run:
    """A run id, a unique prefix of one, or None / ``latest`` for the newest run."""
    storage = run_storage(config)
    ids = storage.run_ids()
    if not ids:
        raise UsageError(f"no runs in {storage.url}", hint="Start one: tpuft up quickstart")
    if run_id is None or run_id == "latest":
        return run_at(storage, ids[-1], config.gcp.project)
    matches = [run_id] if run_id in ids else [i for i in ids if i.startswith(run_id)]
    if len(matches) == 1:
        return run_at(storage, matches[0], config.gcp.project)
    what = "is ambiguous" if matches else "does not exist"
    raise UsageError(f"run {run_id!r} {what} in {storage.url}; runs: {', '.join(ids[-10:])}")


@dataclass
class WorkerView:
    index: int
    status: str
    step: int | None
    age_s: float | None
    stale: bool
    digest: str | None = None
    loss: float | None = None
    lr: float | None = None
    examples_per_s: float | None = None
    tokens_per_s: float | None = None
    last_log_line: str | None = None


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
    test: dict[str, Any] = field(default_factory=dict)
    """The test evaluation's ``test_*`` scores (``data.test``), with ``test_checkpoint_step``,
    ``test_examples`` and ``test_seconds``; {} before it (or without a test set)."""
    workers: list[WorkerView] = field(default_factory=list)
    skipped_lines: list[int] = field(default_factory=list)
    eta_s: float | None = None
    elapsed_s: float | None = None
    node_state: str | None = None
    """The provider's word for the cluster (READY, PREEMPTED, NOT_FOUND, ...); None when not asked."""
    metrics_source: str = rundir.METRICS
    """metrics.jsonl, or the TensorBoard events when a backend (T5X) writes only those."""
    stale_for_s: float | None = None
    """For a stale run: how long since the freshest heartbeat."""
    notes: list[str] = field(default_factory=list)
    """Problems met while reading (a truncated TensorBoard event file, ...), shown as warnings."""

    @property
    def label(self) -> str:
        """The status as ``runs`` and ``monitor`` show it (a failure names its worker)."""
        return status_label(self.info, self.status)

    @property
    def ended(self) -> bool:
        return self.status not in {"running", "starting", "stale", "unknown"}

    @property
    def recovery_line(self) -> str | None:
        """``attempt 3, 2 recoveries (last: node PREEMPTED at step 812, 12 steps redone)``; None without
        recoveries."""
        done = self.info.get("recoveries") or []
        if not done:
            return None
        last = done[-1]
        head = (
            f"attempt {self.info.get('attempt', 1)}, {len(done)} "
            f"recover{'y' if len(done) == 1 else 'ies'} (last: "
        )
        if last.get("error"):
            return head + f"{last.get('cause')}; could not recreate the node yet: {last['error']})"
        return head + (
            f"{last.get('cause')} at step {last.get('last_step')}, {last.get('steps_lost', 0)} steps redone "
            f"from the checkpoint at {last.get('checkpoint_step')})"
        )

    @property
    def best_metric(self) -> tuple[str, float, int] | None:
        return best_eval_metric(self.best_eval)

    @property
    def outcome(self) -> RunOutcome:
        """What a backend's end-of-run summary reads (``Backend.summarize``): the workers' weight digests and
        the best evaluation, as a plain record the backends can take without importing this reader."""
        digests = {w.index: w.digest for w in self.workers if w.digest}
        return RunOutcome(digests=digests, best_metric=self.best_metric)

    @property
    def tracking(self) -> dict[str, Any]:
        """Where W&B and MLflow have the run (``report.to``): run.json's ``tracking`` once it has ended, the
        sidecar's ``tracking.json`` while it runs; {} without trackers."""
        recorded = self.info.get("tracking")
        if isinstance(recorded, dict) and recorded:
            return recorded
        return rundir.tracking_entry(rundir.read_json(Path(self.run_dir) / rundir.TRACKING) or {})

    def as_json(self) -> dict[str, Any]:
        best = self.best_metric
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "recipe": self.info.get("recipe"),
            "backend": self.info.get("backend"),
            "status": self.status,
            "cause": self.info.get("cause"),
            "culprit": self.info.get("culprit"),
            "attempt": self.info.get("attempt", 1),
            "recoveries": self.info.get("recoveries") or [],
            "node_state": self.node_state,
            "step": self.step,
            "total_steps": self.total_steps,
            "elapsed_s": self.elapsed_s,
            "eta_s": self.eta_s,
            "stale_for_s": self.stale_for_s,
            "metrics_source": self.metrics_source,
            "notes": self.notes,
            "best_metric": {"name": best[0], "value": best[1], "step": best[2]} if best else None,
            "last_train": self.last_train,
            "last_eval": self.last_eval,
            "best_eval": self.best_eval,
            "test": self.test,
            "tracking": self.tracking,
            "workers": [w.__dict__ for w in self.workers],
            "skipped_metric_lines": self.skipped_lines,
        }


def mirror_small_files(run_store: Any, mirror: Path, *, logs: bool = False) -> Path:
    """Copy a remote run's status files (run info, metrics, heartbeats; not checkpoints) into ``mirror``; with
    ``logs`` its worker logs too, and its TensorBoard events when those are its metrics
    (:func:`metrics_are_events`)."""
    mirror.mkdir(parents=True, exist_ok=True)
    for name in (rundir.METRICS, rundir.RUN_INFO, rundir.TRACKING):
        text = run_store.read_text(name)
        if text is not None:
            (mirror / name).write_text(text)
    run_store.download_tree(rundir.HEARTBEAT_DIR, mirror / rundir.HEARTBEAT_DIR)
    info = rundir.read_json(mirror / rundir.RUN_INFO) or {}
    attempt_dir = f"{rundir.ATTEMPTS_DIR}/{int(info.get('attempt', 1))}"
    # the supervisors' records: hung, failed, stopped
    run_store.download_tree(attempt_dir, mirror / attempt_dir)
    if logs:
        _append_new_log_bytes(run_store, mirror)
    if metrics_are_events(mirror):
        run_store.download_tree(rundir.TB_DIR, mirror / rundir.TB_DIR)
    return mirror


def _append_new_log_bytes(run_store: Any, mirror: Path) -> None:
    """Logs only grow: fetch each one from the size the mirror already has (a ranged read), so a refresh every
    few seconds moves the new lines, not the whole log again."""
    for relpath in run_store.list(rundir.LOGS_DIR):
        local = mirror / relpath
        local.parent.mkdir(parents=True, exist_ok=True)
        have = local.stat().st_size if local.is_file() else 0
        data = run_store.read_bytes(relpath, start=have)
        if data:
            with local.open("ab") as handle:
                handle.write(data)


def metrics_are_events(run_dir: Path) -> bool:
    """Whether a run's metrics are TensorBoard events only (a T5X-style backend) rather than metrics.jsonl:
    what its backend's layout says, or, for a backend tpuft does not know, whether it has no metrics.jsonl."""
    layout = layout_of(rundir.read_json(run_dir / rundir.RUN_INFO) or {})
    if layout is not None:
        return layout.metrics == "tensorboard"
    return not (run_dir / rundir.METRICS).is_file()


def read_run_metrics(run_dir: Path) -> tuple[rundir.MetricsLog, str]:
    """metrics.jsonl, or the TensorBoard events when those are the run's metrics and it has some."""
    if not (metrics_are_events(run_dir) and (run_dir / rundir.TB_DIR).is_dir()):
        return rundir.read_metrics(run_dir), rundir.METRICS
    from tpuft.readers.tb_events import read_tb_metrics

    return read_tb_metrics(run_dir / rundir.TB_DIR), "tensorboard events"


def last_log_line(path: Path, max_bytes: int = 8192) -> str | None:
    """The last non-empty line of a worker's log (timestamp dropped), reading only the file's tail."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            tail = handle.read()
    except FileNotFoundError:
        return None
    for raw in reversed(tail.splitlines()):
        line = rundir.split_log_stamp(raw)[1].decode("utf-8", "replace").strip()
        if line:
            return line
    return None


def _local_attempt_records(run_dir: Path, attempt: int) -> dict[int, dict[str, Any]]:
    from tpuft.storage import LocalStorage

    return (
        rundir.attempt_records(LocalStorage(run_dir), attempt)
        if (run_dir / rundir.ATTEMPTS_DIR).is_dir()
        else {}
    )


def status_label(info: dict[str, Any], status: str) -> str:
    """``failed (hung: worker 1)``, ``failed (worker 1)``, or the status itself: what ``runs`` and ``monitor``
    show."""
    culprit = info.get("culprit")
    if status == "failed" and culprit is not None:
        hung = str(info.get("cause", "")).startswith("hung:")
        return f"failed ({'hung: ' if hung else ''}worker {culprit})"
    return status


def snapshot(run_dir: Path, now: float | None = None, *, node_state: str | None = None) -> RunSnapshot:
    now = time.time() if now is None else now
    info = rundir.read_json(run_dir / rundir.RUN_INFO) or {}
    metrics, source = read_run_metrics(run_dir)
    train_rows, eval_rows = metrics.train_rows, metrics.eval_rows
    total = int(info.get("total_steps") or 0)
    workers = []
    count = int(info.get("workers") or 0) or len(list((run_dir / rundir.HEARTBEAT_DIR).glob("worker-*.json")))
    records = _local_attempt_records(run_dir, int(info.get("attempt", 1)))
    recorded = info.get("test")
    test = rundir.test_items(metrics.test_row) or rundir.test_items(
        recorded if isinstance(recorded, dict) else {}
    )
    for index in range(count):
        beat = rundir.read_json(rundir.heartbeat_path(run_dir, index)) or {}
        test = test or rundir.test_items(beat)  # metrics as TensorBoard events may not carry the row
        age = now - beat["time"] if "time" in beat else None
        status = beat.get("status", "no heartbeat")
        record = records.get(index, {})
        if (
            record.get("status") in rundir.TERMINAL
        ):  # the supervisor knows how the trainer ended (hung, stopped...)
            status = record["status"]
        stale = status in {"running", "starting"} and age is not None and age > STALE_AFTER_SECONDS
        workers.append(
            WorkerView(
                index,
                status,
                beat.get("step"),
                age,
                stale,
                beat.get("params_sha256"),
                loss=beat.get("loss"),
                lr=beat.get("lr"),
                examples_per_s=beat.get("examples_per_s"),
                tokens_per_s=beat.get("tokens_per_s"),
                last_log_line=last_log_line(rundir.log_path(run_dir, index)),
            )
        )
    if (
        info.get("job") == "predict"
    ):  # each worker counts the examples it predicted: the job has done their sum
        step = sum(w.step or 0 for w in workers)
    else:
        step = int(train_rows[-1]["step"]) if train_rows else max([w.step or 0 for w in workers], default=0)
    status = str(info.get("status", "unknown"))
    stale_for = None
    if status == "running" and workers and all(w.stale or w.status == "no heartbeat" for w in workers):
        status = "stale"
        ages = [w.age_s for w in workers if w.age_s is not None]
        stale_for = round(min(ages), 1) if ages else None
    started = info.get("started")
    elapsed = (
        info.get("seconds")
        if status != "running" and info.get("seconds") is not None
        else (round(now - started, 1) if isinstance(started, (int, float)) else None)
    )
    eta = None
    trained_for = train_rows[-1].get("elapsed_s") if train_rows else None
    if status == "running" and trained_for and step and total > step:
        eta = round(trained_for / step * (total - step), 1)
    best = best_eval_row(eval_rows)
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
        test=test,
        workers=workers,
        skipped_lines=metrics.skipped,
        eta_s=eta,
        elapsed_s=elapsed,
        node_state=node_state,
        metrics_source=source,
        stale_for_s=stale_for,
        notes=list(getattr(metrics, "notes", [])),
    )
