"""Metrics out of a worker: ``metrics.jsonl`` and TensorBoard events (worker 0), heartbeats (every worker).

TensorBoard events are written with TensorBoard's own writer (``tensorboard`` is in every backend venv), not
with a framework's wrapper, so every backend's trainer can use this module.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tpuft.run import rundir


class MetricsWriter:
    def __init__(self, run_dir: Path, *, chief: bool) -> None:
        self.run_dir = run_dir
        self.chief = chief
        self._tb = None
        if chief:
            (run_dir / rundir.TB_DIR).mkdir(parents=True, exist_ok=True)
            self._jsonl = (run_dir / rundir.METRICS).open("a", encoding="utf-8")
            self._tb = _event_writer(run_dir / rundir.TB_DIR)

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.chief:
            return
        row = {"step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.add_scalars(step, {k: v for k, v in values.items() if isinstance(v, (int, float))})

    def tensorboard(self, step: int, values: dict[str, float]) -> None:
        """TensorBoard only (a framework's own metrics, beside the ``metrics.jsonl`` row tpuft reads)."""
        if self._tb is not None:
            self._tb.add_scalars(step, values)

    def log_text(self, step: int, tag: str, text: str) -> None:
        if self._tb is not None:
            self._tb.add_text(step, tag, text)

    def restart_at(self, step: int) -> int:
        """A resumed run goes on from its checkpoint at ``step``: forget what an earlier attempt logged after
        it. ``metrics.jsonl`` keeps its rows up to ``step`` (the later steps are run again and logged anew),
        and a TensorBoard ``SessionLog(START)`` at ``step + 1`` makes TensorBoard drop the earlier attempt's
        points from there on. Returns how many lines were dropped."""
        if not self.chief:
            return 0
        self._jsonl.close()
        dropped = truncate_metrics(self.run_dir / rundir.METRICS, step)
        self._jsonl = (self.run_dir / rundir.METRICS).open("a", encoding="utf-8")
        if self._tb is not None:
            self._tb.add_session_start(step + 1)
        return dropped

    def close(self) -> None:
        if self.chief:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()


def truncate_metrics(path: Path, step: int) -> int:
    """Keep the rows of ``metrics.jsonl`` whose step is at most ``step``, and no line that is not a whole JSON
    row (a worker killed mid-write leaves half a line at the end). Rewritten through a temp file; returns how
    many lines were dropped (0 when there is no file)."""
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        row_step = _row_step(line) if line.endswith(b"\n") else None
        if row_step is not None and row_step <= step:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_bytes(b"".join(kept))
    os.replace(partial, path)
    return len(lines) - len(kept)


def _row_step(line: bytes) -> int | None:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if type(step) is int else None


class _EventWriter:
    """Scalars and text for TensorBoard via ``tensorboard.summary.writer``."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event_pb2 = event_pb2
        self._summary_pb2 = summary_pb2
        self._writer = EventFileWriter(str(logdir))

    def add_scalars(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        summary = self._summary_pb2.Summary(
            value=[
                self._summary_pb2.Summary.Value(tag=_tag(k), simple_value=float(v)) for k, v in values.items()
            ]
        )
        self._writer.add_event(self._event_pb2.Event(summary=summary, wall_time=time.time(), step=step))
        self._writer.flush()

    def add_text(self, step: int, tag: str, text: str) -> None:
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2

        plugin = self._summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        metadata = self._summary_pb2.SummaryMetadata(plugin_data=plugin)
        tensor = tensor_pb2.TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        value = self._summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
        event = self._event_pb2.Event(
            summary=self._summary_pb2.Summary(value=[value]), wall_time=time.time(), step=step
        )
        self._writer.add_event(event)
        self._writer.flush()

    def add_session_start(self, step: int) -> None:
        """TensorBoard purges every point at ``step`` or later written before this event (a restart's
        orphans)."""
        session_log = self._event_pb2.SessionLog(status=self._event_pb2.SessionLog.START)
        self._writer.add_event(
            self._event_pb2.Event(session_log=session_log, wall_time=time.time(), step=step)
        )
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _tag(key: str) -> str:
    """``eval_loss`` -> ``eval/loss`` so TensorBoard groups train and eval curves."""
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_") :]
    return "train/" + key


def _event_writer(logdir: Path) -> _EventWriter | None:
    try:
        return _EventWriter(logdir)
    except ImportError:
        print("[tpuft] tensorboard is not installed in this venv: no TensorBoard events", flush=True)
        return None


PATIENT_PHASES = frozenset({"starting", "eval", "checkpoint", "export"})
"""Phases in which a trainer may legitimately go quiet for long (XLA compiling the first step or the eval
graph, a checkpoint or an export being written): the worker's supervisor gives them a longer hang timeout."""


class Heartbeat:
    """Each worker's last step, phase and time, so that its supervisor can tell a hung trainer from a slow one
    and ``monitor`` a live worker from a stuck or dead one.

    Cheap enough to call every step (one small atomic file write). ``phase`` says what the trainer is about to
    do: ``starting`` (set-up and the first step's compilation), ``step``, ``collective`` (about to wait for
    its peers in a cross-worker reduction: a worker whose beat says so and is old is waiting, not hung),
    ``eval``, ``checkpoint``, ``export``."""

    def __init__(self, run_dir: Path, worker: int, total_steps: int) -> None:
        self.path = rundir.heartbeat_path(run_dir, worker)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.base = {
            "worker": worker,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "total_steps": total_steps,
        }
        self.started = time.time()
        self._lock = threading.Lock()
        """A framework may report from a background thread (T5X's metrics writer) while the loop beats."""
        self.latest: dict[str, Any] = {}
        """The last loss / lr / throughput given, kept in later beats (the final one has none of its own)."""

    def beat(self, step: int, status: str = "running", phase: str = "step", **extra: Any) -> None:
        """One compact JSON object written through a temporary file (a reader never sees half of it); about a
        quarter of ``write_json_atomic``'s cost, which matters at two beats per step."""
        with self._lock:
            self.latest.update(extra)
            data = {
                **self.base,
                "step": step,
                "status": status,
                "phase": phase,
                "time": time.time(),
                "started": self.started,
                **self.latest,
            }
            with open(self._tmp, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(data, separators=(",", ":")))
            os.replace(self._tmp, self.path)


def fetch_missing_metrics(ctx: Any) -> None:
    """A resumed ``gs://`` run on a host without the staging copy of ``metrics.jsonl``: start from the
    bucket's, which would otherwise be overwritten by the new attempt's rows alone. ``ctx``: the worker's
    WorkerContext."""
    local = ctx.run_dir / rundir.METRICS
    if not ctx.remote or local.exists():
        return
    from tpuft.storage import open_storage

    text = open_storage(ctx.run_url).read_text(rundir.METRICS)
    if text is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text, encoding="utf-8")
