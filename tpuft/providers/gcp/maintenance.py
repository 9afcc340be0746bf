"""Maintenance through the Cloud TPU API: a node's upcoming maintenance, a simulated maintenance event, a
stop.

The v2 API (``tpu_v2``, which the rest of this provider uses) has neither: ``Node.upcoming_maintenance`` and
``SimulateMaintenanceEvent`` are in ``v2alpha1`` only, and google-cloud-tpu ships no REST transport for
v2alpha1 (gRPC only). So these two calls go as REST requests of their own, through the v2 client's authorized
session (the same credentials, endpoint and network budget), as ``{endpoint}/v2alpha1/{name}`` and
``...:simulateMaintenanceEvent``; an error answer becomes google-api-core's exception for its HTTP status, so
:meth:`TpuApi.call` treats it as any other call's. There is no preemption simulation for TPU VMs in any
version of the API; ``StopNode`` (v2) is the nearest real action, and ``tpuft drill preempt`` says so when it
uses it.
"""

from __future__ import annotations

from typing import Any

from tpuft.providers.gcp.api import TpuApi
from tpuft.run.maintenance_window import Window

SIMULATED_PREEMPTION = (
    "StopNode (the TPU API has no preemption simulation; a stopped node is what the watcher sees)"
)


def _alpha(
    api: TpuApi, method: str, *, name: str, verb: str = "", body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One v2alpha1 REST request about ``name`` (``projects/.../nodes/N``), with ``:verb`` if given; its
    JSON."""
    from google.api_core import exceptions as gexc

    transport = api.client()._transport
    host = str(transport._host).rstrip("/")
    if "://" not in host:
        host = f"https://{host}"
    response = transport._session.request(
        method, f"{host}/v2alpha1/{name}{':' + verb if verb else ''}", json=body, timeout=30
    )
    if response.status_code >= 400:
        raise gexc.from_http_response(response)
    answer: dict[str, Any] = response.json() if response.content else {}
    return answer


def upcoming(api: TpuApi, node_id: str) -> dict[str, Any] | None:
    """The node's ``upcomingMaintenance`` (the API's camelCase JSON), or None when none is announced."""
    node = api.call("reading TPU node maintenance", _alpha, api, "GET", name=api.node_path(node_id))
    window = node.get("upcomingMaintenance")
    return window if isinstance(window, dict) and window else None


def details(api: TpuApi, node_ids: list[str]) -> dict[str, str]:
    """``maintenance`` (and ``maintenance <node>`` on several slices) for the cluster's details. Best effort:
    a refused or failed v2alpha1 call is said in the details (``maintenance: unknown (...)``), never raised,
    since the node's state, which the v2 call gave, is what the caller came for."""
    from tpuft.providers.gcp.api import GcpError

    found: dict[str, str] = {}
    for node_id in node_ids:
        key = "maintenance" if len(node_ids) == 1 else f"maintenance {node_id}"
        try:
            window = upcoming(api, node_id)
        except GcpError as exc:
            found[key] = f"unknown ({exc.message.split(': ')[-1][:120]})"
            continue
        if window is not None:
            found[key] = Window.of(window).describe()
    return found


def simulate(api: TpuApi, node_id: str, worker: int) -> dict[str, Any]:
    """Ask the API to simulate a maintenance event on ``worker`` of the node (v2alpha1); the Operation
    JSON."""
    return api.call(
        "simulating a maintenance event on TPU node",
        _alpha,
        api,
        "POST",
        name=api.node_path(node_id),
        verb="simulateMaintenanceEvent",
        body={"workerIds": [str(worker)]},
    )


def stop_node(api: TpuApi, node_id: str) -> Any:
    """StopNode (v2): the nearest real action to a preemption; returns the long-running operation."""
    from google.cloud import tpu_v2

    return api.call(
        "stopping TPU node",
        api.client().stop_node,
        request=tpu_v2.StopNodeRequest(name=api.node_path(node_id)),
    )
