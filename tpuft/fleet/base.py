"""The fleet contract: run one command on many workers at once and report per worker, in worker order.

Commands are argv lists (quoted with ``shlex`` when they must become a shell string), never strings pasted
together from recipe values. A fleet streams every output line as it comes, tees each worker's output to its
own log file, and is fail-fast: the first worker to exit non-zero gets the others terminated, process group
and all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tpuft.core.errors import Interrupted, TpuftError, UsageError, WorkerFailure
from tpuft.core.records import Worker

LineSink = Callable[[int, str], None]
"""Called with (worker index, line without newline) for every output line, from reader threads."""

EnvFor = Callable[[Worker], dict[str, str]]

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""POSIX's environment variable name. The same rule as :data:`tpuft.core.formats.ENV_NAME` (which checks the
cluster file; a test keeps the two equal), written here because the fleet is a leaf and guards every other
caller."""


@dataclass
class WorkerResult:
    index: int
    exit_code: int | None
    """None when the process was stopped by tpuft (fail-fast or Ctrl-C) rather than exiting on its own."""
    seconds: float
    tail: list[str] = field(default_factory=list)
    """The last lines of its output, to show when it failed."""
    log_path: Path | None = None
    pid: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class FleetResult:
    results: list[WorkerResult]
    first_failure: int | None = None
    """Index of the worker whose failure stopped the others (fail-fast), if any."""
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r.ok for r in self.results)

    @property
    def failed(self) -> list[WorkerResult]:
        return [r for r in self.results if r.exit_code not in (0, None)]


def failure_error(result: FleetResult, what: str, *, worker_exit_code: bool = False) -> TpuftError | None:
    """The error a failed (or interrupted) fleet run is reported as; None when it went well. Here rather than
    in ``ops`` so that the warm ``exec`` path (:mod:`tpuft.ops.agent_client`) words it exactly like the cold
    one.

    ``worker_exit_code`` (``tpuft exec``): the error exits with the failing worker's own code, as ``ssh host
    cmd`` would; when several fail, the first to fail (the one that stopped the others) gives it."""
    if result.interrupted:
        stopped = ", ".join(str(r.index) for r in result.results)
        return Interrupted(f"interrupted during {what}: stopped the processes of worker(s) {stopped}")
    if result.ok:
        return None
    culprit_index = result.first_failure if result.first_failure is not None else result.failed[0].index
    culprit = next(r for r in result.results if r.index == culprit_index)
    stopped = [r.index for r in result.results if r.exit_code is None]
    lines = [f"{what} failed on worker {culprit.index} (exit code {culprit.exit_code})"]
    if stopped:
        lines.append(f"stopped the other worker(s): {', '.join(map(str, stopped))}")
    if culprit.tail:
        lines.append(f"last lines of worker {culprit.index}:")
        lines.extend("  " + line for line in culprit.tail[-15:])
    if culprit.log_path is not None:
        lines.append(f"full log: {culprit.log_path}")
    error = WorkerFailure("\n".join(lines))
    if worker_exit_code and culprit.exit_code is not None:
        error.exit_code = shell_exit_code(culprit.exit_code)
    return error


def last_json_object(lines: Iterable[str]) -> dict[str, Any] | None:
    """The last line that is a JSON object: how a tool run on a worker (or in a venv) answers, after whatever
    its libraries printed before it."""
    for line in reversed(list(lines)):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                return data
    return None


def shell_exit_code(code: int) -> int:
    """A process's return code as a shell reports it: a death by signal N (Python's -N) is 128 + N."""
    return 128 - code if code < 0 else code & 0xFF or 1


def check_env(env: dict[str, str], worker: int | None = None) -> dict[str, str]:
    """Refuse what cannot be an environment variable before it reaches a process or a remote shell line: the
    cluster file is checked when it is loaded, this guards every other caller of a fleet."""
    where = f"worker {worker}: " if worker is not None else ""
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise UsageError(f"{where}{key!r} is not an environment variable name")
        if not isinstance(value, str) or "\x00" in value:
            raise UsageError(f"{where}the value of {key} is not text without NUL characters")
    return env


def select_workers(workers: list[Worker], indices: Sequence[int] | None) -> list[Worker]:
    """The workers named by ``indices`` (all of them for None), in the order given."""
    if indices is None:
        return list(workers)
    by_index = {w.index: w for w in workers}
    return [by_index[i] for i in indices]


class Fleet(Protocol):
    workers: list[Worker]

    def run(
        self,
        argv: Sequence[str],
        *,
        env: EnvFor | None = None,
        workers: Sequence[int] | None = None,
        log_dir: Path | None = None,
        on_line: LineSink | None = None,
        fail_fast: bool = True,
        cwd_home: bool = True,
    ) -> FleetResult:
        """Run ``argv`` on the chosen workers (all by default) in parallel; returns when all have ended."""
        ...

    def put(self, source: Path, dest: str, *, workers: Sequence[int] | None = None) -> None:
        """Copy a file or folder to ``dest`` on each worker (relative paths are under the worker's HOME)."""
        ...
