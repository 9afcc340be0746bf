"""Watching every process's argv (what ``ps`` shows any user of a worker) for a secret while tpuft runs
commands: the check that the cluster file's ``worker_env`` travels as environment (stdin over SSH, the process
environment on the local pod) and never on a command line. Used by tests/ops/test_worker_env.py,
tests/ops/test_agent.py and the recovery rig test (tests/e2e/test_recovery_rigs.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType


class ArgvWatch:
    """While in use, scans /proc/*/cmdline for ``secret`` (``in_argv`` lists where it was seen) and notes
    whether a process whose argv holds ``probe`` ran meanwhile (``saw_probe``: the scan overlapped the
    commands it judges) and whether such a process had the secret in its environment (``probe_had_secret``: it
    did arrive)."""

    def __init__(self, secret: str, probe: str, *, interval: float = 0.05) -> None:
        """``interval``: seconds between scans (a long run's watch scans less often, to leave the CPU to
        it)."""
        self.secret = secret.encode()
        self.interval = interval
        self.probe = probe.encode()
        self.in_argv: list[str] = []
        self.saw_probe = False
        self.probe_had_secret = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> ArgvWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def __enter__(self) -> ArgvWatch:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
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
                    try:
                        self.probe_had_secret |= self.secret in (entry / "environ").read_bytes()
                    except OSError:
                        continue
