"""Reaching the workers over SSH: the login (OS Login, or the user's key in the node metadata as gcloud puts
it) and the workers' host keys, pinned from the API.

Host keys are never learnt from whatever answers on port 22: each TPU VM's guest agent publishes its host keys
as guest attributes (namespace ``hostkeys``), which ``GetGuestAttributes`` returns, the way ``gcloud compute
tpus tpu-vm ssh`` checks them. ``HostKeyPins.pin`` writes them to the cluster's ``known_hosts`` for the
addresses the fleet connects to, and refreshes that file from the API only when the node (its ``id``) or the
addresses change; the SSH fleet refuses a host whose key is not the pinned one.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.core.errors import UsageError
from tpuft.core.records import Cluster, Worker
from tpuft.core.waiting import waiting
from tpuft.providers.gcp import tuning
from tpuft.providers.gcp.api import GcpError, GoogleApi, TpuApi
from tpuft.providers.gcp.cache import WorkerCache, worker_rows

if TYPE_CHECKING:
    from tpuft.config import SshConfig
    from tpuft.fleet.ssh import SshSettings

HOSTKEY_NAMESPACE = "hostkeys"
_KEY_TYPE = re.compile(r"(ssh|ecdsa|sk)-[a-z0-9@.-]+")
_KEY_BLOB = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def ssh_settings(ssh: SshConfig, known_hosts: Path) -> SshSettings:
    """How the fleet logs in: the cluster file's ``ssh`` section, the local login name by default, and the
    cluster's own pinned ``known_hosts``."""
    from tpuft.core.formats import user_name_problem
    from tpuft.fleet.ssh import SshSettings
    from tpuft.providers.ssh_keys import user_name

    user = ssh.user or user_name()
    problem = user_name_problem(user)
    if problem:  # the cluster file's ssh.user is checked when loaded; this is the local login name
        raise UsageError(f"your user name {problem}", hint="Set ssh.user in the cluster file.")
    return SshSettings(
        user=user,
        key_file=ssh.key_file.expanduser(),
        port=ssh.port,
        connect_attempts=ssh.connect_attempts,
        retry_delay_s=ssh.retry_delay_s,
        known_hosts=known_hosts,
        ssh_config=ssh.ssh_config.expanduser() if ssh.ssh_config is not None else None,
        explicit=ssh.explicit(),
    )


def ensure_key_in_metadata(api: TpuApi, user: str, public_key: str) -> bool:
    """Like gcloud (without OS Login): the key must be in each node's ``ssh-keys`` metadata; add it (mask:
    metadata) where it is not. Returns whether any node changed."""
    from google.protobuf import field_mask_pb2

    entry = f"{user}:{public_key.strip()}"
    changed = False
    for node_id in api.node_ids():
        node = api.call("reading TPU node", api.client().get_node, name=api.node_path(node_id))
        current = dict(node.metadata)
        lines = [line for line in current.get("ssh-keys", "").splitlines() if line.strip()]
        if entry in lines:
            continue
        current["ssh-keys"] = "\n".join([*lines, entry])
        node.metadata = current
        operation = api.call(
            "adding your SSH key to the node metadata",
            api.client().update_node,
            node=node,
            update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
        )
        api.wait_operation(f"updating metadata of {node_id}", operation, None, None)
        changed = True
    return changed


class HostKeyPins:
    """The workers' host keys, pinned in ``known_hosts`` from the API and remembered in the worker cache."""

    def __init__(
        self,
        api: GoogleApi,
        cache: WorkerCache,
        known_hosts: Path,
        slice_ids: list[str],
        ask: Callable[[str, list[int]], dict[int, list[str]]],
    ) -> None:
        """``ask(slice_id, worker_ids)``: the published keys of these (slice-local) workers, by worker; absent
        where none is published yet. The Cloud TPU API's is :func:`tpu_host_keys`, Compute Engine's is
        :meth:`tpuft.providers.gcp.compute_slices.ComputeSlices.host_keys`."""
        self.api = api
        self.cache = cache
        self.known_hosts = known_hosts
        self.slice_ids = slice_ids
        self.ask = ask

    def pin(self, cluster: Cluster, port: int) -> None:
        """Make ``known_hosts`` hold the host keys the API publishes for exactly these workers. Free when the
        pins are for the same nodes (same ``id``) and addresses; else one GetGuestAttributes per slice
        replaces them."""
        hosts = [known_hosts_host(worker.address, port) for worker in cluster.workers]
        record = self.cache.read() or {}
        same_workers = record.get("workers") == worker_rows(cluster.workers)
        nodes = record.get("nodes") if same_workers else None
        wanted = {"nodes": nodes, "hosts": hosts}
        if nodes and record.get("pins") == wanted and self.known_hosts.exists():
            return
        keys = self.fetch(cluster, nodes)
        api = self.api
        header = (
            f"# SSH host keys of TPU {api.name} ({api.project}/{api.zone}) from the guest attributes of "
            f"{api.endpoint_label}"
        )
        write_known_hosts(self.known_hosts, hosts, keys, header)
        if nodes:  # only a cluster that get() described can be recognised next time
            self.cache.write({**(self.cache.read() or record), "pins": wanted})

    def fetch(self, cluster: Cluster, nodes: list[list[Any]] | None = None) -> list[list[str]]:
        """Every worker's host keys (``"ssh-ed25519 AAAA..."`` lines), in worker order across slices.
        ``nodes`` gives the workers per slice; without it the slices split the workers evenly (they share one
        shape)."""
        name = self.api.name
        if nodes:
            counts = [(str(node_id), int(count)) for node_id, _, count in nodes]
        else:
            slices = len(self.slice_ids)
            per_node, extra = divmod(len(cluster.workers), slices)
            if extra:
                raise GcpError(
                    f"TPU {name}: {len(cluster.workers)} workers on {slices} slices", hint="See: tpuft status"
                )
            counts = [(node_id, per_node) for node_id in self.slice_ids]
        if sum(count for _, count in counts) != len(cluster.workers):
            raise GcpError(f"TPU {name} changed while being read", hint="Retry, or see: tpuft status")
        keys: list[list[str]] = []
        for node_id, count in counts:
            keys.extend(self._node_host_keys(node_id, count, cluster.workers[len(keys) : len(keys) + count]))
        return keys

    def _node_host_keys(self, node_id: str, count: int, workers: list[Worker]) -> list[list[str]]:
        """One slice's keys; a VM that has just booted may not have published them yet, so ask again for the
        missing workers until ``HOSTKEY_WAIT_S`` runs out, then refuse: an unpinned host is never trusted. The
        wait is shown on stderr after a moment: up to five minutes of silence reads as a hang."""
        found: dict[int, list[str]] = {}
        span = (
            f"{workers[0].index}-{workers[-1].index}"
            if len(workers) > 1
            else f"{workers[0].index}"
            if workers
            else "-"
        )
        what = (
            f"the SSH host keys of TPU node {node_id} worker(s) {span} (each VM's guest agent publishes "
            "them at boot)"
        )
        with waiting(what, tuning.HOSTKEY_WAIT_S) as wait:
            while True:
                missing = [i for i in range(count) if i not in found]
                found.update(self.ask(node_id, missing))
                missing = [i for i in range(count) if i not in found]
                if not missing:
                    return [found[i] for i in range(count)]
                wait.update(f"{len(found)} of {count} published, missing: {_workers_named(workers, missing)}")
                if wait.expired():
                    worker = workers[missing[0]]
                    others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    raise GcpError(
                        f"worker {worker.index} ({worker.address}) of TPU node {node_id}{others} has "
                        "not published its SSH host keys (guest attributes) "
                        f"after {tuning.HOSTKEY_WAIT_S:.0f}s, so its identity cannot be checked",
                        hint="A VM that has just started publishes them within a few minutes: retry soon. "
                        "If it never does, its guest agent is not running: recreate the node (tpuft "
                        "delete --yes && tpuft create).",
                    )
                time.sleep(min(tuning.POLL_SECONDS, wait.left() or 0.0))


def tpu_host_keys(api: TpuApi, node_id: str, worker_ids: list[int]) -> dict[int, list[str]]:
    """One GetGuestAttributes for these workers of one slice: slice-local worker id -> its keys (absent:
    nothing published). The answer carries no worker ids, so it is matched by position only when it has
    one entry per worker asked; otherwise each worker is asked alone."""
    from google.cloud import tpu_v2

    request = tpu_v2.GetGuestAttributesRequest(
        name=api.node_path(node_id),
        query_path=f"{HOSTKEY_NAMESPACE}/",
        worker_ids=[str(i) for i in worker_ids],
    )
    what = f"reading the SSH host keys of TPU node {node_id}"
    entries = list(api.call(what, api.client().get_guest_attributes, request=request).guest_attributes)
    if len(entries) != len(worker_ids):
        if len(worker_ids) == 1:
            return {}
        return {i: keys for one in worker_ids for i, keys in tpu_host_keys(api, node_id, [one]).items()}
    found = {i: host_key_lines(entry.query_value.items) for i, entry in zip(worker_ids, entries)}
    return {i: keys for i, keys in found.items() if keys}


def _workers_named(workers: list[Worker], missing: list[int]) -> str:
    """``worker 1`` or ``workers 1, 3`` (the first few), by their cluster-wide indexes."""
    names = [str(workers[i].index) for i in missing[:4]] + (["..."] if len(missing) > 4 else [])
    return ("worker " if len(missing) == 1 else "workers ") + ", ".join(names)


def known_hosts_host(address: str, port: int) -> str:
    """The host field of a known_hosts line as OpenSSH and paramiko look it up: ``[addr]:port`` off port
    22."""
    return address if port == 22 else f"[{address}]:{port}"


def host_key_lines(items: Any) -> list[str]:
    """``"type base64"`` lines from guest-attribute entries of the ``hostkeys`` namespace (key = key type,
    value = the base64 blob, as the guest agent publishes them). Anything malformed is dropped, so a value can
    never add a line (or a host pattern) of its own to known_hosts."""
    lines = []
    for item in items:
        kind, value = str(item.key), str(item.value).strip()
        if item.namespace == HOSTKEY_NAMESPACE and _KEY_TYPE.fullmatch(kind) and _KEY_BLOB.fullmatch(value):
            lines.append(f"{kind} {value}")
    return lines


def write_known_hosts(path: Path, hosts: list[str], keys: list[list[str]], header: str) -> None:
    """Replace ``path`` at once (write then rename): a fleet never reads a half-written file, and a recreated
    node's pins never sit next to the old node's."""
    lines = [header] + [
        f"{host} {key}" for host, host_keys in zip(hosts, keys, strict=True) for key in host_keys
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)
