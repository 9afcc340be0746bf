"""The recovery watcher's lease: one watcher per run, held in the run dir (``watcher.json``), so that two
machines never recreate the same node.

Apart from :mod:`tpuft.ops.recover` because it is a protocol of its own on the run dir's storage (a
compare-and-write against the version last seen, taken over once stale), with its own tests, and it knows
nothing of nodes, providers or attempts: the watcher only holds it and renews it before it acts.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tpuft.config import RecoverConfig
from tpuft.core.errors import TpuftError, UsageError
from tpuft.host.state import is_alive
from tpuft.readers.runs import Run
from tpuft.run import rundir

WATCHER = "watcher.json"
"""The watcher's lease, in the run dir: who watches (host, pid) and when it last said so."""


def _stale_after(policy: RecoverConfig) -> float:
    return 3 * policy.poll + 30.0


class WatchTakenOver(TpuftError):
    """Another watcher holds the run's lease now (this one was presumed gone, e.g. a laptop that slept): this
    one stops at once and touches nothing, so two watchers never recreate one node."""


def _holder(held: dict[str, Any]) -> str:
    return f"pid {held.get('pid')} on {held.get('host')}"


@contextmanager
def watcher_lease(run: Run, policy: RecoverConfig) -> Iterator[Callable[[], None]]:
    """Claim the run for this watcher (refused while another one lives); yields the function that renews it.

    Every write of the lease is a compare-and-write against the version this watcher last saw (a bucket
    object's generation): two watchers that start at the same moment cannot both win, and a watcher whose
    lease was taken over while it was away (presumed dead after ``3 * poll + 30`` s) learns so at its next
    renewal, which raises
    :class:`WatchTakenOver` before it acts on the node again."""
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    text, version = run.storage.read_versioned(WATCHER)
    held = rundir.read_json_text(text)
    if held and not held.get("ended") and not _is_me(held, me):
        age = time.time() - float(held.get("seen") or 0.0)
        dead_here = held.get("host") == me["host"] and not is_alive(held.get("pid"))
        if age < _stale_after(policy) and not dead_here:
            raise UsageError(
                f"run {run.id} is already watched for recovery by {_holder(held)} (last seen {age:.0f} s "
                "ago)",
                hint=f"Stop that watcher (Ctrl-C there), or wait {_stale_after(policy):.0f} s after it "
                f"is gone: tpuft resume {run.id} --recover then takes over",
            )
    state: dict[str, Any] = {"version": version, "holder": None}

    def write(extra: dict[str, Any]) -> bool:
        """Write our lease over the version we last saw; False if someone else's is there now (and for good: a
        lost lease is never written again)."""
        for _ in range(3 if state["holder"] is None else 0):
            written = run.storage.write_text_if(
                WATCHER, json.dumps({**me, "seen": time.time(), **extra}), state["version"]
            )
            if written is not None:
                state["version"] = written
                return True
            text, state["version"] = run.storage.read_versioned(WATCHER)
            current = rundir.read_json_text(text) or {}
            if not _is_me(current, me):  # (our own, e.g. a retried upload that had landed: write over it)
                state["holder"] = _holder(current)
                return False
        return False

    def renew() -> None:
        if not write({}):
            raise WatchTakenOver(
                f"run {run.id} is watched by {state['holder'] or 'another watcher'} now: this watcher "
                "stops and leaves the node and the run to it",
                hint=f"Only one watcher per run; see it with: tpuft monitor {run.id}",
            )

    if not write({}):
        raise UsageError(
            f"run {run.id} was claimed for recovery by {state['holder'] or 'another watcher'} at the same "
            "moment",
            hint="Only one watcher per run; stop that one first if this one should watch",
        )
    try:
        yield renew
    finally:
        try:
            # let go, unless someone else holds it now (then it is theirs: untouched)
            write({"ended": time.time()})
        except TpuftError:
            pass  # the bucket cannot be reached: the lease goes stale by itself, and what raised matters more


def _is_me(held: dict[str, Any], me: dict[str, Any]) -> bool:
    return (held.get("host"), held.get("pid")) == (me["host"], me["pid"])
