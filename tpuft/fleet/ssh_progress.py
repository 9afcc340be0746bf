"""What connecting a fleet over SSH tells the user: the one progress line while the handshakes are under way
(how many answered, whom they retry) and the one error for the workers that could not be reached, each by name
and the rest as ``--worker`` spans.

Apart from :mod:`tpuft.fleet.ssh` because it is about reporting, not about connections: it never touches a
socket, and its wording is tested on its own (1,024 unreachable workers need no pod to be faked).
"""

from __future__ import annotations

import threading

from tpuft.core.waiting import Wait
from tpuft.fleet.ssh_config import SshConnectError


def unreachable(failures: dict[int, SshConnectError], total: int) -> SshConnectError:
    """One error for the workers that could not be reached: each by name (the first ten in full), the first's
    hint."""
    if len(failures) == 1:
        return next(iter(failures.values()))
    ordered = [failures[index] for index in sorted(failures)]
    shown = "\n".join(f"  {error.message}" for error in ordered[:10])
    more = (
        f"\n  ... and {len(ordered) - 10} more: workers {spans(sorted(failures)[10:])}"
        if len(ordered) > 10
        else ""
    )
    return SshConnectError(
        f"{len(failures)} of {total} workers cannot be reached over SSH:\n{shown}{more}", hint=ordered[0].hint
    )


def spans(indices: list[int]) -> str:
    """Sorted worker indices as ``--worker`` writes them: ``10-19,25,30-1023``."""
    spans: list[list[int]] = []
    for index in indices:
        if spans and index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)


class Retries:
    """The handshakes under way, for the wait's one line: how many answered, and the workers being retried."""

    def __init__(self, wait: Wait, total: int) -> None:
        self.wait = wait
        self.total = total
        self.lock = threading.Lock()
        self.answered = 0
        self.retrying: dict[int, str] = {}

    def failed(self, index: int, why: str) -> None:
        with self.lock:
            self.retrying[index] = why
            self._tell()

    def connected(self, index: int) -> None:
        with self.lock:
            self.answered += 1
            self.retrying.pop(index, None)
            self._tell()

    def _tell(self) -> None:
        if not self.retrying:
            self.wait.update(f"{self.answered} of {self.total} connected")
            return
        first = min(self.retrying)
        more = f" and {len(self.retrying) - 1} more" if len(self.retrying) > 1 else ""
        self.wait.update(
            f"{self.answered} of {self.total} connected; retrying worker {first}{more} "
            f"({self.retrying[first]})"
        )
