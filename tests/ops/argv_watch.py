"""Watching every process's argv (what ``ps`` shows any user of a worker) for a secret while tpuft runs commands:
the check that the cluster file's ``worker_env`` travels as environment (stdin over SSH, the process environment on
the local pod) and never on a command line. Used by tests/ops/test_worker_env.py and tests/ops/test_agent.py."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType


class ArgvWatch:
    """While in use, scans /proc/*/cmdline for ``secret`` (``in_argv`` lists where it was seen) and notes whether a
    process whose argv holds ``probe`` ran meanwhile (``saw_probe``: the scan overlapped the commands it judges)."""

    def __init__(self, secret: str, probe: str) -> None:
        self.secret = secret.encode()
        self.probe = probe.encode()
        self.in_argv: list[str] = []
        self.saw_probe = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._done.wait(0.05):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if self.secret in argv:
                    self.in_argv.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
                if self.probe in argv:
                    self.saw_probe = True
