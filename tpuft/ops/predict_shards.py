"""The shards of a ``tpuft predict`` job, from the controller: where they go, the rules of an existing OUT
(refused unless ``--resume`` of the same job or ``--overwrite``), the progress read from the parts written,
and the join into OUT. Shared by ``--local`` (:mod:`tpuft.ops.predict`) and the cluster
(:mod:`tpuft.ops.predict_launch`)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuft.core.errors import UsageError
from tpuft.run.predict_job import JOB_FILE, PredictJob
from tpuft.storage import open_storage

SHARDS_SUFFIX = ".shards"

Progress = Callable[[int, int], None]
"""(examples done, examples in all): called now and then while the job runs."""


def absolute(url: str) -> str:
    return url if url.startswith("gs://") else str(Path(url).expanduser().resolve())


def default_shards(output: str) -> str:
    """Beside OUT: ``OUT.shards``."""
    return absolute(output) + SHARDS_SUFFIX


def storage_shards(run_storage: str, output: str) -> str:
    """For workers that cannot write where OUT is (a local OUT, SSH workers): a folder of the run storage
    named by OUT, so that the same OUT finds the same shards again (``--resume``)."""
    key = hashlib.sha256(absolute(output).encode()).hexdigest()[:16]
    return f"{run_storage.rstrip('/')}/predict/{key}{SHARDS_SUFFIX}"


def output_exists(url: str, project: str | None = None) -> bool:
    if not url.startswith("gs://"):
        return Path(url).exists()
    parent, _, name = url.rpartition("/")
    return open_storage(parent, project=project).exists(name)


def claim_output(
    job: PredictJob, output: str, *, resume: bool, overwrite: bool, project: str | None = None
) -> int:
    """Apply the rules of an existing OUT and shards, then record ``job`` in its shards folder. Returns how
    many finished shards an earlier job left (kept under ``--resume``)."""
    if resume and overwrite:
        raise UsageError("--resume keeps an earlier job's shards and --overwrite removes them: give one")
    shards = open_storage(job.shards, project=project)
    recorded = shards.read_text(JOB_FILE)
    done = kept_shards(shards)
    if overwrite:
        _remove_shards(job.shards, project)
        done = 0
    elif resume:
        if recorded is not None:
            try:
                earlier = PredictJob.from_json(recorded)
            except (ValueError, TypeError) as exc:
                raise UsageError(
                    f"{job.shards}/{JOB_FILE} is not a predict job ({exc}): --overwrite to start over"
                ) from None
            differ = earlier.same_work(job)
            if differ:
                raise UsageError(
                    f"--resume: {job.shards} holds another job's shards ({', '.join(differ)} differ); "
                    "give the same source, input and settings, or --overwrite to start over"
                )
        elif output_exists(output, project):
            raise UsageError(
                f"{output} exists and no shards of the job that wrote it are left to resume",
                hint="Predict it again: --overwrite",
            )
    elif recorded is not None or output_exists(output, project):
        what = output if output_exists(output, project) else f"{job.shards} (an unfinished job's shards)"
        raise UsageError(
            f"{what} exists",
            hint="Keep its finished shards and predict the rest: --resume   Start over: --overwrite",
        )
    shards.write_text(JOB_FILE, job.to_json())
    return done


def _remove_shards(url: str, project: str | None) -> int:
    parent, _, name = url.rstrip("/").rpartition("/")
    return open_storage(parent or "/", project=project).remove_tree(name)


def finished_shards(shards: Any) -> dict[int, int]:
    """shard index -> how many process parts of it are written, from one listing of the shards folder."""
    parts: dict[int, int] = {}
    for rel in shards.list():
        folder, _, name = rel.rpartition("/")
        shard = folder.rsplit("/", 1)[-1]
        if shard.startswith("shard-") and name.startswith("predictions-") and name.endswith(".jsonl"):
            index = int(shard.removeprefix("shard-"))
            parts[index] = parts.get(index, 0) + 1
    return parts


def kept_shards(shards: Any) -> int:
    """Shards every process of an earlier job has written its part of (a resume skips them)."""
    from tpuft.run.predict_parts import PROCESSES_FILE

    try:
        processes = int(json.loads(shards.read_text(PROCESSES_FILE) or "{}").get("processes") or 0)
    except (ValueError, AttributeError):
        processes = 0
    parts = finished_shards(shards)
    return sum(1 for count in parts.values() if count >= max(processes, 1)) if processes else 0


def examples_done(job: PredictJob, parts: dict[int, int]) -> int:
    """Examples in the parts written so far: every part of a shard holds about an equal share of its lines
    (line ``i`` goes to process ``i % processes``); the processes are as many as the most parts any shard
    has."""
    total = job.total_lines or 0
    processes = max(parts.values(), default=1)
    done = 0
    for index, count in parts.items():
        lines = max(0, min(job.shard_lines, total - index * job.shard_lines))
        done += lines if count >= processes else lines * count // processes
    return min(done, total)


class ProgressWatch:
    """Reads the shards folder every ``every`` seconds in the background and reports the examples done."""

    def __init__(
        self, job: PredictJob, progress: Progress | None, project: str | None = None, every: float = 2.0
    ) -> None:
        self.job, self.progress, self.every = job, progress, every
        self._store = open_storage(job.shards, project=project)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tpuft-predict-progress", daemon=True)

    def __enter__(self) -> ProgressWatch:
        if self.progress is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.report()

    def report(self) -> None:
        if self.progress is None:
            return
        try:
            done = examples_done(self.job, finished_shards(self._store))
        except Exception:  # noqa: BLE001 - a listing that failed once (a bucket hiccup): the next one will tell
            return
        self.progress(done, self.job.total_lines or 0)

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            self.report()


def join_output(job: PredictJob, output: str) -> dict[str, Any]:
    """Every shard's parts into OUT, in input order (streamed: one shard in memory at a time), and the
    scores."""
    from tpuft.run import predict_parts

    summary = predict_parts.join(job, output=output)
    return {**summary, "scores": summary.get("scores") or {}}
