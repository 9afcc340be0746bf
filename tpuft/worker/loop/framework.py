"""The sequencer's side of a framework that runs its own loop (T5X): it trains a run of steps, evaluates and
saves by itself, and comes back to Python between runs of steps (every ``train.log_every``). Its adapter
hands over here at those boundaries and where it sees the framework save, evaluate or restore; what happens
then is decided here, as :mod:`tpuft.worker.loop.sequencer` decides it for the other engines.

* Goodput events (:mod:`tpuft.worker.events`) of what the framework does out of the sequencer's sight
  (:class:`Timeline`): the wait for each step's batch (its ``next()``, kept with the step the batch is for:
  the framework may write a window's scalars after the next window's first batches were taken), a save
  complete, an evaluation over, a resumed run's restore.
* Checkpoints on demand (:func:`run_steps`): a relayed request is served at a boundary through the
  framework's own save; a request for a step inside the next run of steps splits that run there, so every
  host saves exactly at ``at_step``. The save is a collective on several hosts, so the hosts that have the
  request first agree (the engine's barrier, with a timeout): one that did not see it in time makes every host
  refuse it, and nobody waits in a save its peers never start.
* ``train.time_limit`` at those boundaries: the hosts agree, the framework saves, and :class:`RunEnded` leaves
  its loop; the adapter then runs the end of the run.

Every step here is the framework's absolute one; the events record tpuft's (minus ``offset``, the initial
checkpoint's step). Stdlib only: the controller's tests drive it without T5X.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpuft.worker import events
from tpuft.worker.loop.runloop import RunLoop
from tpuft.worker.loop.sequencer import time_up
from tpuft.worker.ondemand import CheckpointRequests, Request, hold


class RunEnded(Exception):  # a signal out of the framework's loop, not an error
    """Raised at a boundary to leave the framework's loop: the sequencer has ended training there."""


class Timeline:
    """One run's events of what the framework does itself; ``offset``: its step at tpuft's step 0."""

    def __init__(self, offset: int, total_steps: int) -> None:
        self.initial_step, self.total_steps = offset, total_steps
        self.resumed_at: int | None = None
        """tpuft's step of the checkpoint the framework is about to restore, when tpuft resumes the run."""
        self.trained_to = offset
        """The framework's step count after the last run of steps it was given (its evaluations come after
        one)."""
        self._asked = False
        self._waits: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    def batch_taken(self, absolute_step: int, seconds: float) -> None:
        """The framework waited ``seconds`` for the batch of step ``absolute_step + 1``."""
        with self._lock:
            self._waits.append((absolute_step, seconds))

    def waited_before(self, absolute_step: int) -> float:
        """The waits for the steps before ``absolute_step`` (a train scalars' window ends there), taken: each
        counts in one window."""
        with self._lock:
            mine = [seconds for step, seconds in self._waits if step < absolute_step]
            self._waits = [(step, seconds) for step, seconds in self._waits if step >= absolute_step]
        return sum(mine)

    def restored(self, started: float) -> None:
        if self.resumed_at is not None:
            events.record("checkpoint_restore", started, time.time() - started, step=self.resumed_at)
            self.resumed_at = None

    @contextmanager
    def asking(self) -> Iterator[None]:
        """A save asked for on demand (``tpuft checkpoint``, a maintenance notice, ``train.max_cost``)."""
        self._asked = True
        try:
            yield
        finally:
            self._asked = False

    def saved(self, absolute_step: int, started: float, stopped: str | None) -> None:
        """A save of ``absolute_step`` that began at ``started`` is complete (its manifest written);
        ``stopped``: why training ended before its last step, if it did."""
        events.record(
            "checkpoint_save",
            started,
            time.time() - started,
            step=absolute_step - self.initial_step,
            reason=self.save_reason(absolute_step, stopped),
        )

    def save_reason(self, absolute_step: int, stopped: str | None) -> str:
        """The framework saves on its cadence and at the end (it keeps the best by pruning, never saves for
        it)."""
        if self._asked:
            return "request"
        return "final" if absolute_step >= self.total_steps or stopped else "periodic"

    def evaluated(self, started: float) -> None:
        """An evaluation that began at ``started`` is over (after the steps the framework last ran)."""
        events.record("eval", started, time.time() - started, step=self.trained_to - self.initial_step)


class Boundaries:
    """The acts the framework's adapter supplies at its boundaries: ``save(absolute)`` through the
    framework's own checkpoint manager, ``agree_request(request)`` (every host has it at this step: a barrier
    with a timeout), ``agree(flag)`` (any host's flag, on every host)."""

    def __init__(
        self,
        loop: RunLoop,
        timeline: Timeline,
        *,
        save: Callable[[int], None],
        agree_request: Callable[[Request], bool],
        agree: Callable[[bool], bool],
        barrier_seconds: float,
    ) -> None:
        self.loop, self.timeline = loop, timeline
        self.save, self.agree_request, self.agree = save, agree_request, agree
        self.barrier_seconds = barrier_seconds
        self.requests = CheckpointRequests.of(loop.ctx, answers=loop.beats)

    def run_steps(self, steps: Callable[[int, int], Any], start: int, count: int) -> Any:
        """The framework's run of ``count`` steps from its step ``start``: ``steps(count, start)`` runs them;
        a due request is served before, a request for a step inside splits them there, and the time limit
        ends training at the boundary (:class:`RunEnded`, after the save)."""
        offset = self.timeline.initial_step
        first = start - offset
        if self.loop.attempt_started is None:  # the framework's training starts: the attempt's clock
            self.loop.attempt_started = time.time()
        self.serve_due(first)
        if time_up(self.loop, first, self.agree, due=first > self.loop.start_step):
            self.loop.step = first
            self.save(start)
            raise RunEnded(first)
        split = self.requests.within(first, first + count)
        if split is None:
            return steps(count, start)
        steps(split - first, start)
        self.serve_due(split)
        return steps(first + count - split, start + split - first)

    def serve_due(self, step: int) -> None:
        request = self.requests.due(step)
        if request is None:
            return
        say, absolute = self.loop.say, step + self.timeline.initial_step
        if not self.agree_request(request):
            self.requests.answer(
                request,
                absolute,
                refused=f"not every host had the request at step {step} (they wait "
                f"{self.barrier_seconds:.0f} s for each other before a save); ask again",
            )
            say(f"checkpoint asked for ({request.reason}) refused: not every host had it at step {step}")
            return
        say(f"checkpoint asked for ({request.reason}): saving step {step}")
        with self.timeline.asking():  # its goodput event's reason: request
            self.save(absolute)
        self.requests.answer(request, absolute)
        if request.stop:
            hold(step, request, say, lambda at: self.loop.beat(at, phase="checkpoint"))


def reported_train(
    loop: RunLoop,
    step: int,
    *,
    loss: float,
    lr: float,
    examples_per_s: float,
    tokens_per_s: float,
    extra: dict[str, Any],
    phase: str,
) -> None:
    """The framework's train scalars of the window ending at ``step``: the metrics row (with the
    framework's own rates), the progress line, the heartbeat."""
    logged = loop.log_train(
        step, loss=loss, lr=lr, examples_per_s=examples_per_s, tokens_per_s=tokens_per_s, extra=extra
    )
    loop.step = step
    loop.beat(step, phase=phase, **logged)


def reported_eval(loop: RunLoop, step: int, row: dict[str, Any], *, line: str) -> bool:
    """The framework's evaluation at ``step``: recorded and judged (keep-best, early stopping, which the
    framework's stop action asks for). True when it is the best so far."""
    loop.record_eval(step, row, line=line)
    return loop.judge(step, row).improved


def resumed_from_rows(loop: RunLoop, rows: list[dict[str, Any]]) -> None:
    """A framework's checkpoints hold no tpuft state: a resume judges the inference evaluations logged before
    its checkpoint again (keep-best, early stopping), and finds the run's test row (tested at its end: not
    again; a time-limited end's row does not count, its resume tests its later weights)."""
    for row in rows:
        if "eval_examples" in row and isinstance(row.get("step"), int):  # an inference evaluation's row
            loop.selector.judge(row["step"], row)
        if "test_examples" in row and not row.get("ended"):
            loop.test_result = row
