"""A predict job's parts, in its ``shards`` folder (local, or a ``gs://`` prefix): the folder's names, reading
and writing it, waiting for every process's parts, and :func:`join`, which streams the finished parts into the
output in input order and sums their scores. The shard loop that writes the parts runs on the workers
(:mod:`tpuft.worker.predict.loop`, where the resume and lock-step rules are); the controller joins the parts
itself when OUT is where only it can write (:mod:`tpuft.ops.predict_shards`) and reads :func:`joined` after a
detached job, so this module is shared by both sides and imports neither.

The layout:

* ``processes.json``: how many processes write parts. A resume with another count would read half a shard as
  whole, so it is refused (the same workers, or ``--overwrite``).
* ``shard-<k:06d>/stats-<p:05d>.json``, then ``shard-<k:06d>/predictions-<p:05d>.jsonl``: process ``p``'s part
  of shard ``k`` (:func:`tpuft.scoring.predictions.shard_name`) and its summable statistics; the part is
  written last and whole, so a part under its name is finished. A shard is finished when every process's part
  is there.
* ``done-<p:05d>.json``: process ``p`` has every part of every shard (how many shards and records there are).
* ``joined.json``: process 0's summary of the join, once OUT is whole.
"""

from __future__ import annotations

import heapq
import json
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError
from tpuft.run.predict_job import PredictJob
from tpuft.scoring import predictions

PROCESSES_FILE = "processes.json"
JOINED_FILE = "joined.json"
"""Written by process 0 once OUT is whole: a detached job's OUT needs no controller to join it."""
JOIN_WAIT_S = 1800.0
"""How long worker 0 waits for the other processes' parts before joining: they run in step with it, or
nearly."""


def shard_folder(k: int) -> str:
    return f"shard-{k:06d}"


def part_path(k: int, process: int) -> str:
    return f"{shard_folder(k)}/{predictions.shard_name(process)}"


def stats_path(k: int, process: int) -> str:
    return f"{shard_folder(k)}/stats-{process:05d}.json"


def done_path(process: int) -> str:
    return f"done-{process:05d}.json"


class Shards:
    """The job's shards folder through tpuft's storage: a local folder is written in place (through temp
    names), a bucket prefix gets each part uploaded whole from a local temp file."""

    def __init__(self, url: str) -> None:
        from tpuft.storage import open_storage

        self.url = url
        self.storage = open_storage(url)
        self.local = self.storage.local_root

    def names(self) -> set[str]:
        if self.local is not None and not self.local.is_dir():
            return set()
        return set(self.storage.list(""))

    def read_text(self, rel: str) -> str | None:
        return self.storage.read_text(rel)

    def write_text(self, rel: str, text: str) -> None:
        self.storage.write_text(rel, text)

    def write_rows(self, rel: str, rows: Iterable[dict[str, Any]]) -> int:
        if self.local is not None:
            return predictions.write_predictions(self.local / rel, rows)
        with tempfile.TemporaryDirectory(prefix="tpuft-part-") as tmp:
            count = predictions.write_predictions(Path(tmp) / "part.jsonl", rows)
            self.storage.upload_file(Path(tmp) / "part.jsonl", rel)
        return count

    def rows(self, rel: str) -> Iterator[dict[str, Any]]:
        if self.local is not None:
            yield from predictions.read_rows([self.local / rel])
            return
        data = self.storage.read_bytes(rel)  # one part: at most one shard's rows
        if data is None:
            raise TpuftError(f"{self.url}/{rel}: the part is gone")
        for line in data.decode("utf-8").splitlines():
            if line.strip():
                yield json.loads(line)


def wait_done(shards: Shards, *, timeout_s: float = JOIN_WAIT_S, poll_s: float = 2.0) -> dict[str, Any]:
    """The summary of process 0, once every process has written its ``done`` file."""
    deadline = time.monotonic() + timeout_s
    while True:
        names = shards.names()
        info = json.loads(shards.read_text(PROCESSES_FILE) or "{}") if PROCESSES_FILE in names else {}
        processes = info.get("processes")
        missing = [p for p in range(processes or 1) if done_path(p) not in names]
        if processes and not missing:
            return json.loads(shards.read_text(done_path(0)) or "{}")
        if time.monotonic() >= deadline:
            raise TpuftError(
                f"{shards.url}: processes {missing} did not finish their parts in {timeout_s:.0f} s"
            )
        time.sleep(poll_s)


def join(
    job: PredictJob, *, output: str | None = None, timeout_s: float = JOIN_WAIT_S, poll_s: float = 2.0
) -> dict[str, Any]:
    """Stream every shard's parts, in input order, into ``output`` (default ``job.output``; local or
    ``gs://``: written through a temp name, or uploaded once from a local temp file), one shard in memory at a
    time. Waits (up to ``timeout_s``) for every process's ``done`` file. Returns ``{"rows", "shards",
    "output", "scores"}``: the scores of the rows that had targets (:func:`tpuft.scoring.predictions.scores`),
    or None when none had."""
    target = output or job.output
    if not target:
        raise ValueError("join needs an output")
    shards = Shards(job.shards)
    summary = wait_done(shards, timeout_s=timeout_s, poll_s=poll_s)
    processes, count = int(summary["processes"]), int(summary["shards"])
    totals: list[float] | None = None
    labels: list[str] = []
    rows = 0

    def joined() -> Iterator[dict[str, Any]]:
        nonlocal totals, labels, rows
        for k in range(count):
            parts = [list(shards.rows(part_path(k, p))) for p in range(processes)]
            for p in range(processes):
                info = json.loads(shards.read_text(stats_path(k, p)) or "{}")
                if info.get("stats") is not None:
                    labels = info["labels"]
                    totals = info["stats"] if totals is None else predictions.add(totals, info["stats"])
            for item in heapq.merge(*parts, key=lambda row: int(row["id"])):
                rows += 1
                yield item
            del parts  # before the next shard's parts are read

    if target.startswith("gs://"):
        from tpuft.storage import GcsStorage

        parent, _, name = target.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="tpuft-join-") as tmp:
            predictions.write_predictions(Path(tmp) / name, joined())
            GcsStorage.from_url(parent).upload_file(Path(tmp) / name, name)
    else:
        predictions.write_predictions(Path(target).expanduser(), joined())
    return {
        "rows": rows,
        "shards": count,
        "output": target,
        "scores": predictions.scores(totals, labels) if totals is not None else None,
    }


def joined(job: PredictJob) -> dict[str, Any] | None:
    """The summary process 0 wrote once it had joined the shards into ``job.output`` (None: not joined)."""
    text = Shards(job.shards).read_text(JOINED_FILE)
    return json.loads(text) if text else None
