"""The run skeleton every backend shares: the sequencer that decides what happens after each step and at
the end (:mod:`~tpuft.worker.loop.sequencer`), the bookkeeping it keeps (:mod:`~tpuft.worker.loop.runloop`),
the lines it prints (:mod:`~tpuft.worker.loop.lines`), and its side of a framework that runs its own loop
(:mod:`~tpuft.worker.loop.framework`).

An engine supplies acts (:class:`~tpuft.worker.loop.sequencer.Acts`) and hands over at its step
boundaries; it never calls the bookkeeping itself (``tests/worker/test_sequencer_owns_bookkeeping.py``):

* PyTorch/XLA owns its loop: :func:`run` (``train`` then ``finish``) drives its :class:`TrainerHooks`.
* Keras's ``fit`` calls its callback: ``step_done`` after each execution, ``boundary`` between epochs (with
  the evaluation ``fit`` made), then ``finish``.
* T5X runs its own loop: its hooks hand over to :class:`~tpuft.worker.loop.framework.Boundaries` between runs
  of steps and to the :class:`~tpuft.worker.loop.framework.Timeline` where T5X saves, evaluates and restores.

Stop and hang signals are the heartbeat: the worker's supervisor (``tpuft/worker/supervisor/process.py``)
declares a trainer hung when its heartbeat is older than the hang timeout for its phase, and stops it.

Stdlib only at import (plus tpuft's worker modules): it runs inside every backend's venv.
"""

from tpuft.worker.loop.lines import eval_line, progress_line, steps_to_keep, test_line
from tpuft.worker.loop.runloop import HEARTBEAT_KEYS, TEST_STATE, RunLoop
from tpuft.worker.loop.sequencer import (
    TIME_LIMIT,
    Acts,
    TrainerHooks,
    after_step,
    boundary,
    evaluate,
    finish,
    run,
    run_test,
    step_done,
    train,
)

__all__ = [
    "HEARTBEAT_KEYS",
    "TEST_STATE",
    "TIME_LIMIT",
    "Acts",
    "RunLoop",
    "TrainerHooks",
    "after_step",
    "boundary",
    "eval_line",
    "evaluate",
    "finish",
    "progress_line",
    "run",
    "run_test",
    "step_done",
    "steps_to_keep",
    "test_line",
    "train",
]
