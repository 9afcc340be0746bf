"""``tpuft gc``: capacity tpuft created that holds quota or bills with nothing to show for it, found and
removed.

Why: a preempted spot node stays PREEMPTED (holding its quota) until someone deletes it; a FAILED or SUSPENDED
queued resource keeps its place; a READY node whose run ended on Friday bills all weekend. Only resources
tpuft created are considered, by the label ``created-by=tpuft`` that :mod:`tpuft.providers.gcp.nodes` puts on
every node it asks for (a queued resource carries it on its node spec): nothing else in the project is ever
listed or deleted. With ``gcp.api: compute`` the same questions are asked of Compute Engine
(:mod:`tpuft.ops.gc_compute`).

What counts as a leak, per zone of the project (the cluster file's, and ``--zone`` more):

* a queued resource FAILED or SUSPENDED (SUSPENDING too), or one whose node is PREEMPTED or TERMINATED;
* a node (outside a queued resource) PREEMPTED or TERMINATED;
* a READY node (or an ACTIVE queued resource's READY nodes) with no live run for longer than ``idle_s``: idle
  since the later of its creation and the last sign of life of the runs in the cluster's bucket whose run.json
  names it (``cluster``: the node's, or its queued resource's, name). A live run is one whose run.json says
  running and whose heartbeat or supervisor record is fresher than :data:`LIVE_WITHIN_S`.

The API gives no time for a state change, so the age shown is the creation time's, except for an idle node,
whose idle time is shown. Deleting goes through the queued resource when there is one, with ``force`` (its
nodes go with it), as ``tpuft delete`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.errors import TpuftError, UsageError
from tpuft.ops.leaks import Leak
from tpuft.ops.leaks import age as _age
from tpuft.ops.leaks import hours as _hours
from tpuft.ops.leaks import ours as _ours
from tpuft.ops.leaks import unix as _unix
from tpuft.providers.gcp.api import TpuApi
from tpuft.run import cost, rundir

DEAD_NODE_STATES = frozenset({"PREEMPTED", "TERMINATED"})
DEAD_QUEUED_STATES = frozenset({"FAILED", "SUSPENDED", "SUSPENDING"})
LIVE_WITHIN_S = 600.0
"""A running run whose freshest heartbeat or supervisor record is younger than this is live (the supervisors
write every 15 s and a bucket sync round is 15 s: ten minutes leaves room for a slow bucket, not for a dead
run)."""
DEFAULT_IDLE_S = 7200.0


def zones_of(config: ClusterConfig, extra: list[str]) -> list[str]:
    """The cluster file's zone, then each ``--zone`` once; refused when no project or zone is known."""
    if not config.gcp.project:
        raise UsageError(
            f"tpuft gc looks in a GCP project, and cluster {config.name} ({config.provider}) names none",
            hint="pass a cluster file with provider: gcp (--config), or set gcp.project in it",
        )
    zones = [z for z in [config.gcp.zone, *extra] if z]
    if not zones:
        raise UsageError("tpuft gc needs a zone: the cluster file's gcp.zone, or --zone")
    return list(dict.fromkeys(zones))


def find_leaks(
    config: ClusterConfig,
    zones: list[str],
    idle_s: float = DEFAULT_IDLE_S,
    now: float | None = None,
    runs: list[dict[str, Any]] | None = None,
) -> list[Leak]:
    """Every leak in ``zones`` of the cluster file's project. ``runs``: the run.json of each run in the bucket
    with its last sign of life (:func:`run_activity`), read once from the bucket when not given and a node is
    READY."""
    now = time.time() if now is None else now
    leaks: list[Leak] = []
    known: list[list[dict[str, Any]]] = [runs] if runs is not None else []

    def bucket() -> list[dict[str, Any]]:
        if not known:  # read once, and only when a node is READY
            known.append(bucket_runs(config))
        return known[0]

    if config.gcp.api == "compute":
        from tpuft.ops.gc_compute import find_compute_leaks

        return find_compute_leaks(config, zones, idle_s, now, bucket)
    for zone in zones:
        api = _api(config, zone)
        nodes = api.call(
            "listing TPU nodes", lambda api=api: list(api.client().list_nodes(parent=api.parent))
        )
        queued = list(
            api.call(
                "listing queued resources",
                lambda api=api: list(api.client().list_queued_resources(parent=api.parent)),
            )
        )
        ours_queued = {q.name: q for q in queued if _ours(_queued_labels(q))}
        by_queued: dict[str, list[Any]] = {}
        for node in nodes:
            if node.queued_resource in ours_queued:
                by_queued.setdefault(node.queued_resource, []).append(node)
        for name, resource in ours_queued.items():
            leak = _queued_leak(resource, by_queued.get(name, []), zone, now)
            if leak is None and _all_ready(by_queued.get(name, [])):
                leak = _idle_leak(
                    _short(name), "queued resource", resource, by_queued[name], zone, idle_s, now, bucket()
                )
            if leak is not None:
                leaks.append(leak)
        for node in nodes:
            if node.queued_resource in ours_queued or not _ours(dict(node.labels)):
                continue
            state = node.state.name
            leak = None
            if state in DEAD_NODE_STATES:
                leak = _node_leak(node, zone, state, f"node {state}", _age(node.create_time, now), "created")
            elif state == "READY":
                leak = _idle_leak(_short(node.name), "node", None, [node], zone, idle_s, now, bucket())
            if leak is not None:
                leaks.append(leak)
    return leaks


def delete_leaks(config: ClusterConfig, leaks: list[Leak], on_done: Callable[[Leak], None]) -> list[Leak]:
    """Delete each leak (a queued resource with ``force``: its nodes go with it) and report it through
    ``on_done``, deleted or with the error that stopped it; one failure does not stop the others."""
    for leak in leaks:
        try:
            if leak.kind == "compute slices":
                from tpuft.ops.gc_compute import delete_compute_leak

                delete_compute_leak(config, leak)
            else:
                _delete_tpu_leak(config, leak)
            leak.deleted = True
        except TpuftError as exc:
            leak.error = str(exc)
        on_done(leak)
    return leaks


def _delete_tpu_leak(config: ClusterConfig, leak: Leak) -> None:
    """Deleted as ``tpuft delete`` deletes: forced, waited out of a transition, read back until gone."""
    from tpuft.providers.gcp.nodes import delete_node, delete_queued_resource

    api = _api(config, leak.zone)
    if leak.kind == "queued resource":
        delete_queued_resource(api, leak.name, None)
    else:
        delete_node(api, leak.name, None)


def bucket_runs(config: ClusterConfig) -> list[dict[str, Any]]:
    """Each run in the cluster's bucket as (cluster, live, last sign of life): what tells an idle node from a
    busy one."""
    from tpuft.readers.runs import list_runs

    return [activity for run in list_runs(config) if (activity := run_activity(run.storage)) is not None]


def run_activity(storage: Any, now: float | None = None) -> dict[str, Any] | None:
    """``{"run", "cluster", "live", "last"}`` of one run dir; None without a run.json. ``last``: the latest of
    its start, end, attempts' ends, heartbeats and supervisor records."""
    from tpuft.readers.runs import read_run_info

    now = time.time() if now is None else now
    info = read_run_info(storage)
    if info is None:
        return None
    stamps = [info.get("started"), info.get("ended")]
    stamps += [a.get("ended") for a in info.get("attempts") or [] if isinstance(a, dict)]
    if info.get("status") == "running":
        for worker in range(int(info.get("workers") or 1)):
            stamps.append((rundir.read_heartbeat(storage, worker) or {}).get("time"))
        records = rundir.attempt_records(storage, int(info.get("attempt") or 1))
        stamps += [r.get("alive") for r in records.values()]
    last = max((float(s) for s in stamps if isinstance(s, (int, float))), default=None)
    live = info.get("status") == "running" and last is not None and now - last < LIVE_WITHIN_S
    return {"run": info.get("run_id"), "cluster": info.get("cluster"), "live": live, "last": last}


# -- one resource ------------------------------------------------------------------------------------------
def _queued_leak(resource: Any, nodes: list[Any], zone: str, now: float) -> Leak | None:
    state = resource.state.state.name
    reason = ""
    if state in DEAD_QUEUED_STATES:
        reason = f"queued resource {state}"
        if state == "FAILED" and resource.state.failed_data.error.message:
            reason += f": {resource.state.failed_data.error.message}"
    else:
        dead = [n for n in nodes if n.state.name in DEAD_NODE_STATES]
        if dead:
            reason = "; ".join(f"node {_short(n.name)} {n.state.name}" for n in dead)
            state = ",".join(sorted({n.state.name for n in dead}))
    if not reason:
        return None
    return _queued_record(resource, nodes, zone, state, reason, _age(resource.create_time, now), "created")


def _idle_leak(
    name: str,
    kind: str,
    resource: Any,
    nodes: list[Any],
    zone: str,
    idle_s: float,
    now: float,
    runs: list[dict[str, Any]],
) -> Leak | None:
    """A READY node (or queued resource) whose runs are not live and were last alive longer than ``idle_s``
    ago."""
    mine = [r for r in runs if r.get("cluster") == name]
    if any(r["live"] for r in mine):
        return None
    created = max((_unix(n.create_time) or 0.0) for n in nodes)
    last = max([created, *(r["last"] for r in mine if r["last"] is not None)])
    if now - last < idle_s:
        return None
    used = (
        f"its last run {max(mine, key=lambda r: r['last'] or 0)['run']} ended"
        if mine
        else "no run has used it"
    )
    reason = f"READY with no live run ({used}) for {_hours(now - last)}"
    if resource is not None:
        return _queued_record(resource, nodes, zone, "ACTIVE", reason, now - last, "idle")
    return _node_leak(nodes[0], zone, "READY", reason, now - last, "idle")


def _node_leak(node: Any, zone: str, state: str, reason: str, age: float | None, age_of: str) -> Leak:
    scheduling = node.scheduling_config
    pricing = cost.pricing_of(scheduling.spot, scheduling.preemptible, scheduling.reserved)
    accelerator = node.accelerator_type
    return Leak(
        "node",
        _short(node.name),
        zone,
        state,
        reason,
        accelerator,
        pricing,
        _price(accelerator, pricing, 1),
        age,
        age_of,
        [_short(node.name)],
    )


def _queued_record(
    resource: Any, nodes: list[Any], zone: str, state: str, reason: str, age: float | None, age_of: str
) -> Leak:
    specs = list(resource.tpu.node_spec)
    accelerator = specs[0].node.accelerator_type if specs else ""
    count = sum(max(1, s.multislice_params.node_count) for s in specs) or 1
    pricing = cost.pricing_of(spot="spot" in resource, reservation=resource.reservation_name or None)
    return Leak(
        "queued resource",
        _short(resource.name),
        zone,
        state,
        reason,
        accelerator,
        pricing,
        _price(accelerator, pricing, count),
        age,
        age_of,
        [_short(n.name) for n in nodes],
    )


# -- helpers -----------------------------------------------------------------------------------------------
def _api(config: ClusterConfig, zone: str) -> TpuApi:
    assert config.gcp.project is not None  # zones_of refused a cluster file without one
    return TpuApi(config.gcp.project, zone, "", 1, config.gcp.tpu_api_endpoint, config.gcp.timeout)


def _queued_labels(resource: Any) -> dict[str, str]:
    """A queued resource has no labels of its own: tpuft's are on its node spec (every spec carries them)."""
    specs = list(resource.tpu.node_spec)
    return dict(specs[0].node.labels) if specs else {}


def _all_ready(nodes: list[Any]) -> bool:
    return bool(nodes) and all(n.state.name == "READY" for n in nodes)


def _price(accelerator: str, pricing: str, slices: int) -> float | None:
    chips = cost.chips_of(accelerator, slices)
    price = cost.price_per_chip_hour(accelerator, pricing)
    return None if chips is None or price is None else round(chips * price, 4)


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]
