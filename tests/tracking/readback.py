"""What the trackers hold of a run, read back with their own readers: ``python -m tests.tracking.readback
RUN_DIR`` in the tracking venv prints JSON. W&B: every offline run folder under ``RUN_DIR/wandb`` read with
wandb's own record reader (the ``.wandb`` file that ``wandb sync`` uploads): its history rows, summary,
config, tags, and the tables it logged. MLflow: the run ``tracking.json`` names, through ``MlflowClient``
against its store: the metric histories, params, tags, status and artifacts. The tests (and
tests/e2e/tracking_checks.py) compare these with ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
"""A ``.wandb`` file: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of records, each a 7-byte
header (CRC-32, length, type: 1 full, 2 first, 3 middle, 4 last piece) and its bytes; a block's tail shorter
than a header is padding. The records are wandb's own protobuf ``Record``s (what ``wandb sync`` uploads)."""


def wandb_records(path: Path) -> list[bytes]:
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    records, pieces, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:
            offset += room
            continue
        checksum, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if length == 0 and kind == 0:
            break
        body = data[offset + HEADER : offset + HEADER + length]
        assert zlib.crc32(bytes([kind]) + body) == checksum, (
            f"{path}: a record at byte {offset} fails its CRC"
        )
        offset += HEADER + length
        pieces += body
        if kind in (1, 4):
            records.append(pieces)
            pieces = b""
    return records


def wandb_runs(run_dir: Path) -> list[dict[str, Any]]:
    from wandb.proto import wandb_internal_pb2

    runs = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        found: dict[str, Any] = {
            "file": str(path.relative_to(run_dir)),
            "history": [],
            "summary": {},
            "config": {},
            "tags": [],
            "id": None,
            "project": None,
            "exit_code": None,
        }
        for data in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                found.update(id=record.run.run_id, project=record.run.project, tags=list(record.run.tags))
                found["config"].update(
                    {item.key: json.loads(item.value_json) for item in record.run.config.update}
                )
            elif kind == "config":
                found["config"].update(
                    {item.key: json.loads(item.value_json) for item in record.config.update}
                )
            elif kind == "history":
                row = {"step": record.history.step.num}
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    row[key] = json.loads(item.value_json)
                found["history"].append(row)
            elif kind == "summary":
                for item in record.summary.update:
                    key = item.key or "/".join(item.nested_key)
                    found["summary"][key] = json.loads(item.value_json)
            elif kind == "exit":
                found["exit_code"] = record.exit.exit_code
        runs.append(found)
    return runs


def mlflow_run(run_dir: Path) -> dict[str, Any]:
    from mlflow import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    state = json.loads((run_dir / "tracking.json").read_text()).get("mlflow") or {}
    if not state.get("run_id"):
        return {}
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run = client.get_run(state["run_id"])
    metrics = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }
    artifacts = [item.path for item in client.list_artifacts(run.info.run_id)]
    tables = {}
    for name in artifacts:
        if name.startswith("samples_"):
            local = client.download_artifacts(run.info.run_id, name, str(run_dir / ".readback"))
            tables[name] = json.loads(Path(local).read_text())
    experiment = client.get_experiment(run.info.experiment_id)
    return {
        "run_id": run.info.run_id,
        "status": run.info.status,
        "experiment": experiment.name,
        "metrics": metrics,
        "params": dict(run.data.params),
        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
        "run_name": run.info.run_name,
        "artifacts": artifacts,
        "tables": tables,
    }


def main(run_dir: str) -> None:
    path = Path(run_dir)
    json.dump({"wandb": wandb_runs(path), "mlflow": mlflow_run(path)}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
