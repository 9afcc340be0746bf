"""T5X's share of the run's goodput events (:mod:`tpuft.worker.events`): what T5X does in its own loop, out of
the sight of tpuft's run skeleton, timed where tpuft's hooks (:mod:`tpuft.worker.t5x.hooks`) see it happen.

* Data waits: T5X's ``trainer.train`` takes each step's batch with ``next()`` on the iterator tpuft's hook
  hands it, so the hook times that ``next()`` (seqio/tf.data's fetch and T5X's host-to-device assembly of the
  global batch). T5X writes a window's train scalars from a background thread, possibly after the next
  window's first batches were taken, so each wait is kept with the step its batch is for and a window takes
  only the waits of its own steps.
* Checkpoint saves: T5X saves through its Orbax manager, asynchronously; the hook waits until the save is
  complete and tpuft's manifest is written (a checkpoint pull, convert and resume can take), and that is the
  save's time.
* Evaluations: the teacher-forced ``trainer.eval`` and seqio's ``Evaluator.evaluate`` (inference, decoding
  every held-out example) hold the training up for as long as they run; seqio computes the metrics in a thread
  afterwards.
* Restore: T5X restores the latest checkpoint in its start-up
  (``utils.create_checkpoint_manager_and_restore``); timed there, and recorded only when tpuft resumes the run
  (the initial checkpoint a fine-tuning starts from is start-up, as on every backend).

Stdlib only (the controller's tests drive it without T5X).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tpuft.worker import events


class T5xTimeline:
    """One run's T5X events; every step here is T5X's absolute step, recorded as tpuft's (minus the initial
    checkpoint's)."""

    def __init__(self, initial_step: int, total_steps: int) -> None:
        self.initial_step, self.total_steps = initial_step, total_steps
        self.resumed_at: int | None = None
        """tpuft's step of the checkpoint T5X is about to restore, when tpuft resumes the run (set by the
        run)."""
        self.trained_to = initial_step
        """T5X's step count after the last run of steps its loop was given (its evaluations come after
        one)."""
        self._asked = False
        self._waits: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    # -- data waits -----------------------------------------------------------------------------------------
    def batch_taken(self, absolute_step: int, seconds: float) -> None:
        """T5X waited ``seconds`` for the batch of step ``absolute_step + 1`` (the step count before it)."""
        with self._lock:
            self._waits.append((absolute_step, seconds))

    def waited_before(self, absolute_step: int) -> float:
        """The waits for the steps before T5X's step count ``absolute_step`` (a train scalars' window ends
        there), taken: each counts in one window."""
        with self._lock:
            mine = [seconds for step, seconds in self._waits if step < absolute_step]
            self._waits = [(step, seconds) for step, seconds in self._waits if step >= absolute_step]
        return sum(mine)

    # -- restore, saves, evaluations ------------------------------------------------------------------------
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

    def saved(self, absolute_step: int, started: float, stopped_early: str | None) -> None:
        """A save of ``absolute_step`` that began at ``started`` is complete (its manifest written)."""
        events.record(
            "checkpoint_save",
            started,
            time.time() - started,
            step=absolute_step - self.initial_step,
            reason=self.save_reason(absolute_step, stopped_early),
        )

    def save_reason(self, absolute_step: int, stopped_early: str | None) -> str:
        """T5X saves every ``checkpoint_every`` steps and at the end (it keeps the best by pruning, never
        saves for it)."""
        if self._asked:
            return "request"
        return "final" if absolute_step >= self.total_steps or stopped_early else "periodic"

    def evaluated(self, started: float) -> None:
        """An evaluation that began at ``started`` is over (after the steps T5X last ran)."""
        events.record("eval", started, time.time() - started, step=self.trained_to - self.initial_step)
