"""The shard loop of ``tpuft predict``, shared by every backend's engine: read the input once, cut it into
shards, predict this process's part of each shard in length-sorted batches, write the part whole; then, on
process 0, the join (:func:`tpuft.run.predict_parts.join`, which streams the finished parts into the output in
input order and sums their scores). The shards folder's layout, and the join that the controller may run too,
are in :mod:`tpuft.run.predict_parts`.

Resume: a shard that is finished is skipped by every process; one that is not is redone by every process (a
killed job's half-written shard is predicted again, its stale parts overwritten). Every process decides from
one listing made before it predicts anything. Its decisions agree with the others': for a lock-step engine a
process cannot finish a part before every process has started, and no part is written twice in one job.

Lock-step: an engine may compute in SPMD, where every process must call its step the same number of times.
Every process knows each shard's length, so each calls ``engine.predict`` ``ceil(ceil(n / processes) /
batch_size)`` times for a shard of ``n`` records, with fewer inputs (or none) once its own part is done.

Engines import their framework lazily: this module is stdlib (and tpuft's storage for ``gs://``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.core.errors import TpuftError, UsageError
from tpuft.data.predict_input import Record, cache_folder, fields_for, records
from tpuft.run.predict_job import Engine, PredictJob
from tpuft.run.predict_parts import (
    JOINED_FILE,
    PROCESSES_FILE,
    Shards,
    done_path,
    join,
    part_path,
    stats_path,
)
from tpuft.scoring import predictions


def calls_for(shard_size: int, processes: int, batch_size: int) -> int:
    """How many ``predict`` calls every process makes for a shard of ``shard_size`` records: the most any
    process needs, so that lock-step engines stay in step."""
    return math.ceil(math.ceil(shard_size / processes) / batch_size)


@dataclass
class Progress:
    """What the loop reports as it goes: a line per part, and a heartbeat (step = examples done) when it runs
    under a supervisor, whose hang check then works as it does for a trainer."""

    process: int
    total: int | None
    say: Callable[[str], None]
    heartbeat: Any = None
    done: int = 0

    @classmethod
    def of(
        cls, process: int, total: int | None, say: Callable[[str], None], run_dir: Path | None
    ) -> Progress:
        beat = None
        if run_dir is not None:
            from tpuft.worker.metrics import Heartbeat

            beat = Heartbeat(run_dir, process, total or 0)
            beat.beat(0, phase="starting")
        return cls(process, total, say, beat)

    def beat(self, phase: str = "step", status: str = "running") -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat(self.done, status=status, phase=phase)


def _shards(stream: Iterable[Record], shard_lines: int) -> Iterator[tuple[int, list[Record], int]]:
    """(k, records, size) per shard: ``size`` counts the shard's input records, dropped ones too (ids are
    input positions; every process reads the same input, so every process knows every size)."""
    shard: list[Record] = []
    k = 0
    last = -1
    for record in stream:
        while record.index >= (k + 1) * shard_lines:
            yield k, shard, shard_lines
            shard, k = [], k + 1
        shard.append(record)
        last = record.index
    if shard or last >= 0:
        yield k, shard, (last - k * shard_lines + 1)


def _part(shard: list[Record], k: int, shard_lines: int, process: int, processes: int) -> list[Record]:
    return [r for r in shard if (r.index - k * shard_lines) % processes == process]


def predict_part(engine: Engine, part: Sequence[Record], calls: int, batch_size: int) -> list[str]:
    """The part's predictions in its order, from ``calls`` calls of length-sorted batches (longest first: the
    biggest batch meets the memory limit first, and each batch pads little)."""
    order = sorted(range(len(part)), key=lambda i: len(part[i].source), reverse=True)
    out: list[str] = [""] * len(part)
    for call in range(calls):
        batch = order[call * batch_size : (call + 1) * batch_size]
        got = engine.predict([part[i].source for i in batch])
        if len(got) != len(batch):
            raise TpuftError(f"the engine gave {len(got)} predictions for {len(batch)} inputs")
        for i, prediction in zip(batch, got):
            out[i] = prediction
    if len(part) > calls * batch_size:
        raise TpuftError(f"{len(part)} records in a part, but {calls} calls of {batch_size} cover fewer")
    return out


def _check_processes(shards: Shards, names: set[str], process: int, processes: int) -> None:
    if PROCESSES_FILE in names:
        earlier = json.loads(shards.read_text(PROCESSES_FILE) or "{}").get("processes")
        if earlier != processes:
            raise UsageError(
                f"{shards.url}: these shards were written by {earlier} processes, this job has {processes}",
                hint="Resume on the same workers, or start again with --overwrite",
            )
    elif process == 0:
        shards.write_text(PROCESSES_FILE, json.dumps({"processes": processes}))


def run(
    job: PredictJob,
    engine: Engine,
    *,
    process: int = 0,
    processes: int = 1,
    recipe: Any = None,
    run_dir: Path | None = None,
    worker: int | None = None,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> dict[str, Any]:
    """Predict this process's part of every unfinished shard; returns ``{"shards", "records", "predicted",
    "skipped", "processes"}``. ``recipe``: the job's parsed recipe (parsed from ``job.recipe`` when not
    given); ``run_dir``: where the heartbeat goes (``heartbeat/worker-<worker>.json``; ``worker`` defaults to
    ``process``), when a supervisor watches."""
    if not 0 <= process < processes:
        raise ValueError(f"process {process} out of range for {processes} processes")
    if recipe is None:
        from tpuft.config import recipe_from_text

        recipe = recipe_from_text(job.recipe, "predict job recipe", check_files=False)
    labels = list(recipe.data.labels)
    shards = Shards(job.shards)
    names = shards.names()
    _check_processes(shards, names, process, processes)
    share = math.ceil(job.total_lines / processes) if job.total_lines else None  # this process's examples
    progress = Progress.of(process if worker is None else worker, share, say, run_dir)
    skipped = predicted = count = total = 0
    stream = records(job.input, fields_for(recipe.data, job.field), labels)
    for k, shard, size in _shards(stream, job.shard_lines):
        count, total = k + 1, k * job.shard_lines + size
        if all(part_path(k, p) in names for p in range(processes)):
            skipped += 1
            progress.done += len(_part(shard, k, job.shard_lines, process, processes))
            del shard
            continue
        started = time.monotonic()
        part = _part(shard, k, job.shard_lines, process, processes)
        outputs = predict_part(engine, part, calls_for(size, processes, job.batch_size), job.batch_size)
        scored = [(o, r.target) for o, r in zip(outputs, part) if r.target is not None]
        stats = (
            predictions.statistics([o for o, _ in scored], [t for _, t in scored], labels) if scored else None
        )
        shards.write_text(
            stats_path(k, process), json.dumps({"stats": stats, "labels": labels, "rows": len(part)})
        )
        shards.write_rows(
            part_path(k, process),
            (predictions.row(r.index, r.source, o, r.target) for r, o in zip(part, outputs)),
        )
        predicted += 1
        progress.done += len(part)
        seconds = max(time.monotonic() - started, 1e-9)
        say(f"[tpuft] predict shard {k}: {len(part)} examples, {len(part) / seconds:.1f} ex/s")
        progress.beat()
        del shard, part, outputs, scored  # before the next shard is read: one shard in memory, not two
    summary = {
        "shards": count,
        "records": total,
        "predicted": predicted,
        "skipped": skipped,
        "processes": processes,
    }
    shards.write_text(done_path(process), json.dumps(summary))
    progress.beat(phase="collective")
    return summary


RESULT_PREFIX = "[tpuft] predict result "
"""The chief's last line: the join's summary as JSON, for the controller."""


def model_folder(url: str) -> Path:
    """The job's model as a folder on this machine: itself, or a ``gs://`` prefix's cached download (files
    already there and intact are skipped, so a resumed job does not fetch them again)."""
    if not url.startswith("gs://"):
        return Path(url).expanduser()
    from tpuft.storage import GcsStorage

    folder = cache_folder(url)
    if GcsStorage.from_url(url.rstrip("/")).fetch_tree("", folder).files == 0:
        raise UsageError(f"{url}: no model there (no objects under that prefix)")
    return folder


def serve(
    job: PredictJob,
    engine: Engine,
    *,
    process: int,
    processes: int,
    recipe: Any,
    run_dir: Path | None = None,
    worker: int | None = None,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> int:
    """What every engine's ``main`` does with its engine: :func:`run`, then on process 0, when the job names
    an output, :func:`join` and the result line. The engine is closed either way."""
    try:
        run(
            job,
            engine,
            process=process,
            processes=processes,
            recipe=recipe,
            run_dir=run_dir,
            worker=worker,
            say=say,
        )
    finally:
        engine.close()
    if process == 0 and job.output:
        result = join(job)
        Shards(job.shards).write_text(JOINED_FILE, json.dumps(result, sort_keys=True))  # after OUT is whole
        say(RESULT_PREFIX + json.dumps(result, sort_keys=True))
    return 0
