"""A cold ``tpuft exec`` from what the last one learnt (:mod:`tpuft.providers.gcp.exec_plan`): no cluster-file
validation, no TPU API call, no import of either (the launcher's fast path calls this before importing
pydantic), the workers' host keys still checked against the pins the API published. When a connection fails,
the plan may be stale (the node was recreated, its addresses or keys changed): :class:`StalePlan` tells the
caller to take the whole path once, asking the API (``exec_command(..., refresh=True)``), which either reaches
the workers and remembers the new plan or says clearly why not; a host whose key is not the pinned one is
refused on both ways. Every worker answering with its pinned key confirms the remembered workers
(:func:`tpuft.providers.gcp.exec_plan.confirm`), which keeps the connection agent trusting them too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tpuft.fleet.base import FleetResult, LineSink, select_workers
from tpuft.fleet.spec import command_argv, exec_env, parse_worker_list
from tpuft.fleet.ssh import SshConnectError, SshFleet
from tpuft.providers.gcp import exec_plan
from tpuft.providers.gcp.cache import WorkerCache


class StalePlan(Exception):
    """The remembered workers could not be reached: re-check with the API (nothing ran on any worker)."""


def exec_remembered(
    config_path: str, command: Sequence[str], workers: str | None, on_line: LineSink
) -> FleetResult | None:
    """Run ``command`` as ``exec_command`` would, from the remembered plan; None when there is none (or it
    does not match the cluster file as it is now): the caller takes the whole path."""
    plan = exec_plan.load(config_path)
    if plan is None:
        return None
    settings = plan.settings
    if (
        plan.age_s > WorkerCache.CACHE_SECONDS
    ):  # seen long ago: one try each, then the API says what became of it
        settings = dataclasses.replace(settings, connect_attempts=1)
    layout = plan.cluster.layout
    chosen = parse_worker_list(workers, layout)
    fleet = SshFleet(plan.cluster.workers, settings)
    try:
        fleet.connect_all(select_workers(plan.cluster.workers, chosen))
    except SshConnectError as exc:
        fleet.close()
        raise StalePlan(str(exc)) from None
    if chosen is None:  # all of them answered with their pinned keys
        exec_plan.confirm(plan)
    try:  # from here on a command may have started: its errors are the run's, never retried
        return fleet.run(
            command_argv(command), workers=chosen, on_line=on_line, env=lambda w: exec_env(w.index, layout)
        )
    finally:
        fleet.close()
