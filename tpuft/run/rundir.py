"""The run directory contract (docs/ARCHITECTURE.md), shared by the worker that writes it and the tools that
read it. Checkpoints are the backend's business: their folder and names are its
:class:`~tpuft.backends.base.RunLayout`.

Stdlib only: imported by the worker inside the backend venv and by ``monitor`` on the controller.
"""

from __future__ import annotations

import json
import math
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
TRACKING = "tracking.json"
"""The tracker sidecar's state (``report.to``: wandb, mlflow): each tracker's run and the rows it has; its
runs go into run.json's ``tracking`` at the end (:func:`tracking_entry`)."""
EVENTS_DIR = "events"
"""The run's timeline, read by ``tpuft.run.goodput``: the chief trainer's ``worker-<i>-attempt-<n>.jsonl``
(one JSON event a line, ``tpuft.worker.events``) and the controller's one object per event under
``controller/``."""
CONTROLLER_EVENTS = f"{EVENTS_DIR}/controller"
TRACKING_STOP = "tracking-stop.json"
"""Written by the chief's supervisor when its trainer has ended: the sidecar sends the rest and finishes."""


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

    @property
    def test_row(self) -> dict[str, Any]:
        """The run's test evaluation (``data.test``; {} without one): the last row with ``test_*`` keys."""
        return next((r for r in reversed(self.rows) if any(k.startswith("test_") for k in r)), {})

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


# ----------------------------------------------------------------------------------------------------------
# Attempts: what the worker-side supervisors record, so that a run ends (and says how) without its controller.
#
# A run has attempts (the first launch, then one per resume). Under ``attempts/<n>/`` every launched worker's
# supervisor keeps ``worker-<i>.json`` (running, then how its trainer ended, then ``final`` once its files are
# uploaded), and ``stop.json`` appears when someone asked the run to stop. The last supervisor to finish turns
# the records into run.json's outcome (:func:`finalize_run`); so does any controller that finds them complete.

ATTEMPTS_DIR = "attempts"
TERMINAL = frozenset({"finished", "failed", "hung", "stopped"})
"""A worker record's status once its trainer has ended."""
FAILED = frozenset({"failed", "hung"})


def attempt_record(attempt: int, worker: int) -> str:
    return f"{ATTEMPTS_DIR}/{attempt}/worker-{worker}.json"


def stop_request(attempt: int) -> str:
    return f"{ATTEMPTS_DIR}/{attempt}/stop.json"


def checkpoint_request(attempt: int, request_id: str) -> str:
    """A checkpoint asked for on demand (``tpuft checkpoint``, ``stop --checkpoint``, a maintenance notice, a
    cost limit): ``{"id", "time", "reason", "at_step", "stop"}``. Every supervisor relays it to its trainer's
    :data:`CONTROL_DIR`; a request of an earlier attempt is never served (the folder is the attempt's)."""
    return f"{ATTEMPTS_DIR}/{attempt}/checkpoint-{request_id}.json"


def checkpoint_ack(attempt: int, request_id: str, worker: int) -> str:
    """A trainer's answer to a checkpoint request: ``{"step", "saved"}`` once the save is done, or ``{"step",
    "refused"}`` (the chief's is the one that counts)."""
    return f"{ATTEMPTS_DIR}/{attempt}/checkpoint-{request_id}-worker-{worker}.json"


CHECKPOINT_REQUEST_NAME = re.compile(r"^checkpoint-(\d+)\.json$")
CONTROL_DIR = ".control"
"""In a trainer's LOCAL run dir, one folder per worker (a local pod's workers share the run dir): the requests
its supervisor relayed (``checkpoint-<id>.json``), so that the trainer looks for them with one ``os.stat`` per
step and never reads the bucket. Its dot keeps it out of the run-dir sync: the bucket has the requests
already."""


def checkpoint_control(run_dir: Path, worker: int) -> Path:
    return run_dir / CONTROL_DIR / f"worker-{worker}"


def failure_record(attempt: int, worker: int) -> str:
    """A copy of a failed or hung worker's record in a folder of its own: what every supervisor polls (one
    listing, empty while all is well, however many workers the pod has)."""
    return f"{ATTEMPTS_DIR}/{attempt}/failures/worker-{worker}.json"


_RECORD_NAME = re.compile(r"^worker-(\d+)\.json$")


def read_json_text(text: str | None) -> dict[str, Any] | None:
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def attempt_records(storage: Any, attempt: int, folder: str = "") -> dict[int, dict[str, Any]]:
    """worker -> its supervisor's record for this attempt (``storage``: the run dir, local or in a bucket);
    with ``folder="failures"``, only the failed and hung workers' records."""
    records = {}
    prefix = f"{ATTEMPTS_DIR}/{attempt}" + (f"/{folder}" if folder else "")
    for relpath in storage.list(prefix):
        parent, _, name = relpath.rpartition("/")
        match = _RECORD_NAME.match(name)
        if match and parent == prefix:
            record = read_json_text(storage.read_text(relpath))
            if record is not None:
                records[int(match.group(1))] = record
    return records


def failure_culprit(records: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The worker whose failure ended the attempt: among failed or hung workers, one that did not merely wait
    for its peers, then the earliest to end (a peer's trainer fails a moment later, when its collective loses
    the culprit: that is a consequence, not the cause)."""
    failed = [r for r in records.values() if r.get("status") in FAILED]
    if not failed:
        return None
    return min(
        failed, key=lambda r: (bool(r.get("waiting")), float(r.get("ended") or 0.0), int(r.get("worker", 0)))
    )


def describe_failure(record: dict[str, Any]) -> str:
    """One line for run.json's ``cause``: ``hung: worker 1 made no progress for 600 s (last step 1200)`` or
    ``worker 1: exit code 1``; on several slices the supervisor's record names it ``slice 1 host 0 (worker
    2)``."""
    worker = record.get("name") or f"worker {record.get('worker')}"
    if record.get("status") == "hung":
        return f"hung: {worker} {record.get('reason') or 'made no progress'}"
    return f"{worker}: {record.get('reason') or 'exit code ' + str(record.get('exit_code'))}"


def attempt_outcome(
    records: dict[int, dict[str, Any]], workers: int, stop: dict[str, Any] | None
) -> dict[str, Any] | None:
    """How an attempt ended, once every one of its ``workers`` has a final record (None before): run.json's
    status, cause, culprit worker and the culprit's last log lines."""
    if len(records) < workers or not all(r.get("final") for r in records.values()):
        return None
    culprit = failure_culprit(records)
    if culprit is not None:
        return {
            "status": "failed",
            "cause": describe_failure(culprit),
            "culprit": culprit.get("worker"),
            "culprit_tail": culprit.get("tail", [])[-15:],
        }
    if stop is not None or any(r.get("status") == "stopped" for r in records.values()):
        return {"status": "stopped", "cause": (stop or {}).get("reason", "stopped on a worker")}
    return {"status": "finished"}


def finalize_run(storage: Any, attempt: int | None = None) -> dict[str, Any] | None:
    """Write the attempt's outcome into run.json once every worker's record is final; returns the new run info
    (None while the attempt goes on, or when run.json has moved on to a later attempt than ``attempt``; None:
    the current one). Idempotent: every supervisor calls it as it finishes, and the controller too; whoever
    sees the records complete writes the same outcome."""
    info = read_json_text(storage.read_text(RUN_INFO))
    if info is None:
        return None
    current = int(info.get("attempt", 1))
    if attempt is not None and current != attempt:
        return None
    attempt = current
    if info.get("status") != "running":
        return info
    outcome = attempt_outcome(
        attempt_records(storage, attempt),
        int(info.get("workers") or 0),
        read_json_text(storage.read_text(stop_request(attempt))),
    )
    if outcome is None:
        return None
    ended = time.time()
    attempts = list(info.get("attempts") or [])
    if attempts:
        cause = {"cause": outcome["cause"]} if outcome.get("cause") else {}
        attempts[-1] = {**attempts[-1], "ended": ended, "status": outcome["status"], **cause}
    seconds = (
        sum(float(a.get("ended", ended)) - float(a.get("started", ended)) for a in attempts)
        if attempts
        else None
    )
    info = {k: v for k, v in info.items() if k not in {"cause", "culprit", "culprit_tail", "test"}}
    info.update(outcome, ended=ended, attempts=attempts)
    tracking = tracking_entry(read_json_text(storage.read_text(TRACKING)) or {})
    if tracking:
        info["tracking"] = tracking
    test = final_test(storage, int(info.get("workers") or 0)) if outcome["status"] == "finished" else {}
    if test:
        info["test"] = test
    if seconds is not None:
        info["seconds"] = round(seconds, 1)
    storage.write_text(RUN_INFO, json.dumps(info, indent=2, sort_keys=True))
    return info


def tracking_entry(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """run.json's ``tracking``: where each tracker has the run (W&B: id, project, mode, url; MLflow: run id,
    store, experiment) and how many rows it got, without the sidecar's bookkeeping."""
    return {
        name: {key: value for key, value in entry.items() if key != "marks"}
        for name, entry in state.items()
        if isinstance(entry, dict)
    }


def tracking_lines(entry: dict[str, Any]) -> list[str]:
    """One line per tracker for ``runs show`` and ``monitor``: ``wandb: <url or project/id (offline: wandb
    sync DIR)>``, ``mlflow: run <id> in <store> (experiment <name>)``."""
    lines = []
    wandb = entry.get("wandb") or {}
    if wandb:
        where = wandb.get("url") or f"{wandb.get('project', '?')}/{wandb.get('id', '?')}"
        offline = (
            f" (offline: wandb sync <run dir>/{wandb['dir']})"
            if wandb.get("mode") == "offline" and wandb.get("dir")
            else ""
        )
        lines.append(f"wandb: {where}{offline}, {wandb.get('rows', 0)} rows")
    mlflow = entry.get("mlflow") or {}
    if mlflow:
        lines.append(
            f"mlflow: run {mlflow.get('run_id', '?')} in {mlflow.get('tracking_uri', '?')} "
            f"(experiment {mlflow.get('experiment', '?')}), {mlflow.get('rows', 0)} rows"
        )
    return lines


TEST_DIR = "test"
"""The test evaluation's predictions, one ``predictions-<process>.jsonl`` per process
(``tpuft.scoring.predictions``)."""

TEST_SCORES = ("test_exact_match", "test_accuracy", "test_macro_f1", "test_bleu", "test_rouge_l", "test_loss")
"""The scores of a test row, in the order tables show them (``test_loss`` only from a backend that computes
it)."""


def test_items(row: dict[str, Any]) -> dict[str, Any]:
    """The ``test_*`` items of a row: a metrics row, a final heartbeat, run.json's ``test``."""
    return {key: value for key, value in row.items() if key.startswith("test_")}


CHECKPOINT_MARGIN_STEPS = 2
"""Steps beyond where an asked-for checkpoint's request is expected to have reached the last host."""


def checkpoint_at_step(step: int, steps_per_s: float, travel_s: float, log_every: int = 1) -> int:
    """The step every host saves an asked-for checkpoint at, on a run of several hosts (one rule for the
    controller's ``tpuft checkpoint``, a supervisor's maintenance notice and ``train.max_cost``): where the
    freshest host will be once the request has travelled ``travel_s`` to every trainer at ``steps_per_s``,
    plus a margin, rounded up to a multiple of ``log_every``, where every backend's loop comes back to Python
    (T5X's only there: a step in between would split its run of steps)."""
    at = step + math.ceil(max(travel_s, 0.0) * max(steps_per_s, 0.0)) + CHECKPOINT_MARGIN_STEPS
    every = max(1, int(log_every))
    return -(-at // every) * every


def read_heartbeat(storage: Any, worker: int) -> dict[str, Any] | None:
    """A worker's heartbeat as its run storage holds it (None when absent or torn)."""
    return read_json_text(storage.read_text(f"{HEARTBEAT_DIR}/worker-{worker}.json"))


CHECKPOINT_ANSWER_NAME = re.compile(r"^checkpoint-(\d+)-worker-(\d+)\.json$")


def checkpoint_answers(
    storage: Any, attempt: int, request_id: str | None = None, listing: list[str] | None = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """request id -> worker -> its trainer's answer (:func:`checkpoint_ack`; torn ones skipped), from one
    listing of the attempt's folder (``listing``: the one the caller made already); only ``request_id``'s with
    one given. The one reader of the answers: the controller's wait and its step choice, the maintenance
    asks."""
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for relpath in storage.list(f"{ATTEMPTS_DIR}/{attempt}") if listing is None else listing:
        match = CHECKPOINT_ANSWER_NAME.match(relpath.rpartition("/")[2])
        if match is None or (request_id is not None and match[1] != request_id):
            continue
        answer = read_json_text(storage.read_text(checkpoint_ack(attempt, match[1], int(match[2]))))
        if answer is not None:
            found.setdefault(match[1], {})[int(match[2])] = answer
    return found


def final_test(storage: Any, workers: int) -> dict[str, Any]:
    """The test evaluation as the finished trainers' final heartbeats carry it (every process that beats has
    the row): run.json's ``test``, so that ``runs`` and a summary need not read metrics.jsonl. The first
    heartbeat there is decides (reads one small file when all is well)."""
    for worker in range(workers):
        beat = read_heartbeat(storage, worker)
        if beat is not None:
            return test_items(beat)
    return {}


BEST_METRICS = (
    ("eval_exact_match", max),
    ("eval_accuracy", max),
    ("eval_token_accuracy", max),
    ("eval_loss", min),
    ("eval_bleu", max),
    ("eval_rouge_l", max),
)
"""Which eval metric ranks a run's evaluations, in order of preference, and whether higher or lower is better:
shared by monitor, runs and pull (the controller) and a trainer keeping its best checkpoint (the worker). BLEU
and ROUGE-L (0-100, from greedy decodes) come last: they rank a run only when its recipe asks
(``eval.metric``, see ``tpuft.worker.selection``), since an evaluation that has them also has a loss."""


def _ranking(metric: str | None) -> tuple[tuple[str, Any], ...]:
    """BEST_METRICS, or only the recipe's ``eval.metric`` when it names one: a run whose trainer kept the best
    checkpoint by BLEU is ranked by BLEU here too, not by the exact match its evaluations also report."""
    if metric is None:
        return BEST_METRICS
    return tuple(entry for entry in BEST_METRICS if entry[0] == f"eval_{metric}") or BEST_METRICS


def best_eval_metric(row: dict[str, Any], metric: str | None = None) -> tuple[str, float, int] | None:
    for name, _ in _ranking(metric):
        if isinstance(row.get(name), (int, float)):
            return name, float(row[name]), int(row.get("step", 0))
    return None


def best_eval_row(eval_rows: list[dict[str, Any]], metric: str | None = None) -> dict[str, Any]:
    """The best evaluation by ``metric`` (the recipe's ``eval.metric``; None: the default order of
    BEST_METRICS)."""
    for name, pick in _ranking(metric):
        rows = [r for r in eval_rows if isinstance(r.get(name), (int, float))]
        if rows:
            return pick(rows, key=lambda r: r[name])
    return {}


def recipe_metric(recipe_text: str | None) -> str | None:
    """The ``eval.metric`` of a run's recipe.yaml (None: none set, or no readable recipe): what its trainer
    ranked by."""
    if not recipe_text:
        return None
    import yaml

    try:
        loaded = yaml.safe_load(recipe_text)
    except yaml.YAMLError:
        return None
    metric = ((loaded or {}).get("eval") or {}).get("metric") if isinstance(loaded, dict) else None
    return metric if isinstance(metric, str) else None
