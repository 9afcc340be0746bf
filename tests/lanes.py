"""The suite's order, and its lanes when asked for: ``pytest -n 2 --dist loadfile --no-loadscope-reorder``
runs it in two processes, so a test that waits (a rig's poll, a hang timeout, a venv build's lock) leaves its
CPU to the other lane. Not the default: on 2 cores the recovery rig's preempted-spot test timed out beside
another rig (pyproject.toml's addopts run one process, in this same order).

A test module runs whole in one lane (``loadfile``), so its fixtures (a trained quickstart, a rig, a venv
process) are made once, as they are without lanes. The lanes take the modules in the order of the collection,
which this module sets:
- the modules with only quick tests first, in their usual order (a mistake shows in minutes, while the backend
  venvs build in the background);
- then every module with a slow test, the longest first: a lane that ends its last module while the other
  starts a ten-minute training would wait that long, so the long ones go while the short ones can still fill
  the other lane.

(``--dist loadgroup`` with a group per module and speed would let a module's quick tests go first too, but
pytest-xdist 3.8 cannot rename pytest 9's node ids, which that mode needs: every test became its own group.)

``SLOW_MODULES_LONGEST_FIRST`` is the order the slow modules took on CI's 2 cores (their minutes, measured on
the run of 2026-11-28, in the comments); a slow module not listed goes after them, in its usual order. It
decides only the order, never what runs: ``pytest -n 0`` (or ``-p no:xdist``) runs the same tests in one
process.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

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


def lay_out(items: list[pytest.Item], longest_first: Sequence[str] = SLOW_MODULES_LONGEST_FIRST) -> None:
    """Order ``items`` in place: the quick modules first, then the modules with a slow test, the longest
    first; a module's tests stay together and in their order."""
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
        return slow, rank(module) if slow else 0, first_seen[module]

    items.sort(key=key)  # stable: a module's tests keep their order
