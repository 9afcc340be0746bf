"""The run directory contract (ARCHITECTURE.md), shared by the worker that writes it and the tools that read it.
Checkpoints are the backend's business: their folder and names are its :class:`~tpuft.backends.base.RunLayout`.

Stdlib only: imported by the worker inside the backend venv and by ``monitor`` on the controller.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
HEARTBEAT_DIR = "heartbeat"
LOGS_DIR = "logs"
TB_DIR = "tb"
EXPORT_HF = "export/hf"
RUN_INFO = "run.json"
"""Written by the controller: run id, recipe name, backend, cluster, start time, final status."""


def new_run_id(recipe_name: str) -> str:
    return f"{recipe_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000:04d}"


def heartbeat_path(run_dir: Path, worker: int) -> Path:
    return run_dir / HEARTBEAT_DIR / f"worker-{worker}.json"


def log_path(run_dir: Path, worker: int) -> Path:
    return run_dir / LOGS_DIR / f"worker-{worker}.log"


LOG_NAME = re.compile(r"^worker-(\d+)\.log$")
_LOG_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ")


def log_timestamp(now: float | None = None) -> str:
    """What starts each line of a run's worker log: the UTC time it arrived (``2026-11-22T06:12:03.123Z``)."""
    stamp = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z"


def split_log_stamp(raw: bytes) -> tuple[str | None, bytes]:
    """A log line's arrival time (None in logs written before lines were stamped) and the line itself."""
    match = _LOG_STAMP.match(raw)
    return (match.group(1).decode(), raw[match.end() :]) if match else (None, raw)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class MetricsLog:
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    """Line numbers of empty/corrupt lines (a worker killed mid-write leaves one)."""

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if "loss" in r]

    @property
    def eval_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if any(k.startswith("eval_") for k in r)]

    def last(self, key: str) -> Any:
        for row in reversed(self.rows):
            if key in row:
                return row[key]
        return None


def iter_metrics(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return
    with handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                yield number, None
                continue
            yield number, row if isinstance(row, dict) and "step" in row else None


def read_metrics(run_dir: Path) -> MetricsLog:
    log = MetricsLog()
    for number, row in iter_metrics(run_dir / METRICS):
        if row is None:
            log.skipped.append(number)
        else:
            log.rows.append(row)
    return log
