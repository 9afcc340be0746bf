"""The suite's order and its two lanes (pytest-xdist, ``-n 2 --dist loadfile`` in pyproject.toml's addopts).

Most slow modules (trainings on a local pod of 2 host processes, the rigs) fill both cores: two of them side
by side each took 1.4 to 2.2 times as long as alone, and the recovery rig's preempted spot run timed out
beside another rig. The quick modules are short and wait a lot (subprocesses, sockets, sshd), and many slow
modules leave part of a core idle (:data:`SIDE_MODULES`: the Keras backend traces and decodes
on one thread, the worker-part tests start one process at a time). So the lanes are not symmetric
(:class:`SlowLaneScheduling`):

- the slow modules that fill the machine or are GCP rigs run in **one lane**, one after another, from the
  session's first second, the longest first (``SLOW_MODULES_LONGEST_FIRST``, the minutes of a CI-like run in
  the comments; a slow module listed nowhere goes after them, in that lane);
- **the other lane** runs the quick modules meanwhile, then the side modules, the longest first;
- a side module is a unit of its own: whichever lane is free takes the next one, so the slow lane, done,
  helps the other finish rather than wait for it (the CI-like run of 2026-11-29 had one lane idle for its
  last 18 minutes);
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
    "tests/e2e/test_t5x_e2e.py",  # 9.1 (the CI-like run of 2026-11-29, venvs cached; busy share alone 0.90)
    "tests/e2e/test_quickstart.py",  # 8.6 (0.97)
    "tests/e2e/test_long_runs.py",  # 5.1 (0.97)
    "tests/e2e/test_t5x_rigs.py",  # 4.4 (0.88)
    "tests/e2e/test_gcp_rigs.py",  # 2.6 (0.91)
    "tests/e2e/test_compute_rigs.py",  # 2.4 (0.93)
    "tests/e2e/test_recovery_rigs.py",  # 3.2 (0.78): it timed out beside another rig once
    "tests/e2e/test_keras_rigs.py",  # 1.0 (0.71)
)
"""The slow lane's modules: every GCP rig (a rig's workers listen at 127.0.1.x and, like real hosts, on the
fixed coordinator port, tpuft.core.ports, so two rigs at once collide: the Keras rig beside the T5X rigs
failed to start its trainers) and the trainings that fill both cores alone."""

SIDE_MODULES: tuple[str, ...] = (
    "tests/e2e/test_keras_e2e.py",  # 11.6 (0.48 alone in an earlier run)
    "tests/worker/test_torch_features.py",  # 3.5 (0.87)
    "tests/worker/test_keras_parts.py",  # 2.4 (0.53)
    "tests/worker/test_keras_train_keys.py",  # 1.4 (0.51)
    "tests/worker/test_t5x_parts.py",  # 1.3 (0.57)
    "tests/worker/test_t5x_train_keys.py",  # 1.3 (0.62)
    "tests/tracking/test_sidecar.py",  # 1.0 (0.48)
    "tests/ops/test_train.py",  # 1.0 (0.36)
    "tests/convert/test_keras_ckpt.py",  # 0.7 (0.52)
    "tests/test_compile_fit.py",  # 0.6 (0.57)
    "tests/worker/test_predict_engines.py",  # 0.5 (0.63)
    "tests/worker/test_resume.py",  # 0.5 (0.85)
    "tests/worker/test_keras_eval_keys.py",  # 0.4 (0.48)
    "tests/backends/test_tpu_install_sets.py",  # 0.3 (0.82)
    "tests/convert/test_convert_remote.py",  # 0.3 (0.52)
    "tests/convert/test_t5x.py",  # 0.3 (0.52)
    "tests/worker/test_t5x_multislice.py",  # 0.2 (0.57)
    "tests/worker/test_compile_cache.py",  # 0.2 (0.53)
    "tests/config/test_t5_schema.py",  # 0.2 (0.50)
    "tests/worker/test_t5x_data_keys.py",  # 0.1 (0.51)
    "tests/test_model_summary.py",  # 0.1 (0.50)
    "tests/worker/test_torch_multislice.py",  # 0.1 (0.38)
    "tests/worker/test_trainer_parts.py",  # 0.05 (0.54)
)
"""Slow modules that may run beside the slow lane (in the comments: minutes and the machine's busy share
while each ran alone, from ``TPUFT_TEST_CPU_LOG``, tests/cpu_log.py): no GCP rig among them, and most leave a
core of two idle (the Keras backend's tracing and decoding run on one thread, the worker-part tests wait on
one process at a time). Each is a unit of its own after the quick modules, the longest first, so whichever
lane is free takes the next."""


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
    modules (a mistake shows in minutes), then the modules with a slow test, the slow lane's longest first,
    then the side ones. In lanes: the slow modules not in ``side`` (the slow lane starts with them), the quick
    modules, then the ``side`` ones in their order (xdist hands the units out in this order)."""
    if lanes is None:
        lanes = in_lanes()
    first_seen: dict[str, int] = {}
    slow_modules: set[str] = set()
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item.nodeid), index)
        if is_slow(item):
            slow_modules.add(module_of(item.nodeid))

    def rank(module: str) -> int:
        if module not in slow_modules:
            return 0
        if module in side:
            return len(longest_first) + 1 + list(side).index(module)
        return longest_first.index(module) if module in longest_first else len(longest_first)

    def group(module: str) -> int:
        if module not in slow_modules:
            return 1 if lanes else 0
        if not lanes:
            return 1
        return 2 if module in side else 0

    def key(item: pytest.Item) -> tuple[int, int, int]:
        module = module_of(item.nodeid)
        return group(module), rank(module), first_seen[module]

    items.sort(key=key)  # stable: a module's tests keep their order


SLOW_LANE = "the slow lane"
"""The xdist scope that holds every module with a slow test but the :data:`SIDE_MODULES`."""

_SLOW_MARK = re.compile(r"\bmark\.slow\b")


def marks_slow(module: Path) -> bool:
    """Whether a test module marks a test ``slow``, read from its text: xdist's controller schedules by node
    id and never collects (``tests/test_lanes.py`` holds this against the collected markers)."""
    try:
        return _SLOW_MARK.search(module.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


class SlowLaneScheduling(LoadFileScheduling):
    """``loadfile``, with the slow modules in one scope (:data:`SLOW_LANE`) that goes out first and each of
    the :data:`SIDE_MODULES` a scope of its own after the quick modules: one lane runs the slow modules one
    after another, the other lane the quick modules and then side modules, and the lane that is free first
    takes the next side module (xdist gives a lane its next scope when at most two of its tests are left)."""

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
        if not self._slow[module] or module in self._side:
            return module
        return SLOW_LANE
