"""The suite in lanes: pytest-xdist runs it in two processes (``-n 2 --dist loadgroup`` in pyproject.toml), so
a test that waits (a rig's poll, a hang timeout, a maintenance window, a venv build's lock) leaves its CPU to
the test in the other lane instead of to nobody.

What goes together is a group (xdist's ``xdist_group``), and a group runs whole in one lane:
- one group per test module and speed, so a module's fixtures (a trained quickstart, a rig, a venv process)
  are made once, as they are without lanes;
- the quick groups first, in their usual order (a mistake shows in minutes, while the backend venvs build
  in the background), then the slow ones, the longest first: a lane that ends its last group while the other
  starts a ten-minute training would wait that long, so the long ones go while the short ones can still fill
  the other lane.

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


def group_of(item: pytest.Item) -> str:
    """``quick:`` or ``slow:`` and the module: a module's quick tests may run in the other lane than its slow
    ones (a quick test's module fixtures are cheap by definition; the slow ones stay together)."""
    return f"{'slow' if is_slow(item) else 'quick'}:{module_of(item)}"


def slow_rank(item: pytest.Item, longest_first: Sequence[str] = SLOW_MODULES_LONGEST_FIRST) -> int:
    module = module_of(item)
    return longest_first.index(module) if module in longest_first else len(longest_first)


def lay_out(items: list[pytest.Item]) -> None:
    """Order ``items`` in place (quick first, then slow, the longest modules first; otherwise as collected)
    and mark each with its group."""
    items.sort(key=lambda item: (is_slow(item), slow_rank(item) if is_slow(item) else 0))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
