"""The suite's two lanes (tests/lanes.py): every slow module in one lane, the quick ones in the other, and the
text test the scheduler uses agrees with the markers pytest collects."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO
from tests.lanes import SIDE_MODULES, SLOW_MODULES_LONGEST_FIRST, marks_slow

SLOW = "pytest.mark." + "slow"  # spelt apart: this module's own text must not read as a slow module


def test_the_text_test_finds_exactly_the_modules_with_a_slow_test() -> None:
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-m",
            "slow",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    slow = {line.split("::", 1)[0] for line in collected.stdout.splitlines() if "::" in line}
    assert len(slow) > 10, collected.stdout[-2000:]
    by_text = {
        path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("test_*.py") if marks_slow(path)
    }
    assert by_text == slow


def test_the_listed_modules_exist_and_are_slow() -> None:
    """A renamed or quickened module leaves the lists, rather than silently changing nothing."""
    for module in (*SLOW_MODULES_LONGEST_FIRST, *SIDE_MODULES):
        assert marks_slow(REPO / module), module
    # a GCP rig's workers take the fixed coordinator port at 127.0.1.x: two rigs at once collide
    assert not [module for module in SIDE_MODULES if module.endswith("_rigs.py")]
    assert not set(SIDE_MODULES) & set(SLOW_MODULES_LONGEST_FIRST)  # one lane's or either lane's, not both


def test_the_slow_modules_share_one_lane_and_the_free_lane_takes_the_next_side_module(
    tmp_path: Path,
) -> None:
    """A small suite in two lanes through the real scheduler: both slow modules on one worker, one after the
    other in the longest-first order, while the other worker runs the quick modules and then the long side
    module; the slow lane, done first, takes the next side modules instead of waiting for the other lane."""
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO)!r})
            from tests.lanes import lay_out, SlowLaneScheduling

            SIDE = ("test_slow_side1.py", "test_slow_side2.py", "test_slow_side3.py")

            def pytest_collection_modifyitems(session, config, items):
                lay_out(items, longest_first=("test_slow_b.py", "test_slow_a.py"), side=SIDE)

            def pytest_xdist_make_scheduler(config, log):
                return SlowLaneScheduling(config, log, side=SIDE)
            """
        )
    )
    seconds = {"a": 0.3, "b": 0.3, "side1": 1.5, "side2": 0.1, "side3": 0.1}
    for name, each in seconds.items():
        (tmp_path / f"test_slow_{name}.py").write_text(
            f"import time, pytest\npytestmark = {SLOW}\n"
            + "".join(
                f"def test_{name}{i}():\n    time.sleep({each})\n" for i in range(5 if name == "side1" else 3)
            )
        )
    for name in ("c", "d", "e"):
        (tmp_path / f"test_quick_{name}.py").write_text(
            "".join(f"def test_{name}{i}():\n    pass\n" for i in range(2))
        )
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    order = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (test_\w+\.py)::(test_\w+)", ran.stdout)
    assert len(order) == 23, ran.stdout
    (slow_worker,) = {worker for worker, module, _ in order if module in ("test_slow_a.py", "test_slow_b.py")}
    slow_lane = [(module, test) for worker, module, test in order if worker == slow_worker]
    assert [test for _, test in slow_lane[:6]] == [
        "test_b0",
        "test_b1",
        "test_b2",
        "test_a0",
        "test_a1",
        "test_a2",
    ]
    assert {module for module, _ in slow_lane[6:]} == {"test_slow_side2.py", "test_slow_side3.py"}, order
    other = [module for worker, module, _ in order if worker != slow_worker]
    assert set(other) == {"test_quick_c.py", "test_quick_d.py", "test_quick_e.py", "test_slow_side1.py"}, (
        order
    )
    assert other[-5:] == ["test_slow_side1.py"] * 5, order  # the side module after the quick ones
