"""Where the suite's CPU goes, test by test, when ``TPUFT_TEST_CPU_LOG`` names a file: one JSON line per test
with its lane, start, wall seconds and the machine's busy share of its cores meanwhile (from /proc/stat, so
the other lane and every child process count). Which tests wait (a rig's poll, a hang timeout) and which fill
the cores decides what can run beside what (tests/lanes.py); off by default, and a machine without /proc/stat
logs nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores since boot, or None without /proc/stat."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    target = os.environ.get("TPUFT_TEST_CPU_LOG")
    before = cpu_times() if target else None
    started = time.time()
    yield
    after = cpu_times() if before is not None else None
    if target is None or before is None or after is None:
        return
    busy, total = after[0] - before[0], after[1] - before[1]
    row = {
        "test": item.nodeid,
        "lane": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "start": round(started, 1),
        "wall_s": round(time.time() - started, 2),
        "busy": round(busy / total, 3) if total else None,
    }
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
