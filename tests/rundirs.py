"""One builder for the fake run dirs that tests read (monitor, runs, logs, pull, convert --run): the layout of
docs/ARCHITECTURE.md's run directory, written with tpuft's own helpers where the workers use them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tpuft.run import rundir


def write_run(
    run: Path,
    *,
    info: dict[str, Any] | None = None,
    metrics: list[dict[str, Any]] | None = None,
    metrics_lines: list[str] | None = None,
    beats: dict[int, dict[str, Any]] | None = None,
    logs: dict[int, bytes] | None = None,
    files: dict[str, bytes] | None = None,
) -> dict[str, bytes]:
    """Write a run dir at ``run``; returns relpath -> bytes of every file written.

    ``metrics`` are rows (one JSON object a line), ``metrics_lines`` raw lines (to include corrupt ones);
    ``beats`` maps a worker to its heartbeat (``age`` seconds turns into its ``time``); ``files`` are any
    other relpaths."""
    written: dict[str, bytes] = {}

    def put(rel: str, data: bytes) -> None:
        path = run / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written[rel] = data

    if info is not None:
        put(rundir.RUN_INFO, json.dumps({"run_id": run.name, **info}).encode())
    if metrics is not None:
        put(rundir.METRICS, "".join(json.dumps(row) + "\n" for row in metrics).encode())
    if metrics_lines is not None:
        put(rundir.METRICS, ("\n".join(metrics_lines) + "\n").encode())
    for worker, beat in (beats or {}).items():
        beat = dict(beat)
        if "age" in beat:
            beat["time"] = time.time() - beat.pop("age")
        put(f"{rundir.HEARTBEAT_DIR}/worker-{worker}.json", json.dumps({"worker": worker, **beat}).encode())
    for worker, data in (logs or {}).items():
        put(f"{rundir.LOGS_DIR}/worker-{worker}.log", data)
    for rel, data in (files or {}).items():
        put(rel, data)
    return written
