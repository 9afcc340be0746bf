"""``tpuft drill maintenance|preempt --worker I``: make the infrastructure do to one worker what maintenance
or a preemption would, so that a run's handling of it (checkpoint before the window, recovery) is exercised on
purpose.

On GCP, ``maintenance`` is the TPU API's own simulation (``SimulateMaintenanceEvent``, v2alpha1): the worker's
metadata server announces a window and the node shows it, as for real maintenance. ``preempt`` has no
simulation in the TPU API (none for TPU VMs in v2 or v2alpha1); the nearest real action is ``StopNode``, which
takes the whole node to STOPPED, as a preemption takes it to PREEMPTED: the run's workers are gone and a
watcher recovers it. The result says which action was taken.

With ``gcp.api: compute`` both are the worker's own instance's: ``maintenance`` is Compute Engine's
``simulateMaintenanceEvent`` (a TPU host is not live-migrated: its maintenance is a stop, announced on the
metadata server first), ``preempt`` is ``instances.stop`` of that host, which leaves it TERMINATED as a spot
preemption with termination action STOP does.

On the local pod, ``maintenance`` writes the worker's notice file (``~/.tpuft/upcoming-maintenance.json`` in
its home, what its supervisor reads in place of a metadata server) with a window ``--notice`` seconds ahead;
``preempt`` kills the worker's supervisor and trainer with SIGKILL, which is what a VM going away does to
them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.core.records import Cluster, Worker
from tpuft.host.state import STATE_DIR
from tpuft.providers import get_provider
from tpuft.run.maintenance_asks import notice_file
from tpuft.run.maintenance_window import Window, rfc3339

KINDS = ("maintenance", "preempt")


@dataclass
class DrillResult:
    kind: str
    worker: int
    provider: str
    action: str
    """What was done, in the API's or the rig's words."""
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DrillPlan:
    """What a drill is about to do, for the confirmation: the cluster, the worker, the run it disturbs and, on
    GCP, the node and what happens to it."""

    kind: str
    cluster: str
    worker: int
    runs: tuple[str, ...]
    """The live runs on the cluster (what the drill is for)."""
    what: str
    """The action, in a few words (``stop TPU node tp: every worker of it``)."""


Confirm = Callable[[DrillPlan], None]
"""Asked before a drill acts on a cloud resource, as ``delete`` asks; raises to say no."""


def drill(
    config: ClusterConfig,
    kind: str,
    worker: int,
    *,
    notice: float = 60.0,
    lasts: float = 600.0,
    confirm: Confirm | None = None,
) -> DrillResult:
    """Do it. A cluster that is not READY, a worker it does not have, or no live run on it (nothing for the
    drill to exercise) is a usage error (exit 2), before anything is asked or done; on GCP, ``confirm`` is
    asked before the TPU API is (a simulated maintenance event or a stopped node are real, for every run on
    the node); the local pod's drills touch only its own folders and processes, and are not asked about."""
    if kind not in KINDS:
        raise UsageError(f"tpuft drill: unknown drill {kind!r}; one of: {', '.join(KINDS)}")
    provider = get_provider(config)
    cluster = provider.get()
    if cluster.state != "READY":
        raise UsageError(
            f"tpuft drill {kind}: cluster {config.name} is {cluster.state}, not READY",
            hint="See: tpuft status",
        )
    if not 0 <= worker < len(cluster.workers):
        raise UsageError(
            f"tpuft drill {kind}: --worker {worker}: cluster {config.name} has workers "
            f"0..{len(cluster.workers) - 1}"
        )
    runs = live_runs(config)
    if not runs:
        raise UsageError(
            f"tpuft drill {kind}: no run is training on cluster {config.name} (none live in "
            f"{provider.storage_url()}): there is nothing for the drill to exercise, so nothing was done",
            hint="Start a run first (tpuft up RECIPE), then drill it; see: tpuft runs",
        )
    target = cluster.workers[worker]
    if provider.name == "gcp":
        plan = DrillPlan(kind, config.name, worker, tuple(runs), _gcp_action(provider, cluster, kind, target))
        if confirm is not None:
            confirm(plan)
        return _on_gcp(provider, cluster, kind, target)
    return _on_local(kind, target, notice, lasts)


def live_runs(config: ClusterConfig) -> list[str]:
    """The ids of the runs on this cluster that live (run.json running, a heartbeat or supervisor record
    fresher than :data:`tpuft.ops.gc.LIVE_WITHIN_S`), from the run storage: what ``gc`` tells a busy node from
    an idle one by."""
    from tpuft.ops.gc import bucket_runs

    return [str(r["run"]) for r in bucket_runs(config) if r["live"] and r["cluster"] == config.name]


def _gcp_action(provider: Any, cluster: Cluster, kind: str, target: Worker) -> str:
    node_id = provider.node_ids()[target.slice]
    host = target.index - sum(1 for w in cluster.workers if w.slice < target.slice)
    if provider.compute:
        instance = provider.nodes.host_name(node_id, host)
        if kind == "maintenance":
            return f"simulate a maintenance event on instance {instance} (host {host} of slice {node_id})"
        return f"stop instance {instance} (host {host} of slice {node_id}), as a spot preemption does"
    if kind == "maintenance":
        return f"simulate a maintenance event on TPU node {node_id}, its worker {host}"
    return f"stop TPU node {node_id}: every worker of it, not only worker {target.index}"


def _on_gcp(provider: Any, cluster: Cluster, kind: str, target: Worker) -> DrillResult:
    node_id = provider.node_ids()[target.slice]
    host = target.index - sum(1 for w in cluster.workers if w.slice < target.slice)
    if provider.compute:
        return _on_compute(provider, kind, target, node_id, host)
    from tpuft.providers.gcp import maintenance

    api = provider.api
    if kind == "maintenance":
        operation = maintenance.simulate(api, node_id, host)
        return DrillResult(
            kind,
            target.index,
            "gcp",
            "SimulateMaintenanceEvent (TPU API v2alpha1)",
            {"node": node_id, "node_worker": host, "operation": operation.get("name", "")},
        )
    operation = maintenance.stop_node(api, node_id)
    api.wait_operation(f"stopping TPU node {node_id}", operation, None, None)
    return DrillResult(
        kind,
        target.index,
        "gcp",
        maintenance.SIMULATED_PREEMPTION,
        {"node": node_id, "node_worker": host, "note": "the whole node stops, every worker of it"},
    )


def _on_compute(provider: Any, kind: str, target: Worker, slice_id: str, host: int) -> DrillResult:
    slices = provider.nodes
    instance = slices.host_name(slice_id, host)
    if kind == "maintenance":
        operation = slices.simulate_maintenance(instance)
        return DrillResult(
            kind,
            target.index,
            "gcp",
            "instances.simulateMaintenanceEvent (Compute Engine)",
            {"slice": slice_id, "instance": instance, "operation": operation},
        )
    slices.stop_host(instance)
    return DrillResult(
        kind,
        target.index,
        "gcp",
        "instances.stop (Compute Engine; the host is TERMINATED, as a spot preemption with termination "
        "action STOP leaves it)",
        {"slice": slice_id, "instance": instance, "note": "the slice's other hosts run on; the run is lost"},
    )


def _on_local(kind: str, target: Worker, notice: float, lasts: float) -> DrillResult:
    if target.home is None:
        raise UsageError(f"tpuft drill {kind}: worker {target.index} has no home folder on this machine")
    if kind == "maintenance":
        start = time.time() + notice
        window = Window("UNSCHEDULED", "PENDING", start, start + lasts)
        path = notice_file(target.home)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "type": window.kind,
                    "maintenance_status": window.status,
                    "window_start_time": rfc3339(start),
                    "window_end_time": rfc3339(start + lasts),
                }
            )
        )
        return DrillResult(
            kind,
            target.index,
            "local",
            "the worker's maintenance notice file",
            {"path": str(path), "window": window.describe()},
        )
    current = (
        json.loads((target.home / STATE_DIR / "current.json").read_text() or "{}")
        if (target.home / STATE_DIR / "current.json").exists()
        else {}
    )
    killed = []
    for key in ("trainer_pid", "supervisor_pid"):
        pid = current.get(key)
        if isinstance(pid, int) and current.get("status") != "ended":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if key == "trainer_pid":
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    if not killed:
        raise UsageError(f"tpuft drill preempt: worker {target.index} runs nothing to preempt")
    return DrillResult(
        kind,
        target.index,
        "local",
        "SIGKILL of the worker's supervisor and trainer (a VM going away)",
        {"killed": killed},
    )
