"""logs: print a run's worker logs, one worker or all of them interleaved in time order, and follow them live.

Each worker's supervisor writes ``logs/worker-N.log`` with every line stamped with the time it arrived. A
local run's logs are in its run dir as they are written. A bucket run's logs are uploaded every 15 s while it
trains (and at the end); ``tpuft attach`` reads them live from the workers instead. Following stops once the
run has ended and every log has been read to its end.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.core.records import SliceLayout
from tpuft.fleet.spec import parse_one_worker
from tpuft.readers.monitor import run_layout
from tpuft.readers.runs import resolve_run
from tpuft.run import rundir
from tpuft.storage import Storage, open_storage

LOCAL_POLL_SECONDS = 0.5
BUCKET_POLL_SECONDS = 5.0


@dataclass(frozen=True)
class LogLine:
    worker: int
    stamp: str | None
    """ISO UTC arrival time (None in logs written before lines were stamped)."""
    text: str

    def render(self, *, prefix: bool, timestamps: bool, layout: SliceLayout | None = None) -> str:
        """``[w5]``, or ``[w5 1:1]`` (slice 1 host 1) on a multislice run: the flat number stays first, as
        tools that parse ``[wN]`` expect."""
        where = f" {layout.ref(self.worker)}" if layout is not None and layout.slices > 1 else ""
        head = f"[w{self.worker}{where}] " if prefix else ""
        when = f"{self.stamp} " if timestamps and self.stamp else ""
        return f"{when}{head}{self.text}"


@dataclass
class LogSource:
    """One worker's log, read from a byte offset on (a local file, or an object through the storage layer)."""

    worker: int
    read_from: Callable[[int], bytes]
    offset: int = 0
    partial: bytes = b""
    lines: list[LogLine] = field(default_factory=list)

    def poll(self) -> list[LogLine]:
        """The complete lines written since the last poll (a line still being written waits for its
        newline)."""
        data = self.read_from(self.offset)
        self.offset += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        return [parse_line(self.worker, chunk) for chunk in chunks]

    def flush(self) -> list[LogLine]:
        rest, self.partial = self.partial, b""
        return [parse_line(self.worker, rest)] if rest else []


def parse_line(worker: int, raw: bytes) -> LogLine:
    stamp, text = rundir.split_log_stamp(raw)
    return LogLine(worker, stamp, text.decode("utf-8", "replace").rstrip("\r"))


@dataclass
class RunLogs:
    run_id: str
    run: Path | str
    sources: dict[int, LogSource]
    is_running: Callable[[], bool]
    poll_seconds: float
    where: str
    """Where the logs are read from (for the header line)."""
    folder: Path | None = None
    """A local log folder to rescan for workers whose log appears later (None: a bucket, or one worker asked
    for)."""
    layout: SliceLayout | None = None
    """The run's slices (for the ``[w5 1:1]`` prefixes); None: one slice."""


def open_run_logs(config: ClusterConfig, run_id: str | None, worker: str | int | None = None) -> RunLogs:
    """``worker``: ``--worker``, a flat index or ``S:I`` (slice S, host I of the run's slices)."""
    run = resolve_run(config, run_id)

    def is_running() -> bool:
        return run.info().get("status", "running") == "running"  # {} while run.json is rewritten: look again

    if not run.remote:
        live = run.mirror / rundir.LOGS_DIR
        sources = (
            {w: LogSource(w, _file_reader(path)) for w, path in _worker_files(live)} if live.is_dir() else {}
        )
        where, poll = str(live), LOCAL_POLL_SECONDS
    else:
        store = open_storage(f"{run.url}/{rundir.LOGS_DIR}", project=run.project)
        found = sorted(
            (int(m.group(1)), rel) for rel in store.list("") for m in [rundir.LOG_NAME.match(rel)] if m
        )
        sources = {w: LogSource(w, _object_reader(store, rel)) for w, rel in found}
        where, poll = f"{run.url}/{rundir.LOGS_DIR}", BUCKET_POLL_SECONDS
    layout = run_layout(run.info(), max(sources, default=-1) + 1)
    if worker is not None:
        index = _one_worker(str(worker), layout)
        if index not in sources:
            have = ", ".join(layout.ref(w) for w in sorted(sources)) or "none yet"
            raise UsageError(f"run {run.id}: no log for {layout.name(index)} (workers with logs: {have})")
        sources = {index: sources[index]}
    folder = Path(where) if worker is None and poll == LOCAL_POLL_SECONDS else None
    return RunLogs(
        run.id, run.url, sources, is_running, poll, where, folder, layout if layout.slices > 1 else None
    )


def _one_worker(spec: str, layout: SliceLayout) -> int:
    """A flat index is looked up among the logs as it is (a run may have more logs than run.json says);
    ``S:I`` is read against the run's slices."""
    if ":" in spec:
        return parse_one_worker(spec, layout)
    try:
        return int(spec)
    except ValueError:
        return parse_one_worker(spec, layout)  # words the refusal as every --worker does


def _worker_files(folder: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(m.group(1)), p) for p in folder.iterdir() for m in [rundir.LOG_NAME.match(p.name)] if m
    )


def _file_reader(path: Path) -> Callable[[int], bytes]:
    def read(offset: int) -> bytes:
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                return handle.read()
        except FileNotFoundError:
            return b""

    return read


def _object_reader(store: Storage, relpath: str) -> Callable[[int], bytes]:
    def read(offset: int) -> bytes:
        return store.read_bytes(relpath, start=offset) or b""

    return read


def in_time_order(batches: Iterable[list[LogLine]]) -> Iterator[LogLine]:
    """Merge per-worker line lists (each already in order) by arrival time; unstamped lines keep their
    place."""
    keyed = [
        [(line.stamp or "", i, n, line) for n, line in enumerate(batch)] for i, batch in enumerate(batches)
    ]
    for _, _, _, line in heapq.merge(*keyed):
        yield line


def read_all(logs: RunLogs) -> Iterator[LogLine]:
    batches = [source.poll() + source.flush() for source in logs.sources.values()]
    return in_time_order(batches)


def follow(
    logs: RunLogs, emit: Callable[[LogLine], None], *, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Print what is there, then what arrives, until the run has ended and its logs are read to the end."""
    while True:
        running = logs.is_running()
        _add_new_workers(logs)
        for line in in_time_order([source.poll() for source in logs.sources.values()]):
            emit(line)
        if not running:
            for line in in_time_order([source.flush() for source in logs.sources.values()]):
                emit(line)
            return
        sleep(logs.poll_seconds)


def _add_new_workers(logs: RunLogs) -> None:
    """Workers whose log appears after following began (a starting run gains them one by one)."""
    if logs.folder is not None and logs.folder.is_dir():
        for worker, path in _worker_files(logs.folder):
            logs.sources.setdefault(worker, LogSource(worker, _file_reader(path)))
