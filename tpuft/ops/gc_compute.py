"""``tpuft gc`` for ``gcp.api: compute``: the Compute Engine TPUs tpuft made that hold quota or bill with
nothing to show for it.

Compute Engine gives managed instance groups, instance templates and workload policies no labels, so what
tpuft made is found through what does carry them: the instance templates whose properties have
``created-by: tpuft`` (and ``tpuft-cluster: NAME``), the instances made from them, the groups whose template
is one of them, and the workload policy named after the template. One leak is one cluster's slices, deleted
whole (groups and lone instances, then the policy, then the template), as ``tpuft delete`` does:

* a host TERMINATED (a spot preemption with termination action STOP, or a stop) or SUSPENDED: the slice is
  broken and its disks and reservation hold on;
* a group still trying to make its hosts (a stockout: it retries by itself, and would start billing hours
  later, as an abandoned queued resource does), or a template with no instance or group (an interrupted
  create);
* every host RUNNING with no live run of the cluster for longer than ``idle_s``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.compute_tpus import MACHINE_TYPES
from tpuft.ops.leaks import Leak, age, hours, ours, unix
from tpuft.providers.gcp.compute_api import ComputeApi
from tpuft.providers.gcp.compute_bodies import CLUSTER_LABEL
from tpuft.run import cost

DEAD_STATUSES = frozenset({"TERMINATED", "SUSPENDED", "STOPPING", "SUSPENDING"})
KIND = "compute slices"


def find_compute_leaks(
    config: ClusterConfig,
    zones: list[str],
    idle_s: float,
    now: float,
    bucket: Callable[[], list[dict[str, Any]]],
) -> list[Any]:
    """Every leak of tpuft's Compute Engine TPUs in ``zones``; ``bucket()``: the runs' activity (read only
    when a cluster runs, to tell an idle one from a busy one)."""
    leaks = []
    for zone in zones:
        api = _api(config, zone)
        listed = api.call("listing instance templates", _listed, api, "templates", project=api.project)
        templates = [t for t in listed if ours(dict(t.properties.labels))]
        if not templates:
            continue
        instances = api.call("listing instances", _listed, api, "instances", project=api.project, zone=zone)
        groups = api.call(
            "listing managed instance groups", _listed, api, "groups", project=api.project, zone=zone
        )
        for template in templates:
            cluster = template.properties.labels.get(CLUSTER_LABEL, "")
            hosts = [i for i in instances if ours(dict(i.labels)) and i.labels.get(CLUSTER_LABEL) == cluster]
            mine = [g for g in groups if g.instance_template.rsplit("/", 1)[-1] == template.name]
            leak = _judge(cluster, zone, template, hosts, mine, idle_s, now, bucket)
            if leak is not None:
                leaks.append(leak)
    return leaks


def _judge(
    cluster: str,
    zone: str,
    template: Any,
    hosts: list[Any],
    groups: list[Any],
    idle_s: float,
    now: float,
    bucket: Callable[[], list[dict[str, Any]]],
) -> Any:
    """One cluster's slices as a leak, or None when they are fine (or busy, or not idle for long enough)."""

    def members(group: Any) -> int:
        return sum(1 for h in hosts if h.name.startswith(f"{group.name}-"))

    waiting = [g for g in groups if members(g) < g.target_size]
    dead = [h for h in hosts if h.status in DEAD_STATUSES]
    made = age(template.creation_timestamp, now)
    if dead:
        reason = "; ".join(f"instance {h.name} {h.status}" for h in dead)
        state = ",".join(sorted({h.status for h in dead}))
        return _leak(cluster, zone, state, reason, template, hosts, groups, made, "created")
    if waiting:
        reason = "; ".join(
            f"group {g.name} still creating its hosts ({g.target_size} wanted)" for g in waiting
        )
        return _leak(cluster, zone, "CREATING", reason, template, hosts, groups, made, "created")
    if not hosts and not groups:
        reason = "a template with no instance or group (an interrupted create?)"
        return _leak(cluster, zone, "EMPTY", reason, template, hosts, groups, made, "created")
    if not all(h.status == "RUNNING" for h in hosts):
        return None
    runs = [r for r in bucket() if r.get("cluster") == cluster]
    if any(r["live"] for r in runs):
        return None
    created = max((unix(h.creation_timestamp) or 0.0) for h in hosts)
    last = max([created, *(r["last"] for r in runs if r["last"] is not None)])
    if now - last < idle_s:
        return None
    used = (
        f"its last run {max(runs, key=lambda r: r['last'] or 0)['run']} ended"
        if runs
        else "no run has used it"
    )
    reason = f"RUNNING with no live run ({used}) for {hours(now - last)}"
    return _leak(cluster, zone, "READY", reason, template, hosts, groups, now - last, "idle")


def _listed(api: ComputeApi, kind: str, **where: str) -> list[Any]:
    return list(api.client(kind).list(**where))


def delete_compute_leak(config: ClusterConfig, leak: Any) -> None:
    """The cluster's groups and lone instances, then its policy and template; each waited for."""
    api = _api(config, leak.zone)
    region = api.region
    for name in leak.nodes:
        if name.startswith("group "):
            _delete(
                api,
                "groups",
                f"managed instance group {name[6:]}",
                zone=leak.zone,
                instance_group_manager=name[6:],
            )
        else:
            _delete(api, "instances", f"instance {name}", zone=leak.zone, instance=name)
    _delete(
        api,
        "policies",
        f"workload policy {leak.name}-tpuft",
        region=region,
        resource_policy=f"{leak.name}-tpuft",
    )
    _delete(api, "templates", f"instance template {leak.name}-tpuft", instance_template=f"{leak.name}-tpuft")


def _delete(api: ComputeApi, kind: str, what: str, **names: str) -> None:
    from google.api_core import exceptions as gexc

    try:
        operation = api.call(
            f"deleting {what}", api.client(kind).delete_unary, project=api.project, missing_ok=True, **names
        )
    except gexc.NotFound:
        return
    api.wait(f"deleting {what}", operation)


def _leak(
    cluster: str,
    zone: str,
    state: str,
    reason: str,
    template: Any,
    hosts: list[Any],
    groups: list[Any],
    age: float | None,
    age_of: str,
) -> Any:
    from tpuft.core.accelerators import GENERATIONS

    properties = template.properties
    machine = properties.machine_type.rsplit("/", 1)[-1]
    generation, chips_per_host = next(
        ((g, chips) for g, types in MACHINE_TYPES.items() for chips, m in types.items() if m == machine),
        ("", 0),
    )
    affinity = properties.reservation_affinity.consume_reservation_type
    pricing = cost.pricing_of(
        spot=properties.scheduling.provisioning_model == "SPOT",
        reserved=affinity in ("ANY_RESERVATION", "SPECIFIC_RESERVATION"),
    )
    count = max(len(hosts), sum(g.target_size for g in groups), 1)
    per_chip = GENERATIONS[generation].price(pricing) if generation else None
    price = None if per_chip is None else round(per_chip * chips_per_host * count, 4)
    grouped = {h.name for g in groups for h in hosts if h.name.startswith(f"{g.name}-")}
    nodes = [f"group {g.name}" for g in groups] + [h.name for h in hosts if h.name not in grouped]
    return Leak(
        KIND,
        cluster,
        zone,
        state,
        reason,
        f"{count} x {machine}",
        pricing,
        price,
        age,
        age_of,
        nodes,
    )


def _api(config: ClusterConfig, zone: str) -> ComputeApi:
    assert config.gcp.project is not None  # zones_of refused a cluster file without one
    return ComputeApi(config.gcp.project, zone, "", 1, config.gcp.compute_api_endpoint, config.gcp.timeout)
