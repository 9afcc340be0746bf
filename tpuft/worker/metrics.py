"""Metrics out of a worker: ``metrics.jsonl`` and TensorBoard events (worker 0), heartbeats (every worker).

TensorBoard events are written with TensorBoard's own writer (``tensorboard`` is in every backend venv), not with a
framework's wrapper, so every backend's trainer can use this module.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from tpuft import rundir


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

    def log_text(self, step: int, tag: str, text: str) -> None:
        if self._tb is not None:
            self._tb.add_text(step, tag, text)

    def close(self) -> None:
        if self.chief:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()


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
            value=[self._summary_pb2.Summary.Value(tag=_tag(k), simple_value=float(v)) for k, v in values.items()]
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
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
        )
        value = self._summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)
        event = self._event_pb2.Event(summary=self._summary_pb2.Summary(value=[value]), wall_time=time.time(), step=step)
        self._writer.add_event(event)
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


class Heartbeat:
    """Each worker's last step and time, so ``monitor`` can tell a live worker from a stuck or dead one."""

    def __init__(self, run_dir: Path, worker: int, total_steps: int) -> None:
        self.path = rundir.heartbeat_path(run_dir, worker)
        self.base = {"worker": worker, "pid": os.getpid(), "host": socket.gethostname(), "total_steps": total_steps}
        self.started = time.time()
        self.latest: dict[str, Any] = {}
        """The last loss / lr / throughput given, kept in later beats (the final one has none of its own)."""

    def beat(self, step: int, status: str = "running", **extra: Any) -> None:
        self.latest.update(extra)
        data = {**self.base, "step": step, "status": status, "time": time.time(), "started": self.started, **self.latest}
        rundir.write_json_atomic(self.path, data)
