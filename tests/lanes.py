"""The suite's order and its two lanes (pytest-xdist, ``-n 2 --dist loadfile`` in pyproject.toml's addopts).

On 2 cores the slow modules (backend venvs, trainings on a local pod of 2 host processes, the rigs) are
CPU-bound: two of them side by side each took 1.4 to 2.2 times as long as alone, and the recovery rig's
preempted spot run timed out beside another rig. The quick modules are short and wait a lot (subprocesses,
sockets, sshd). So the lanes are not symmetric (:class:`SlowLaneScheduling`):

- every module with a slow test runs in **one lane**, one after another, from the session's first second;
- the quick modules run in **the other lane** meanwhile (and in the slow one too once its modules are done), a
  module whole in one lane (``loadfile``), so its fixtures (a rig, a venv process) are made once.

The serial suite ran the quick modules first and the slow ones after them; now the quick ones fill what the
slow lane leaves idle, and a mistake still shows in minutes. The slow lane takes its modules the longest first
(``SLOW_MODULES_LONGEST_FIRST``, the minutes CI's 2 cores took on 2026-11-28, in the comments; a slow module
not listed goes after them); the venvs they need are built in the background in the order they are needed
(tests/venvs.py).

``pytest -n 0`` runs the same tests in one process, the quick modules first: the order decides only when a
test runs, never what runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

SLOW_MODULES_LONGEST_FIRST = (
    "tests/e2e/test_t5x_e2e.py",  # 10
    "tests/e2e/test_keras_e2e.py",  # 8.5
    "tests/e2e/test_quickstart.py",  # 8.3
    "tests/e2e/test_long_runs.py",  # 5.6
    "tests/e2e/test_t5x_rigs.py",  # 5.4
    "tests/worker/test_torch_features.py",  # 5
    "tests/e2e/test_recovery_rigs.py",  # 4.5
    "tests/e2e/test_gcp_rigs.py",  # 4.1
    "tests/worker/test_t5x_parts.py",  # 3.5
    "tests/worker/test_keras_eval_keys.py",  # 3
)


def module_of(item: pytest.Item) -> str:
    """The test module's path from the repository root (``tests/e2e/test_t5x_e2e.py``)."""
    return item.nodeid.split("::", 1)[0]


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def in_lanes() -> bool:
    """Whether this process is an xdist worker (a lane), not a session of one process."""
    return "PYTEST_XDIST_WORKER" in os.environ


def lay_out(
    items: list[pytest.Item],
    longest_first: Sequence[str] = SLOW_MODULES_LONGEST_FIRST,
    slow_first: bool | None = None,
) -> None:
    """Order ``items`` in place: the modules with a slow test, the longest first, and the quick modules; the
    quick ones first in one process (a mistake shows in minutes), the slow ones first in lanes (their lane
    starts with them while the other runs the quick ones). A module's tests stay together and in their
    order."""
    if slow_first is None:
        slow_first = in_lanes()
    first_seen: dict[str, int] = {}
    slow_modules: set[str] = set()
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item), index)
        if is_slow(item):
            slow_modules.add(module_of(item))

    def rank(module: str) -> int:
        return longest_first.index(module) if module in longest_first else len(longest_first)

    def key(item: pytest.Item) -> tuple[bool, int, int]:
        module = module_of(item)
        slow = module in slow_modules
        return slow != slow_first, rank(module) if slow else 0, first_seen[module]

    items.sort(key=key)  # stable: a module's tests keep their order


SLOW_LANE = "the slow lane"
"""The one xdist scope that holds every module with a slow test."""

_SLOW_MARK = re.compile(r"\bmark\.slow\b")


def marks_slow(module: Path) -> bool:
    """Whether a test module marks a test ``slow``, read from its text: xdist's controller schedules by node
    id and never collects (``tests/test_lanes.py`` holds this against the collected markers)."""
    try:
        return _SLOW_MARK.search(module.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


class SlowLaneScheduling(LoadFileScheduling):
    """``loadfile``, with every slow module in one scope (:data:`SLOW_LANE`) that goes out first: one lane
    runs the slow modules one after another, the other lane the quick modules."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        # the slow scope first, as the lanes' collection has it (lay_out), not the biggest first
        config.option.loadscopereorder = False
        self._root = Path(config.rootpath)
        self._slow: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module not in self._slow:
            self._slow[module] = marks_slow(self._root / module)
        return SLOW_LANE if self._slow[module] else module
