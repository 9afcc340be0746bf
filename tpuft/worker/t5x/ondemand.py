"""Checkpoints on demand on T5X (:mod:`tpuft.worker.ondemand` says what and why): T5X's loop runs its steps
inside ``trainer.train`` and comes back to Python every ``train.log_every`` steps (its ``stats_period``), so a
relayed request is served there, between two of those runs, through T5X's own checkpoint manager, the one T5X
saves with; a request for a step inside the next run of steps splits that run at the step, so that every host
saves exactly at ``at_step``.

The save is a collective on several hosts (every process writes its shards, then Orbax syncs them), so the
hosts that have the request first meet at a barrier of JAX's coordination service, with a timeout: a host that
did not see the request in time never comes, the barrier fails for every host that came, and they all refuse
the request (the late host refuses it too, once it sees it): nobody waits in a save its peers never start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuft.worker.ondemand import CheckpointRequests, Request, hold

BARRIER_SECONDS = 60.0
"""How long the hosts that have a request wait for the others before they all refuse it."""

_REQUESTS: dict[int, CheckpointRequests] = {}
_MANAGER: list[Any] = []
"""T5X's checkpoint manager, as constructed (the hooks record it): what T5X itself saves with."""


def remember_manager(manager: Any) -> None:
    _MANAGER[:] = [manager]


def train_steps(run: Any, trainer: Any, steps: Callable[[int, int], Any], start: int, count: int) -> Any:
    """T5X's ``trainer.train`` of ``count`` steps from the absolute step ``start``: ``steps(count, start)``
    runs them; a due request is served before, and a request for a step inside splits them there."""
    requests = _REQUESTS.setdefault(id(run), CheckpointRequests.of(run.ctx, answers=run.loop.beats))
    first = start - run.initial_step
    serve_due(run, trainer, requests, first)
    split = requests.within(first, first + count)
    if split is None:
        return steps(count, start)
    steps(split - first, start)
    serve_due(run, trainer, requests, split)
    return steps(first + count - split, start + split - first)


def serve_due(run: Any, trainer: Any, requests: CheckpointRequests, step: int) -> None:
    request = requests.due(step)
    if request is None:
        return
    absolute = step + run.initial_step
    if not agreed(request):
        requests.answer(
            request,
            absolute,
            refused=f"not every host had the request at step {step} (they wait "
            f"{BARRIER_SECONDS:.0f} s for each other before a save); ask again",
        )
        run.say(f"checkpoint asked for ({request.reason}) refused: not every host had it at step {step}")
        return
    run.say(f"checkpoint asked for ({request.reason}): saving step {step}")
    with run.timeline.asking():  # its goodput event's reason: request
        save(trainer, absolute)
    requests.answer(request, absolute)
    if request.stop:
        hold(step, request, run.say, lambda at: run.beat(at, phase="checkpoint"))


def save(trainer: Any, absolute: int) -> None:
    """T5X's manager saves the trainer's state (the hooks' wrapper beats, waits until it is written and lets
    the chief write the manifest); a step T5X has just saved itself is not written again."""
    if not _MANAGER:
        raise RuntimeError(
            "tpuft: T5X built no checkpoint manager (no checkpoint period?): cannot save on demand"
        )
    manager = _MANAGER[0]
    if absolute in set(manager.all_steps()):
        return
    manager.save(trainer.train_state, (), True)


def agreed(request: Request) -> bool:
    """Every process has the request at this step (one process: always). JAX's coordination service barrier,
    named after the request, with :data:`BARRIER_SECONDS` of patience."""
    import jax

    if jax.process_count() == 1:
        return True
    from jax._src.distributed import global_state

    client = global_state.client
    if client is None:
        return True
    try:
        client.wait_at_barrier(f"tpuft-checkpoint-{request.id}", int(BARRIER_SECONDS * 1000))
    except Exception:  # noqa: BLE001 - a host that never came: the deadline, reported as an error by the service
        return False
    return True
