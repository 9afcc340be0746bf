"""What ``create`` asks Compute Engine for (``gcp.api: compute``), as gcloud asks for it: the instance
template of one host, the workload policy of a multi-host slice, the managed instance group or the lone
instance of each slice. ``tpuft create --dry-run`` prints them; tests/providers/test_compute_bodies.py holds
them against gcloud's own requests for the same slice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuft.core.accelerators import AcceleratorType
from tpuft.core.compute_tpus import ComputeShape, compute_shape
from tpuft.providers.gcp.compute_api import ComputeApi

if TYPE_CHECKING:
    from tpuft.config import GcpConfig

CLUSTER_LABEL = "tpuft-cluster"
"""The label that ties an instance (and the template it came from) to its cluster: a MIG names its instances
with a random suffix, and gives itself, templates and policies no labels."""


@dataclass(frozen=True)
class ComputeRequest:
    """One insert call: the RPC as gcloud and the REST reference name it, where it goes, and the message."""

    rpc: str
    where: str
    message: Any

    def body(self) -> dict[str, Any]:
        from google.protobuf import json_format

        return json_format.MessageToDict(type(self.message).pb(self.message))


class ComputeBodies:
    """The slices as the cluster file describes them: the request bodies and the shape they make."""

    """The cluster's slices as the cluster file describes them (``gcp``) and as Compute Engine has them."""

    def __init__(self, api: ComputeApi, gcp: GcpConfig, accelerator: AcceleratorType) -> None:
        self.api = api
        self.gcp = gcp
        self.accelerator = accelerator
        self.shape: ComputeShape = compute_shape(accelerator)

    # -- the create requests --------------------------------------------------------------------------------
    def labels(self) -> dict[str, str]:
        return {"created-by": "tpuft", CLUSTER_LABEL: self.api.name, **self.gcp.labels}

    def template(self) -> Any:
        """The instance template: one host of the slice, as gcloud's ``instance-templates create`` makes
        it."""
        from google.cloud import compute_v1 as compute

        gcp, shape = self.gcp, self.shape
        metadata = {"enable-guest-attributes": "TRUE", **gcp.metadata}
        network = gcp.network or "default"
        interface = compute.NetworkInterface(
            network=network if "/" in network else f"projects/{self.api.project}/global/networks/{network}"
        )
        if gcp.subnetwork:
            subnet = gcp.subnetwork
            interface.subnetwork = (
                subnet if "/" in subnet else f"regions/{self.api.region}/subnetworks/{subnet}"
            )
        if not gcp.internal_ip:
            interface.access_configs = [compute.AccessConfig(name="external-nat", type_="ONE_TO_ONE_NAT")]
        scheduling = compute.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=not gcp.spot)
        if gcp.spot:
            # Google's TPU Spot page for MIGs: termination action STOP; gcloud's --provisioning-model=SPOT
            # also sets the legacy preemptible flag, and so does tpuft (test_compute_bodies.py)
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = "STOP"
            scheduling.preemptible = True
        properties = compute.InstanceProperties(
            machine_type=shape.machine_type,
            disks=[
                compute.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    mode="READ_WRITE",
                    type_="PERSISTENT",
                    initialize_params=compute.AttachedDiskInitializeParams(
                        source_image=gcp.image or shape.image, disk_size_gb=gcp.boot_disk_gb
                    ),
                )
            ],
            network_interfaces=[interface],
            scheduling=scheduling,
            labels=self.labels(),
            metadata=compute.Metadata(items=[compute.Items(key=k, value=v) for k, v in metadata.items()]),
            service_accounts=[
                compute.ServiceAccount(email=gcp.service_account or "default", scopes=list(gcp.scopes))
            ],
        )
        affinity = self.reservation_affinity()
        if affinity is not None:
            properties.reservation_affinity = affinity
        return compute.InstanceTemplate(name=self.api.template_name, properties=properties)

    def reservation_affinity(self) -> Any:
        """gcloud's ``--reservation-affinity=specific --reservation=NAME`` (or ``any`` for plain
        ``reserved``); None for on-demand and spot."""
        from google.cloud import compute_v1 as compute

        if self.gcp.reservation:
            return compute.ReservationAffinity(
                consume_reservation_type="SPECIFIC_RESERVATION",
                key="compute.googleapis.com/reservation-name",
                values=[self.gcp.reservation],
            )
        if self.gcp.reserved:
            return compute.ReservationAffinity(consume_reservation_type="ANY_RESERVATION")
        return None

    def policy(self) -> Any:
        """The workload policy that makes a MIG's hosts one slice (multi-host slices only)."""
        from google.cloud import compute_v1 as compute

        return compute.ResourcePolicy(
            name=self.api.policy_name,
            workload_policy=compute.ResourcePolicyWorkloadPolicy(
                type_="HIGH_THROUGHPUT", accelerator_topology=self.shape.topology
            ),
        )

    def group(self, slice_id: str) -> Any:
        from google.cloud import compute_v1 as compute

        api = self.api
        return compute.InstanceGroupManager(  # the base instance name is the group's, the API's default
            name=slice_id,
            instance_template=api.template_url(),
            target_size=self.shape.hosts,
            resource_policies=compute.InstanceGroupManagerResourcePolicies(workload_policy=api.policy_url()),
        )

    def instance(self, slice_id: str) -> Any:
        from google.cloud import compute_v1 as compute

        return compute.Instance(name=slice_id)

    def create_requests(self) -> list[ComputeRequest]:
        """Every insert ``create`` sends, in order: what ``--dry-run`` shows."""
        api = self.api
        requests = [
            ComputeRequest("instanceTemplates.insert", f"projects/{api.project}/global", self.template())
        ]
        if self.shape.hosts > 1:
            requests.append(
                ComputeRequest(
                    "resourcePolicies.insert", f"projects/{api.project}/regions/{api.region}", self.policy()
                )
            )
        zone = f"projects/{api.project}/zones/{api.zone}"
        for slice_id in api.slice_ids():
            if self.shape.hosts > 1:
                requests.append(ComputeRequest("instanceGroupManagers.insert", zone, self.group(slice_id)))
            else:
                requests.append(
                    ComputeRequest(
                        f"instances.insert?sourceInstanceTemplate={api.template_url()}",
                        zone,
                        self.instance(slice_id),
                    )
                )
        return requests

    def wanted_shape(self) -> str:
        return f"{self.shape.machine_type} x{self.shape.hosts}"
