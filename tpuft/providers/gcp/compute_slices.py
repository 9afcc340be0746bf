"""TPU slices as Compute Engine makes them (``gcp.api: compute``): what to ask for, creating, reading and
deleting them.

One instance template (global) describes a host: the TPU machine type, the generation's boot image, the
network, spot or reserved, the labels and the metadata (with ``enable-guest-attributes=TRUE``, without which
Compute Engine publishes no host keys and nothing could be pinned). A single-host slice is one instance made
from it; a multi-host slice is a managed instance group (MIG) of its hosts made from it, with a workload
policy (a regional resource policy: ``HIGH_THROUGHPUT`` and the slice's accelerator topology) that places them
on one ICI domain. A multislice cluster has one instance or MIG per slice (``NAME-0``, ``NAME-1``, ...), all
from the one template and policy.

Compute Engine gives MIGs, templates and policies no labels: what tpuft made is found by its names (derived
from the cluster's) and by the labels of the template and its instances (``created-by: tpuft`` and
``tpuft-cluster: NAME``).

The hosts of a slice are its workers in TPU worker-id order, the order the TPU runtime on the hosts uses: each
TPU VM's metadata carries its worker id (``TPU_WORKER_ID`` in ``tpu-env``, as Compute Engine fills it for a
TPU7x slice; ``agent-worker-number`` as on Cloud TPU API VMs), and a MIG's instance names (``NAME-xxxx``, a
random suffix) say nothing about it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tpuft.core.accelerators import AcceleratorType
from tpuft.core.records import DOWN_WORKERS, Cluster, Progress, State, Worker
from tpuft.core.waiting import waiting
from tpuft.providers.gcp import tuning
from tpuft.providers.gcp.api import GcpError
from tpuft.providers.gcp.compute_api import ComputeApi
from tpuft.providers.gcp.compute_bodies import CLUSTER_LABEL, ComputeBodies, ComputeRequest
from tpuft.providers.gcp.compute_hosts import ComputeHosts

if TYPE_CHECKING:
    from tpuft.config import GcpConfig

__all__ = ["CLUSTER_LABEL", "ComputeRequest", "ComputeSlices", "worker_number"]

STATUS_WORDS = {"RUNNING": State.READY, "PROVISIONING": State.CREATING, "STAGING": State.CREATING}
"""Compute Engine's instance statuses in the words the rest of tpuft reads (the others pass through:
STOPPING, TERMINATED, SUSPENDED, REPAIRING)."""


class ComputeSlices(ComputeBodies, ComputeHosts):
    """The cluster's slices as Compute Engine has them: created, read, deleted."""

    def __init__(self, api: ComputeApi, gcp: GcpConfig, accelerator: AcceleratorType) -> None:
        super().__init__(api, gcp, accelerator)
        self.queue_wait: tuple[float, float] | None = None
        """The TPU path's wait for a queued resource; Compute Engine has none (a MIG retries by itself)."""

    # -- creating -------------------------------------------------------------------------------------------
    def create(self, progress: Progress | None) -> None:
        """Make what is missing (template, policy, each slice), then wait until every host runs. Idempotent:
        a second ``create`` after an interrupted one finishes it."""
        api = self.api
        if not self._exists("templates", instance_template=api.template_name):
            operation = api.call(
                "creating instance template",
                api.client("templates").insert_unary,
                project=api.project,
                instance_template_resource=self.template(),
            )
            api.wait(f"creating instance template {api.template_name}", operation, progress)
        multi_host = self.shape.hosts > 1
        if multi_host and not self._exists("policies", region=api.region, resource_policy=api.policy_name):
            operation = api.call(
                "creating workload policy",
                api.client("policies").insert_unary,
                project=api.project,
                region=api.region,
                resource_policy_resource=self.policy(),
            )
            api.wait(f"creating workload policy {api.policy_name}", operation, progress)
        for slice_id in api.slice_ids():
            if multi_host:
                self._create_group(slice_id, progress)
            else:
                self._create_instance(slice_id, progress)
        self._wait_running(progress)

    def _exists(self, kind: str, **names: str) -> bool:
        from google.api_core import exceptions as gexc

        api = self.api
        try:
            api.call(f"reading {kind}", api.client(kind).get, project=api.project, missing_ok=True, **names)
        except gexc.NotFound:
            return False
        return True

    def _create_group(self, slice_id: str, progress: Progress | None) -> None:
        api = self.api
        if self._exists("groups", zone=api.zone, instance_group_manager=slice_id):
            return
        operation = api.call(
            "creating managed instance group",
            api.client("groups").insert_unary,
            project=api.project,
            zone=api.zone,
            instance_group_manager_resource=self.group(slice_id),
        )
        api.wait(f"creating managed instance group {slice_id}", operation, progress)

    def _create_instance(self, slice_id: str, progress: Progress | None) -> None:
        api = self.api
        if self._exists("instances", zone=api.zone, instance=slice_id):
            return
        from google.cloud import compute_v1 as compute

        request = compute.InsertInstanceRequest(
            project=api.project,
            zone=api.zone,
            instance_resource=self.instance(slice_id),
            source_instance_template=api.template_url(),
        )
        operation = api.call("creating TPU instance", api.client("instances").insert_unary, request=request)
        api.wait(f"creating TPU instance {slice_id}", operation, progress)

    def _wait_running(self, progress: Progress | None) -> None:
        """Until every slice has all its hosts RUNNING. A MIG keeps retrying a create that failed (a zone out
        of capacity): its last attempt's errors are shown while waiting, and named if the wait runs out."""
        what = f"the hosts of {self.api.name} to start ({self.shape.hosts} per slice)"
        with waiting(what, tuning.CREATE_TIMEOUT_S, progress=progress) as wait:
            while True:
                found = {slice_id: self.hosts(slice_id) for slice_id in self.api.slice_ids()}
                running = sum(1 for hosts in found.values() for h in hosts if h.status == "RUNNING")
                wanted = self.shape.hosts * len(found)
                if running == wanted and all(len(h) == self.shape.hosts for h in found.values()):
                    return
                said = self.attempt_errors()
                wait.update(f"{running} of {wanted} running{'; ' + said if said else ''}")
                if wait.expired():
                    raise GcpError(
                        f"{self.api.name}: {running} of {wanted} hosts running after "
                        f"{tuning.CREATE_TIMEOUT_S:.0f}s{': ' + said if said else ''}",
                        hint="See: tpuft status; a zone out of capacity: try another zone or spot",
                    )
                time.sleep(tuning.POLL_SECONDS)

    def attempt_errors(self) -> str:
        """The managed instances' last create attempts' errors (a stockout, a quota), said once each."""
        if self.shape.hosts == 1:
            return ""
        said: list[str] = []
        for slice_id in self.api.slice_ids():
            for managed in self._managed(slice_id):
                for error in managed.last_attempt.errors.errors if managed.last_attempt else ():
                    line = f"{error.code}: {error.message}"
                    if line not in said:
                        said.append(line)
        return "; ".join(said)

    # -- reading --------------------------------------------------------------------------------------------
    def _managed(self, slice_id: str) -> list[Any]:
        from google.api_core import exceptions as gexc

        api = self.api
        try:
            pages = api.call(
                "listing managed instances",
                api.client("groups").list_managed_instances,
                project=api.project,
                zone=api.zone,
                instance_group_manager=slice_id,
                missing_ok=True,
            )
        except gexc.NotFound:
            return []
        return list(pages)

    def hosts(self, slice_id: str) -> list[Any]:
        """The slice's instances in worker order (see the module's note); empty when the slice is not
        there."""
        from google.api_core import exceptions as gexc

        api = self.api
        if self.shape.hosts == 1:
            try:
                return [
                    api.call(
                        "reading TPU instance",
                        api.client("instances").get,
                        project=api.project,
                        zone=api.zone,
                        instance=slice_id,
                        missing_ok=True,
                    )
                ]
            except gexc.NotFound:
                return []
        from google.cloud import compute_v1 as compute

        request = compute.ListInstancesRequest(
            project=api.project, zone=api.zone, filter=f"labels.{CLUSTER_LABEL}={api.name}"
        )
        members = api.call("listing the slice's instances", api.client("instances").list, request=request)
        named = [i for i in members if _slice_of(i.name, api) == slice_id]
        return sorted(named, key=lambda instance: (worker_number(instance), instance.name))

    def describe(
        self, provider: str, accelerator: str, bucket: str
    ) -> tuple[Cluster, list[list[Any]] | None]:
        """The cluster as Compute Engine has it, and per slice [slice id, the instances' ids, host count]:
        what tells recreated hosts from the ones seen before."""
        api = self.api
        details: dict[str, str] = {"project": api.project, "zone": api.zone, "api": "compute"}
        workers: list[Worker] = []
        states: list[str] = []
        identity: list[list[Any]] = []
        slice_states: dict[str, str] = {}
        problems: list[str] = []
        down_workers: list[int] = []
        hosts_seen: list[Any] = []
        for slice_index, slice_id in enumerate(api.slice_ids()):
            hosts = self.hosts(slice_id)
            hosts_seen += hosts
            if not hosts:
                slice_states[f"slice {slice_index}"] = f"{slice_id} {State.NOT_FOUND}"
                continue
            # a slice is as good as its worst host: one TERMINATED host loses the slice's run
            words = sorted({STATUS_WORDS.get(h.status, h.status) for h in hosts} - {State.READY}) or [
                State.READY
            ]
            if len(hosts) < self.shape.hosts and words == [State.READY]:
                words = [State.CREATING]
            down = [(i, h) for i, h in enumerate(hosts) if h.status != "RUNNING"]
            problems.extend(f"instance {h.name} (host {i}) {h.status}" for i, h in down)
            down_workers.extend(len(workers) + i for i, _ in down)  # flat indexes: workers so far + host
            states.append(",".join(words))
            slice_states[f"slice {slice_index}"] = f"{slice_id} {states[-1]}"
            identity.append([slice_id, ",".join(str(h.id) for h in hosts), len(hosts)])
            for host in hosts:
                interface = host.network_interfaces[0] if host.network_interfaces else None
                internal = interface.network_i_p if interface else ""
                external = next(
                    (c.nat_i_p for c in (interface.access_configs if interface else ()) if c.nat_i_p), ""
                )
                address = internal if self.gcp.internal_ip or not external else external
                workers.append(
                    Worker(index=len(workers), address=address, internal_address=internal, slice=slice_index)
                )
        if api.slices > 1:
            details.update(slice_states)
        if not identity:
            return Cluster(api.name, provider, State.NOT_FOUND, accelerator, [], bucket, details), None
        details["shape"] = (
            self.wanted_shape()
            if all(n == self.shape.hosts for *_, n in identity)
            else (f"{self.shape.machine_type} x{identity[0][2]}")
        )
        state = states[0] if len(set(states)) == 1 else ",".join(states)
        details.update(self._maintenance(hosts_seen))
        if problems:
            details["problem"] = "; ".join(problems)
            # a host of a MIG slice goes alone (its peers run on, waiting for it): what a recovery stops
            # before it deletes the slice, so that their last checkpoint reaches the bucket
            details[DOWN_WORKERS] = ",".join(map(str, down_workers))
        if len(identity) < len(api.slice_ids()):
            details["problem"] = f"{len(identity)} of {len(api.slice_ids())} slices exist"
            if state == State.READY:
                state = State.BROKEN
        return Cluster(api.name, provider, state, accelerator, workers, bucket, details), identity

    @staticmethod
    def _maintenance(hosts: list[Any]) -> dict[str, str]:
        """``maintenance`` (one host) or ``maintenance <instance>`` per host with a window announced in its
        ``resourceStatus.upcomingMaintenance``: what the watcher checkpoints and stops before, as it does with
        the Cloud TPU API's upcoming maintenance."""
        from tpuft.run.maintenance_window import Window

        found: dict[str, str] = {}
        for host in hosts:
            upcoming = host.resource_status.upcoming_maintenance if host.resource_status else None
            if not upcoming or not upcoming.window_start_time:
                continue
            window = Window.of(
                {
                    "type": upcoming.type_,
                    "maintenanceStatus": upcoming.maintenance_status,
                    "windowStartTime": upcoming.window_start_time,
                    "windowEndTime": upcoming.window_end_time,
                }
            )
            found["maintenance" if len(hosts) == 1 else f"maintenance {host.name}"] = window.describe()
        return found

    # -- deleting -------------------------------------------------------------------------------------------
    def delete(self, progress: Progress | None) -> bool:
        """Each slice (a MIG deletes its instances with it), then the policy and the template, each read
        back as gone. Returns False when there was nothing to delete."""
        api = self.api
        deleted = False
        for slice_id in api.slice_ids():
            if self.shape.hosts > 1:
                deleted |= self._delete(
                    "groups",
                    f"managed instance group {slice_id}",
                    progress,
                    zone=api.zone,
                    instance_group_manager=slice_id,
                )
            else:
                deleted |= self._delete(
                    "instances", f"TPU instance {slice_id}", progress, zone=api.zone, instance=slice_id
                )
        if self.shape.hosts > 1:
            deleted |= self._delete(
                "policies",
                f"workload policy {api.policy_name}",
                progress,
                region=api.region,
                resource_policy=api.policy_name,
            )
        deleted |= self._delete(
            "templates",
            f"instance template {api.template_name}",
            progress,
            instance_template=api.template_name,
        )
        return deleted

    def _delete(self, kind: str, what: str, progress: Progress | None, **names: str) -> bool:
        from google.api_core import exceptions as gexc

        api = self.api
        try:
            operation = api.call(
                f"deleting {what}",
                api.client(kind).delete_unary,
                project=api.project,
                missing_ok=True,
                **names,
            )
        except gexc.NotFound:
            return False
        api.wait(f"deleting {what}", operation, progress)
        return True


def worker_number(instance: Any) -> int:
    """The host's TPU worker id as Compute Engine writes it in the instance's metadata: ``TPU_WORKER_ID`` in
    ``tpu-env`` (``KEY: 'value'`` lines), else ``agent-worker-number``, as a TPU VM's runtime reads them; a
    host without either sorts last (by name)."""
    items = {item.key: item.value for item in instance.metadata.items} if instance.metadata else {}
    for line in items.get("tpu-env", "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "TPU_WORKER_ID" and value.strip().strip("'\"").isdigit():
            return int(value.strip().strip("'\""))
    number = items.get("agent-worker-number", "").strip()
    return int(number) if number.isdigit() else 1 << 30


def _slice_of(instance: str, api: ComputeApi) -> str:
    """The slice a MIG instance (``SLICE-xxxx``) belongs to: its name less the MIG's suffix."""
    return instance.rsplit("-", 1)[0] if instance.rsplit("-", 1)[0] in api.slice_ids() else ""
