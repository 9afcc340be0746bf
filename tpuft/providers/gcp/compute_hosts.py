"""Reaching the hosts of a Compute Engine slice: the user's SSH key in each instance's metadata, the host keys
its guest agent publishes, and the two drills (a simulated maintenance event, a stop). The hosts are a slice's
instances in TPU worker-id order (:meth:`ComputeSlices.hosts`)."""

from __future__ import annotations

from typing import Any

from tpuft.providers.gcp.api import GcpError
from tpuft.providers.gcp.compute_api import ComputeApi


class ComputeHosts:
    """The host-level acts; mixed into :class:`~tpuft.providers.gcp.compute_slices.ComputeSlices`, which
    lists the hosts."""

    api: ComputeApi

    def hosts(self, slice_id: str) -> list[Any]:
        raise NotImplementedError

    def ensure_key_in_metadata(self, entry: str) -> bool:
        """Like gcloud without OS Login: ``entry`` (``user:key``) in each instance's ``ssh-keys``, set with
        the metadata's fingerprint so a concurrent change is not overwritten. Returns whether any changed."""
        from google.cloud import compute_v1 as compute

        api = self.api
        changed = False
        for slice_id in api.slice_ids():
            for host in self.hosts(slice_id):
                items = {item.key: item.value for item in host.metadata.items}
                lines = [line for line in items.get("ssh-keys", "").splitlines() if line.strip()]
                if entry in lines:
                    continue
                items["ssh-keys"] = "\n".join([*lines, entry])
                metadata = compute.Metadata(
                    fingerprint=host.metadata.fingerprint,
                    items=[compute.Items(key=k, value=v) for k, v in items.items()],
                )
                operation = api.call(
                    "adding your SSH key to the instance metadata",
                    api.client("instances").set_metadata_unary,
                    project=api.project,
                    zone=api.zone,
                    instance=host.name,
                    metadata_resource=metadata,
                )
                api.wait(f"updating metadata of {host.name}", operation)
                changed = True
        return changed

    def host_name(self, slice_id: str, host: int) -> str:
        """The instance that is host ``host`` (slice-local worker id) of the slice."""
        hosts = self.hosts(slice_id)
        if host >= len(hosts):
            raise GcpError(f"slice {slice_id} has {len(hosts)} host(s) running, no host {host}")
        return str(hosts[host].name)

    def simulate_maintenance(self, instance: str) -> str:
        """Compute Engine's maintenance simulation on one host; the operation's name (it is not waited
        for: the point is what the host sees meanwhile)."""
        api = self.api
        operation = api.call(
            "simulating a maintenance event on instance",
            api.client("instances").simulate_maintenance_event_unary,
            project=api.project,
            zone=api.zone,
            instance=instance,
        )
        return str(operation.name)

    def stop_host(self, instance: str) -> None:
        api = self.api
        operation = api.call(
            "stopping instance",
            api.client("instances").stop_unary,
            project=api.project,
            zone=api.zone,
            instance=instance,
        )
        api.wait(f"stopping instance {instance}", operation)

    def host_keys(self, slice_id: str, worker_ids: list[int]) -> dict[int, list[str]]:
        """The SSH host keys these hosts of one slice (slice-local worker ids) publish as guest attributes
        (namespace ``hostkeys``); a host that has published none yet is left out."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1 as compute

        from tpuft.providers.gcp.access import HOSTKEY_NAMESPACE, host_key_lines

        api = self.api
        hosts = self.hosts(slice_id)
        found: dict[int, list[str]] = {}
        for worker in worker_ids:
            if worker >= len(hosts):
                continue
            try:
                request = compute.GetGuestAttributesInstanceRequest(
                    project=api.project,
                    zone=api.zone,
                    instance=hosts[worker].name,
                    query_path=f"{HOSTKEY_NAMESPACE}/",
                )
                answer = api.call(
                    f"reading the SSH host keys of {hosts[worker].name}",
                    api.client("instances").get_guest_attributes,
                    request=request,
                    missing_ok=True,
                )
            except gexc.NotFound:  # nothing published under the path yet
                continue
            keys = host_key_lines(answer.query_value.items) if answer.query_value else []
            if keys:
                found[worker] = keys
        return found
