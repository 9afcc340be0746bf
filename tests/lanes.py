"""The suite's order and its two lanes (pytest-xdist, ``-n 2 --dist loadfile`` in pyproject.toml's addopts).

Most slow modules (trainings on a local pod of 2 host processes, the rigs) fill both cores: two of them side
by side each took 1.4 to 2.2 times as long as alone, and the recovery rig's preempted spot run timed out
beside another rig. The quick modules are short and wait a lot (subprocesses, sockets, sshd), and some slow
modules leave a core idle (:data:`SIDE_MODULES`: the Keras backend traces and decodes on one thread). So the
lanes are not symmetric (:class:`SlowLaneScheduling`):

- the slow modules run in **one lane**, one after another, from the session's first second, the longest first
  (``SLOW_MODULES_LONGEST_FIRST``, the minutes of the CI-like run of 2026-11-29 in the comments; a slow module
  not listed goes after them);
- **the other lane** runs the quick modules meanwhile, then the side modules;
- a module runs whole in one lane (``loadfile``), so its fixtures (a rig, a venv process) are made once, and
  the venvs the slow modules need are built in the background in the order they are needed (tests/venvs.py).

Which module waits and which fills the cores is measured, not guessed: ``TPUFT_TEST_CPU_LOG=FILE`` logs each
test's lane, wall time and the machine's busy share (tests/cpu_log.py). ``pytest -n 0`` runs the same tests in
one process, the quick modules first: the order decides only when a test runs, never what runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

SLOW_MODULES_LONGEST_FIRST = (
    "tests/e2e/test_t5x_e2e.py",  # 9.3
    "tests/e2e/test_keras_e2e.py",  # 9.4 (a side module)
    "tests/e2e/test_quickstart.py",  # 5.3
    "tests/e2e/test_long_runs.py",  # 3.7
    "tests/e2e/test_t5x_rigs.py",  # 3.6
    "tests/worker/test_torch_features.py",  # 3.5
    "tests/e2e/test_gcp_rigs.py",  # 3
    "tests/e2e/test_compute_rigs.py",  # new: one recovered run of 60 steps, about 2 (measured below)
    "tests/worker/test_t5x_parts.py",  # 1.5
    "tests/worker/test_keras_parts.py",  # 1.5 (a side module)
    "tests/worker/test_t5x_train_keys.py",  # 1.4
    # late, after the side modules: it timed out beside another rig once (two rigs collide: SIDE_MODULES)
    "tests/e2e/test_recovery_rigs.py",  # 3.6
)

SIDE_MODULES: tuple[str, ...] = (
    "tests/e2e/test_keras_e2e.py",  # 0.48
    "tests/worker/test_keras_parts.py",  # 0.53
    "tests/worker/test_keras_train_keys.py",  # 0.51
    "tests/ops/test_train.py",  # 0.36
    "tests/tracking/test_sidecar.py",  # 0.48
    "tests/convert/test_keras_ckpt.py",  # 0.52
    "tests/worker/test_keras_eval_keys.py",  # 0.48
)
"""Slow modules that leave a core of two idle when they run alone (the busy share that ``TPUFT_TEST_CPU_LOG``
logs, tests/cpu_log.py; in the comments, from the CI-like run of 2026-11-29): the Keras backend's tracing and
decoding run on one thread, the others wait on processes. The quick lane takes them once its quick modules are
done, beside the slow lane. No GCP-rig module (``tests/e2e/*_rigs.py``): the rigs' workers listen at 127.0.1.x
and, like real hosts, on the fixed coordinator port (tpuft.core.ports), so two rigs at once collide (the Keras
rig beside the T5X rigs failed to start its trainers)."""


def module_of(nodeid: str) -> str:
    """The test module's path from the repository root (``tests/e2e/test_t5x_e2e.py``) of a node id."""
    return nodeid.split("::", 1)[0]


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def in_lanes() -> bool:
    """Whether this process is an xdist worker (a lane), not a session of one process."""
    return "PYTEST_XDIST_WORKER" in os.environ


def lay_out(
    items: list[pytest.Item],
    longest_first: Sequence[str] = SLOW_MODULES_LONGEST_FIRST,
    side: Sequence[str] = SIDE_MODULES,
    lanes: bool | None = None,
) -> None:
    """Order ``items`` in place, a module's tests together and in their order. In one process: the quick
    modules (a mistake shows in minutes), then the modules with a slow test, the longest first. In lanes: the
    slow modules not in ``side`` (the slow lane starts with them), the quick modules, then the ``side`` ones
    (the other lane takes them once the quick ones are done)."""
    if lanes is None:
        lanes = in_lanes()
    first_seen: dict[str, int] = {}
    slow_modules: set[str] = set()
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item.nodeid), index)
        if is_slow(item):
            slow_modules.add(module_of(item.nodeid))

    def rank(module: str) -> int:
        return longest_first.index(module) if module in longest_first else len(longest_first)

    def group(module: str) -> int:
        if module not in slow_modules:
            return 1 if lanes else 0
        if not lanes:
            return 1
        return 2 if module in side else 0

    def key(item: pytest.Item) -> tuple[int, int, int]:
        module = module_of(item.nodeid)
        return group(module), rank(module) if module in slow_modules else 0, first_seen[module]

    items.sort(key=key)  # stable: a module's tests keep their order


SLOW_LANE = "the slow lane"
"""The xdist scope that holds every module with a slow test but the :data:`SIDE_MODULES`."""
SIDE_LANE = "the side lane"
"""The xdist scope of the :data:`SIDE_MODULES`, after the quick modules in the queue."""

_SLOW_MARK = re.compile(r"\bmark\.slow\b")


def marks_slow(module: Path) -> bool:
    """Whether a test module marks a test ``slow``, read from its text: xdist's controller schedules by node
    id and never collects (``tests/test_lanes.py`` holds this against the collected markers)."""
    try:
        return _SLOW_MARK.search(module.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


class SlowLaneScheduling(LoadFileScheduling):
    """``loadfile``, with the slow modules in one scope (:data:`SLOW_LANE`) that goes out first and the
    :data:`SIDE_MODULES` in another (:data:`SIDE_LANE`) that goes out last: one lane runs the slow modules one
    after another, the other lane the quick modules and then the side ones."""

    def __init__(self, config: pytest.Config, log: object = None, side: Sequence[str] = SIDE_MODULES) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        # the slow scope first, as the lanes' collection has it (lay_out), not the biggest first
        config.option.loadscopereorder = False
        self._root = Path(config.rootpath)
        self._slow: dict[str, bool] = {}
        self._side = set(side)

    def _split_scope(self, nodeid: str) -> str:
        module = module_of(nodeid)
        if module not in self._slow:
            self._slow[module] = marks_slow(self._root / module)
        if not self._slow[module]:
            return module
        return SIDE_LANE if module in self._side else SLOW_LANE
