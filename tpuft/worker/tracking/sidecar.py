"""The tracker sidecar: ``python -m tpuft.worker.tracking.sidecar``, run by the chief's supervisor in the
tracking venv.

It tails the run's ``metrics.jsonl`` (every backend writes it: train rows at each log step, eval rows, the one
test row) and forwards each row to the trackers the recipe's ``report.to`` names (W&B, MLflow): the metrics at
their step, the resolved recipe as the run's config, tags (backend, accelerator, run id), and at the end the
test metrics as the summary and a table of prediction samples. Why a separate process and not the trainer: a
tracker's network calls never slow or crash training, and its packages never meet a backend's pins.

Its state is ``tracking.json`` in the run dir (each tracker's run id and the last step it has of each kind of
row), written after every batch it sends: a resumed or recovered run continues the SAME W&B and MLflow runs
and never sends a row twice (a resumed trainer logs the steps after its checkpoint anew; the trackers keep the
first attempt's values for those). Any tracker failure is a warning on stdout (the supervisor writes it into
the chief's log) and in ``logs/tracking.log``; the tracker is retried with a growing pause and given up after
a few failures in a row. The sidecar's exit status never reaches training's.

The supervisor asks it to end by writing ``tracking-stop.json`` (the trainer's outcome) into the run dir; it
then sends what is left, the summary and the samples, closes the trackers' runs with that outcome, and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpuft.run import rundir
from tpuft.scoring.predictions import merged, read_rows
from tpuft.worker.tracking.sinks import make_sinks, numeric

STATE = rundir.TRACKING
STOP = rundir.TRACKING_STOP
LOG = "logs/tracking.log"
RETRY_SECONDS = (10.0, 30.0, 60.0, 120.0, 300.0)
"""The pause after a tracker's 1st, 2nd, ... failure in a row; after the last one it is given up."""


def warn(message: str) -> None:
    """A warning: on stdout (the chief's log, through the supervisor) and in the sidecar's own log."""
    print(f"[tracking] WARNING: {message}", flush=True)
    logging.getLogger("tpuft.tracking").warning(message)


def say(message: str) -> None:
    print(f"[tracking] {message}", flush=True)
    logging.getLogger("tpuft.tracking").info(message)


class MetricsTail:
    """The whole rows ``metrics.jsonl`` gained since the last call. A resumed trainer rewrites the file
    shorter (its rows after the checkpoint dropped): then it is read again from the start, and the trackers'
    step marks skip what they have."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_rows(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        rows = []
        for line in whole.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
        return rows


def signature(row: dict[str, Any]) -> str:
    """What kind of row this is (its metric names): a train row, an eval row, a second eval row at the same
    step with other metrics (one backend writes its loss and its decoded scores apart), the test row."""
    return ",".join(sorted(numeric(row)))


def unsent(rows: list[dict[str, Any]], marks: dict[str, int]) -> Iterator[dict[str, Any]]:
    """The rows a tracker has not got: later than the last step it has of their kind. Updates ``marks``."""
    for row in rows:
        kind = signature(row)
        if kind and row["step"] > marks.get(kind, -1):
            marks[kind] = row["step"]
            yield row


def read_state(run_dir: Path) -> dict[str, Any]:
    return rundir.read_json(run_dir / STATE) or {}


def write_state(run_dir: Path, state: dict[str, Any], written: str = "") -> str:
    """Write ``tracking.json`` when it changed since ``written`` (what the last call returned): a file
    rewritten every poll would go up to a ``gs://`` run dir at every sync round."""
    text = json.dumps(state, indent=2, sort_keys=True)
    if text != written:
        rundir.write_json_atomic(run_dir / STATE, state)
    return text


def samples(run_dir: Path, limit: int) -> tuple[str, list[dict[str, Any]]]:
    """(where from, rows) for the samples table: the test predictions, else the last evaluation's decodes."""
    if limit <= 0:
        return "", []
    test = sorted((run_dir / rundir.TEST_DIR).glob("predictions-*.jsonl"))
    evals = sorted((run_dir / "eval").glob("predictions-*.jsonl"))
    if test:  # written whole (through a temp file), in input order once merged
        rows = merged(run_dir / rundir.TEST_DIR)
        return ("test" if rows else ""), rows[:limit]
    rows = list(read_rows(evals[-1:]))
    return ("eval" if rows else ""), rows[:limit]


class Guarded:
    """One tracker, kept from hurting the others or the sidecar: every call that raises is a warning and a
    pause before the next try; after ``RETRY_SECONDS`` run out, the tracker is given up."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.failures = 0
        self.next_try = 0.0
        self.given_up = False

    def call(self, what: str, *args: Any) -> bool:
        if self.given_up or time.monotonic() < self.next_try:
            return False
        try:
            getattr(self.sink, what)(*args)
        except Exception as exc:  # any tracker error is a warning, never the sidecar's end
            self.failures += 1
            if self.failures > len(RETRY_SECONDS):
                self.given_up = True
                warn(
                    f"{self.sink.name}: {what} failed ({type(exc).__name__}: {_short(exc)}); giving up on "
                    f"{self.sink.name} after {self.failures} failures in a row (training goes on; "
                    "metrics.jsonl has every row)"
                )
            else:
                pause = RETRY_SECONDS[self.failures - 1]
                self.next_try = time.monotonic() + pause
                warn(
                    f"{self.sink.name}: {what} failed ({type(exc).__name__}: {_short(exc)}); retrying in "
                    f"{pause:.0f} s"
                )
            logging.getLogger("tpuft.tracking").debug("%s.%s failed", self.sink.name, what, exc_info=True)
            return False
        self.failures = 0
        return True


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


class Sidecar:
    def __init__(self, run_dir: Path, run_id: str, accelerator: str, poll: float) -> None:
        self.run_dir = run_dir
        self.poll = poll
        self.state = read_state(run_dir)
        recipe = _read_recipe(run_dir)
        report = recipe.get("report") or {}
        self.samples = int(report.get("samples", 20))
        backend = str((recipe.get("backend") or {}).get("kind", ""))
        context = {
            "run_dir": run_dir,
            "run_id": run_id,
            "recipe": recipe,
            "report": report,
            "tags": {"backend": backend, "accelerator": accelerator, "run_id": run_id},
        }
        self.trackers = [Guarded(sink) for sink in make_sinks(report.get("to") or [], context, self.state)]
        self.tail = MetricsTail(run_dir / rundir.METRICS)
        self.pending: list[dict[str, Any]] = []
        """The rows read and not yet sent to every live tracker (each tracker's marks pick its own): one that
        failed gets them when it recovers."""
        self.written = ""
        self.test: dict[str, Any] = {}
        """The test row's ``test_*`` items, once it has been read."""
        self.terminated = False

    def pass_once(self) -> None:
        self.pending += self.tail.new_rows()
        for tracker in self.trackers:
            if not tracker.sink.started and not tracker.call("start"):
                continue
            mine = self.state.setdefault(tracker.sink.name, {})
            marks = dict(mine.get("marks") or {})
            rows = list(unsent(self.pending, marks))
            if rows and tracker.call("send", rows):
                mine.update(tracker.sink.where(), marks=marks, rows=int(mine.get("rows", 0)) + len(rows))
            elif not rows:
                mine.update(tracker.sink.where())
        self._forget_sent()
        self.written = write_state(self.run_dir, self.state, self.written)

    def _forget_sent(self) -> None:
        """Keep only the rows some live tracker still lacks (a week-long run's rows are not held twice)."""
        for row in self.pending:
            if rundir.test_items(row):
                self.test = rundir.test_items(row)
        live = [
            dict(self.state.get(t.sink.name, {}).get("marks") or {}) for t in self.trackers if not t.given_up
        ]
        self.pending = [
            row for row in self.pending if any(row["step"] > marks.get(signature(row), -1) for marks in live)
        ]

    def finish(self, outcome: str) -> None:
        self.pass_once()
        source, rows = samples(self.run_dir, self.samples)
        for tracker in self.trackers:
            if not tracker.sink.started:
                tracker.next_try = 0.0
                if not tracker.call("start"):
                    continue
            tracker.next_try = 0.0
            tracker.call("finish", outcome, self.test, source, rows)
            self.state.setdefault(tracker.sink.name, {}).update(tracker.sink.where(), outcome=outcome)
        self.written = write_state(self.run_dir, self.state, self.written)

    def run(self) -> int:
        names = ", ".join(t.sink.name for t in self.trackers) or "nothing"
        say(f"forwarding {rundir.METRICS} to {names} (state in {STATE}, log in {LOG})")
        while True:
            stop = rundir.read_json(self.run_dir / STOP)
            if stop is not None or self.terminated:
                outcome = str((stop or {}).get("status") or "killed")
                self.finish(outcome)
                sent = ", ".join(
                    f"{t.sink.name} {self.state.get(t.sink.name, {}).get('rows', 0)} rows"
                    for t in self.trackers
                )
                say(f"done ({outcome}): {sent}")
                return 0
            self.pass_once()
            time.sleep(self.poll)


def _read_recipe(run_dir: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load((run_dir / rundir.RECIPE).read_text())
    except (FileNotFoundError, yaml.YAMLError) as exc:
        warn(f"cannot read {rundir.RECIPE}: {exc}")
        return {}
    return data if isinstance(data, dict) else {}


def _quiet_trackers(run_dir: Path) -> None:
    """Trackers' own chatter to the sidecar's log file; their HTTP retries short (the sidecar retries
    itself)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_GIT", "true")
    (run_dir / LOG).parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=str(run_dir / LOG),
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.captureWarnings(True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tpuft.worker.tracking.sidecar", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--accelerator", default="")
    parser.add_argument(
        "--poll", type=float, default=float(os.environ.get("TPUFT_TRACKING_POLL_SECONDS", "5"))
    )
    args = parser.parse_args(argv)
    _quiet_trackers(args.run_dir)
    sidecar = Sidecar(args.run_dir, args.run_id, args.accelerator, args.poll)

    def on_signal(signum: int, frame: object) -> None:
        sidecar.terminated = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return sidecar.run()
    except Exception as exc:  # the sidecar's end is never training's; the trace is in its log
        logging.getLogger("tpuft.tracking").exception("the tracking sidecar failed")
        warn(f"the tracking sidecar stopped: {type(exc).__name__}: {_short(exc)} (training goes on)")
        return 0


if __name__ == "__main__":
    sys.exit(main())
