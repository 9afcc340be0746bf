"""The supervisor every fleet shares, with stand-in handles (pure Python objects with the Handle methods): who
is stopped when, in which order, and what a failure to start leaves behind. The fleets themselves are tested
against real processes and real sshd servers in test_local_fleet.py and test_ssh_fleet.py."""

from __future__ import annotations

import threading

import pytest

from tpuft.fleet.base import WorkerResult
from tpuft.fleet.supervise import run_supervised


class StandIn:
    """A worker that ends with ``code`` after ``polls`` polls, or runs until stopped (``code=None``)."""

    def __init__(self, index: int, code: int | None, polls: int = 1, ignores_term: bool = False) -> None:
        self.index, self.code, self.polls, self.ignores_term = index, code, polls, ignores_term
        self.stopped_by_us = False
        self.events: list[str] = []
        self.ended: int | None = None

    def poll(self) -> int | None:
        if self.ended is None and self.code is not None:
            self.polls -= 1
            if self.polls <= 0:
                self.ended = self.code
        return self.ended

    def stop(self) -> None:
        if self.ended is None:
            self.stopped_by_us = True
            self.events.append("TERM")
            if not self.ignores_term:
                self.ended = -15

    def escalate(self) -> None:
        if self.stopped_by_us and self.ended is None:
            self.events.append("KILL")
            self.ended = -9

    def finish(self) -> None:
        self.events.append("finish")

    def result(self) -> WorkerResult:
        return WorkerResult(self.index, None if self.stopped_by_us else self.ended, 0.0)


def run(handles: list[StandIn], fail_fast: bool = True):  # type: ignore[no-untyped-def]
    def start(out: list, changed: threading.Event) -> None:  # type: ignore[type-arg]
        out.extend(handles)

    return run_supervised(start, fail_fast)


def test_all_succeed() -> None:
    result = run([StandIn(0, 0), StandIn(1, 0, polls=3)])
    assert result.ok and result.first_failure is None


def test_the_first_failure_stops_the_others_and_is_named() -> None:
    survivor, culprit, late = StandIn(0, None), StandIn(1, 3, polls=2), StandIn(2, 5, polls=50)
    result = run([survivor, culprit, late])
    assert result.first_failure == 1 and not result.ok
    assert survivor.events[0] == "TERM" and late.events[0] == "TERM"
    # stopped by us, not failures of their own
    assert [r.exit_code for r in result.results] == [
        None,
        3,
        None,
    ]


def test_without_fail_fast_everyone_runs_to_the_end() -> None:
    result = run([StandIn(0, 1), StandIn(1, 0, polls=5)], fail_fast=False)
    assert [r.exit_code for r in result.results] == [1, 0] and result.first_failure is None


def test_a_worker_that_ignores_sigterm_is_killed() -> None:
    stubborn = StandIn(0, None, ignores_term=True)
    result = run([stubborn, StandIn(1, 2)])
    assert stubborn.events[:2] == ["TERM", "KILL"] and result.first_failure == 1


def test_a_worker_that_cannot_start_takes_the_started_ones_down() -> None:
    started = StandIn(0, None)

    def start(out: list, changed: threading.Event) -> None:  # type: ignore[type-arg]
        out.append(started)
        raise OSError("worker 1 cannot start")

    with pytest.raises(OSError, match="worker 1 cannot start"):
        run_supervised(start, True)
    assert started.events == ["TERM", "finish"]


def test_ctrl_c_stops_everyone_and_reports_interrupted(sigint_raises: None) -> None:
    worker = StandIn(0, None)

    def start(out: list, changed: threading.Event) -> None:  # type: ignore[type-arg]
        out.append(worker)
        raise KeyboardInterrupt

    result = run_supervised(start, True)
    assert result.interrupted and not result.ok and worker.events == ["TERM", "finish"]
