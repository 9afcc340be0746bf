"""TPU VM nodes and queued resources: what to ask for, creating, reading and deleting them.

The node's ``network_endpoints`` are the workers, in order (index i is ``--worker i``). The API's own state
words (READY, CREATING, PREEMPTED, ...; ACCEPTED, PROVISIONING, ACTIVE, FAILED, SUSPENDED for queued
resources) are passed through.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuft.config import parse_duration
from tpuft.core.accelerators import AcceleratorType
from tpuft.core.records import Cluster, Progress, State, Worker
from tpuft.core.waiting import waiting
from tpuft.providers.gcp import maintenance, tuning
from tpuft.providers.gcp.api import GcpError, TpuApi

if TYPE_CHECKING:
    from tpuft.config import GcpConfig

BAD_STATES = {
    "PREEMPTED",
    "TERMINATED",
    "STOPPED",
    "STOPPING",
    "DELETING",
    "REPAIRING",
    "HIDING",
    "HIDDEN",
    "UNHIDING",
}
QUEUED_FAILED = {"FAILED", "SUSPENDED", "SUSPENDING"}
IN_TRANSITION = {"SUSPENDING", "DELETING"}
"""States a delete waits out: a queued resource being suspended is deleted once SUSPENDED, not mid-way."""
NOT_NOW = {"Conflict", "Aborted", "FailedPrecondition"}
"""Refusals of a delete that asking again later can cure (a resource just created, or being changed)."""


@dataclass(frozen=True)
class CreateRequest:
    """One create call: the RPC, its parent and id, and the message (a ``tpu_v2`` Node or QueuedResource)."""

    rpc: str
    parent: str
    id_field: str
    id: str
    message: Any

    def body(self) -> dict[str, Any]:
        """The message as the REST body carries it (camelCase; proto3: fields at their defaults left out)."""
        from google.protobuf import json_format

        return json_format.MessageToDict(type(self.message).pb(self.message))


class TpuNodes:
    """The cluster's node(s) as the cluster file describes them (``gcp``) and as the API has them."""

    def __init__(self, api: TpuApi, gcp: GcpConfig, accelerator: AcceleratorType) -> None:
        self.api = api
        self.gcp = gcp
        self.accelerator = accelerator
        self.queue_wait: tuple[float, float] | None = None
        """(start, seconds) of the last queued resource's wait for capacity, until PROVISIONING
        (tpuft.run.goodput)."""

    # -- the create requests --------------------------------------------------------------------------------
    # What gcloud sends for the same intent (google-cloud-sdk, GA track, API v2; see docs/gcp.md, "What create
    # sends"): ``tpu-vm create`` puts spot / preemptible / reserved in the node's ``schedulingConfig``;
    # ``queued-resources create`` leaves the node's scheduling alone and says it once, on the queued resource
    # (``spot: {}``, or a ``reservationName`` for reserved capacity). tests/providers/test_create_bodies.py
    # pins each body against gcloud's.
    def node_spec(self, *, queued: bool = False) -> Any:
        """The Node to create; ``queued``: as a queued resource's node spec, whose tier is the queued
        resource's."""
        from google.cloud import tpu_v2

        gcp = self.gcp
        node = tpu_v2.Node(
            runtime_version=gcp.runtime_version or self.accelerator.default_runtime,
            labels={"created-by": "tpuft", **gcp.labels},
            metadata=dict(gcp.metadata),
            network_config=tpu_v2.NetworkConfig(
                network=gcp.network or "default",  # gcloud's --network default; the API's too
                subnetwork=gcp.subnetwork or "",
                enable_external_ips=not gcp.internal_ip,
            ),
        )
        if not queued:
            node.scheduling_config = tpu_v2.SchedulingConfig(
                preemptible=gcp.preemptible, spot=gcp.spot, reserved=gcp.reserved
            )
        elif (
            gcp.preemptible
        ):  # no queued-resource tier says preemptible (gcloud has no flag for it): the node does
            node.scheduling_config = tpu_v2.SchedulingConfig(preemptible=True)
        if gcp.topology:
            generation = self.accelerator.generation.name
            type_name = {"v5litepod": "V5LITE_POD", "v5p": "V5P", "v6e": "V6E"}.get(
                generation, generation.upper()
            )
            node.accelerator_config = tpu_v2.AcceleratorConfig(type_=type_name, topology=gcp.topology)
        else:
            node.accelerator_type = self.accelerator.name
        if gcp.service_account:
            node.service_account = tpu_v2.ServiceAccount(email=gcp.service_account, scope=list(gcp.scopes))
        return node

    def reservation_name(self) -> str:
        """gcloud's: a reservation's short name in this project and zone, a full path as it is, and for plain
        ``reserved`` any reservation of the project in the zone (``.../reservations/-``)."""
        gcp, api = self.gcp, self.api
        if gcp.reservation:
            if "/" in gcp.reservation:
                return gcp.reservation
            return f"projects/{api.project}/locations/{api.zone}/reservations/{gcp.reservation}"
        return f"projects/{api.project}/locations/{api.zone}/reservations/-" if gcp.reserved else ""

    def queued_resource(self) -> Any:
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2, timestamp_pb2

        api, gcp = self.api, self.gcp
        QR = tpu_v2.QueuedResource
        spec = QR.Tpu.NodeSpec(parent=api.parent, node=self.node_spec(queued=True))
        if gcp.slices > 1:
            spec.multislice_params = QR.Tpu.NodeSpec.MultisliceParams(
                node_count=gcp.slices, node_id_prefix=api.name
            )
        else:
            spec.node_id = api.name
        resource = QR(tpu=QR.Tpu(node_spec=[spec]))
        if gcp.spot:
            resource.spot = QR.Spot()
        reservation = self.reservation_name()
        if reservation:
            resource.reservation_name = reservation
        if gcp.valid_until:
            seconds = parse_duration(gcp.valid_until)
            if seconds is not None:
                resource.queueing_policy = QR.QueueingPolicy(
                    valid_until_duration=duration_pb2.Duration(seconds=seconds)
                )
            else:
                stamp = timestamp_pb2.Timestamp()
                stamp.FromJsonString(gcp.valid_until)
                resource.queueing_policy = QR.QueueingPolicy(valid_until_time=stamp)
        return resource

    def create_request(self) -> CreateRequest:
        """The one create call, as it will be sent: what ``create`` sends and ``--dry-run`` shows."""
        if self.gcp.queued:
            return CreateRequest(
                "CreateQueuedResource",
                self.api.parent,
                "queuedResourceId",
                self.api.name,
                self.queued_resource(),
            )
        return CreateRequest("CreateNode", self.api.parent, "nodeId", self.api.name, self.node_spec())

    @staticmethod
    def shape_of(node: Any) -> str:
        if node.accelerator_type:
            return str(node.accelerator_type)
        config = node.accelerator_config
        return f"{config.type_.name if hasattr(config.type_, 'name') else config.type_}:{config.topology}"

    def wanted_shape(self) -> str:
        return self.shape_of(self.node_spec())

    # -- creating -------------------------------------------------------------------------------------------
    def create_node(self, progress: Progress | None) -> None:
        api = self.api
        node_id = api.name
        node = self.create_request().message
        operation = api.call(
            "creating TPU node", api.client().create_node, parent=api.parent, node_id=node_id, node=node
        )
        api.wait_operation(
            f"creating TPU node {node_id}", operation, progress, lambda: f"state {self.node_state(node_id)}"
        )

    def create_queued(self, progress: Progress | None) -> None:
        api = self.api
        operation = api.call(
            "creating queued resource",
            api.client().create_queued_resource,
            parent=api.parent,
            queued_resource_id=api.name,
            queued_resource=self.create_request().message,
        )
        api.wait_operation(f"creating queued resource {api.name}", operation, progress, None)
        what = f"Cloud TPU capacity for queued resource {api.name} (ACTIVE once the chips are granted)"
        queued, self.queue_wait = time.time(), None
        with waiting(what, tuning.CREATE_TIMEOUT_S * 24, progress=progress) as wait:
            while True:
                state, problem = self.queued_state()
                if self.queue_wait is None and state in ("PROVISIONING", "ACTIVE"):
                    self.queue_wait = (queued, time.time() - queued)
                if state == "ACTIVE":
                    return
                if state in QUEUED_FAILED:
                    raise GcpError(
                        f"queued resource {api.name} is {state}: {problem or 'no reason given'}",
                        hint="Delete it (tpuft delete --yes) so it stops holding quota, then retry or change "
                        "zone/shape.",
                    )
                wait.update(state)
                if wait.expired():
                    raise GcpError(f"queued resource {api.name} still {state}", hint="See: tpuft status")
                time.sleep(tuning.POLL_SECONDS)

    # -- reading --------------------------------------------------------------------------------------------
    def queued_state(self) -> tuple[str, str]:
        resource = _get_queued(self.api, self.api.queued_path())
        state = resource.state.state.name
        problem = ""
        if state == "FAILED":
            problem = resource.state.failed_data.error.message
        return state, problem

    def node_state(self, node_id: str) -> str:
        """The node's state for a progress line: REQUESTED before it exists, ``unknown`` when unreadable."""
        try:
            return _node_state(self.api, node_id) or "REQUESTED"
        except GcpError as exc:
            return f"unknown ({getattr(exc, 'kind', 'error')})"

    def describe(
        self, provider: str, accelerator: str, bucket: str
    ) -> tuple[Cluster, list[list[Any]] | None]:
        """The cluster as the API has it, and (when any node exists) [node id, the API's ``id``, worker count]
        per slice, which is what tells a recreated node from the one seen before."""
        from google.api_core import exceptions as gexc

        api = self.api
        queued_state = ""
        queued_problem = ""
        if self.gcp.queued:
            try:
                queued_state, queued_problem = self.queued_state()
            except gexc.NotFound:
                pass
        found: list[tuple[int, Any]] = []
        found_ids = []
        slice_states: dict[str, str] = {}
        for slice_id, node_id in enumerate(api.node_ids()):
            try:
                node = api.call(
                    "reading TPU node", api.client().get_node, name=api.node_path(node_id), missing_ok=True
                )
            except gexc.NotFound:
                slice_states[f"slice {slice_id}"] = f"{node_id} {State.NOT_FOUND}"
                continue
            found.append((slice_id, node))
            found_ids.append(node_id)
            slice_states[f"slice {slice_id}"] = f"{node_id} {node.state.name}"
        details: dict[str, str] = {"project": api.project, "zone": api.zone}
        if queued_state:
            details["queued_resource"] = queued_state
            if queued_problem:
                details["problem"] = queued_problem
        if api.slices > 1:  # each slice's node and state: which one a lost multislice run lost
            details.update(slice_states)
        if not found:
            state = queued_state or State.NOT_FOUND
            return Cluster(api.name, provider, state, accelerator, [], bucket, details), None
        workers: list[Worker] = []
        states = []
        for slice_id, node in found:
            states.append(node.state.name)
            for endpoint in node.network_endpoints:
                external = endpoint.access_config.external_ip if endpoint.access_config else ""
                address = endpoint.ip_address if self.gcp.internal_ip or not external else external
                workers.append(
                    Worker(
                        index=len(workers),
                        address=address,
                        internal_address=endpoint.ip_address,
                        slice=slice_id,
                    )
                )
        nodes = [node for _, node in found]
        details["shape"] = self.shape_of(nodes[0])
        details["health"] = ", ".join(sorted({n.health.name for n in nodes if n.health}))
        symptoms = [s.details for n in nodes for s in n.symptoms]
        if symptoms:
            details["symptoms"] = "; ".join(symptoms)
        details.update(
            maintenance.details(api, [i for i, n in zip(found_ids, nodes) if n.state.name == State.READY])
        )
        if len(nodes) < len(api.node_ids()):
            details["problem"] = f"{len(nodes)} of {len(api.node_ids())} slices exist"
        state = states[0] if len(set(states)) == 1 else ",".join(states)
        if len(nodes) < len(api.node_ids()) and state == State.READY:
            state = State.BROKEN
        cluster = Cluster(api.name, provider, state, self.shape_of(nodes[0]), workers, bucket, details)
        identity = [
            [node_id, str(node.id), len(node.network_endpoints)] for node_id, node in zip(found_ids, nodes)
        ]
        return cluster, identity

    # -- deleting -------------------------------------------------------------------------------------------
    def delete(self, progress: Progress | None) -> bool:
        """Delete the queued resource (forced, so its nodes go with it and no abandoned request keeps holding
        quota) or else each node. Returns False when there was nothing to delete."""
        api = self.api
        if self.gcp.queued and delete_queued_resource(api, api.name, progress):
            return True
        deleted = False
        for node_id in api.node_ids():
            deleted |= delete_node(api, node_id, progress)
        return deleted


def delete_queued_resource(api: TpuApi, queued_id: str, progress: Progress | None) -> bool:
    """Delete a queued resource of the API's project and zone, forced (its nodes go with it), confirmed
    (:func:`_delete_confirmed`). Returns whether it existed."""
    from google.cloud import tpu_v2

    name = api.queued_path(queued_id)
    request = tpu_v2.DeleteQueuedResourceRequest(name=name, force=True)
    return _delete_confirmed(
        api,
        f"queued resource {queued_id}",
        lambda: _queued_state(api, name),
        lambda: api.call(
            "deleting queued resource", api.client().delete_queued_resource, request=request, missing_ok=True
        ),
        progress,
    )


def delete_node(api: TpuApi, node_id: str, progress: Progress | None) -> bool:
    """Delete a TPU node of the API's project and zone, confirmed (:func:`_delete_confirmed`). Returns
    whether it existed."""
    return _delete_confirmed(
        api,
        f"TPU node {node_id}",
        lambda: _node_state(api, node_id),
        lambda: api.call(
            "deleting TPU node", api.client().delete_node, name=api.node_path(node_id), missing_ok=True
        ),
        progress,
    )


def _delete_confirmed(
    api: TpuApi,
    what: str,
    state: Callable[[], str | None],
    issue: Callable[[], Any],
    progress: Progress | None,
) -> bool:
    """Delete one resource and read it back until it is gone: a delete that did not take is issued again, a
    resource in the middle of a change (SUSPENDING, DELETING) is waited out rather than deleted
    mid-transition, and a refusal that says "not now" (409, a failed precondition: a resource just created)
    is asked again after a poll, up to ``tuning.DELETE_TRIES`` calls in all. Returns whether it existed."""
    from google.api_core import exceptions as gexc

    tries = 0
    existed = False
    with waiting(f"{what} to be gone", tuning.CREATE_TIMEOUT_S, progress=progress) as wait:
        while True:
            now = state()
            if now is None:
                return existed
            existed = True
            if now not in IN_TRANSITION:
                if tries >= tuning.DELETE_TRIES:
                    raise GcpError(
                        f"{what} is still {now} after {tries} delete calls in project {api.project}, "
                        f"zone {api.zone}",
                        hint="It may keep holding quota: delete it in the console or with gcloud, and see "
                        "tpuft gc",
                    )
                tries += 1
                try:
                    operation = issue()
                except gexc.NotFound:
                    return True
                except GcpError as exc:
                    if getattr(exc, "kind", "") not in NOT_NOW:
                        raise
                    wait.update(f"{now}; the API said not now ({getattr(exc, 'kind', '')})")
                else:
                    api.wait_operation(
                        f"deleting {what}", operation, progress, lambda: f"state {state() or 'gone'}"
                    )
                    continue  # read it back
            else:
                wait.update(now)
            if wait.expired():
                raise GcpError(f"{what} still {now}", hint="See: tpuft status")
            time.sleep(tuning.POLL_SECONDS)


def _get_queued(api: TpuApi, name: str) -> Any:
    """The queued resource ``name``; NotFound is raised as it is (absence is an answer)."""
    return api.call("reading queued resource", api.client().get_queued_resource, name=name, missing_ok=True)


def _queued_state(api: TpuApi, name: str) -> str | None:
    """A queued resource's state, None once it is gone."""
    from google.api_core import exceptions as gexc

    try:
        return str(_get_queued(api, name).state.state.name)
    except gexc.NotFound:
        return None


def _node_state(api: TpuApi, node_id: str) -> str | None:
    """A node's state, None once it is gone."""
    from google.api_core import exceptions as gexc

    try:
        node = api.call(
            "reading TPU node", api.client().get_node, name=api.node_path(node_id), missing_ok=True
        )
    except gexc.NotFound:
        return None
    return str(node.state.name)
