"""What every launched worker's trainer is told besides its rank: the rendezvous (worker 0's coordinator
address), the peers' addresses (for runtimes that connect every worker to every other, as TF's TF_CONFIG
does), the number of slices and the cross-slice coordinator's port, the target, and the plan's own variables.

Apart from :mod:`tpuft.ops.train` because it is the contract between the controller and the trainers'
runtimes, shared by ``train`` and ``predict`` (:mod:`tpuft.ops.predict_launch`), with its own rule for ports:
fixed ones on real hosts, free and distinct ones where the workers share this machine (a local pod, a loopback
rig).
"""

from __future__ import annotations

from tpuft.backends.base import LaunchPlan
from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.core.ports import COORDINATOR_PORT, MEGASCALE_PORT, free_port
from tpuft.host.launch_env import PORT_ENV as MEGASCALE_PORT_ENV
from tpuft.ops.common import Session, worker_env


def _free_port_besides(used: set[str]) -> int:
    """A free port of this machine that is none of ``used`` (ports already handed to this run's workers)."""
    port = free_port()
    while str(port) in used:
        port = free_port()
    return port


def peer_addresses(hosts: list[str], coordinator: str) -> list[str]:
    """An address per launched worker, for runtimes that connect every worker to every other (TF's TF_CONFIG).
    TF binds its server on every interface, so workers at loopback addresses (one machine) need distinct
    ports; real hosts use the port after the coordinator's."""
    used = {coordinator.rsplit(":", 1)[1]}
    peers = []
    for host in hosts:
        if host.startswith("127.") or host == "localhost":
            port = _free_port_besides(used)
            used.add(str(port))
        else:
            port = COORDINATOR_PORT + 1
        peers.append(f"{host}:{port}")
    return peers


def _on_this_machine(host: str) -> bool:
    """Workers launched at this address share this machine (a local pod): fixed ports would collide there."""
    return host in {"localhost", "127.0.0.1"}


def _coordinator_port(host: str) -> int:
    """Worker 0's rendezvous port: a free one when the workers share this machine (a local pod, a loopback
    rig), the fixed one on real hosts (nothing else listens there; a worker's peer port is the next one)."""
    return free_port() if _on_this_machine(host) else COORDINATOR_PORT


def _megascale_port(host: str, taken: set[str]) -> int:
    """The cross-slice coordinator's port: the fixed one on real hosts, a free one (not the rendezvous's nor a
    peer's) where workers share this machine, as the rendezvous port is chosen."""
    if not _on_this_machine(host):
        return MEGASCALE_PORT
    return _free_port_besides({address.rsplit(":", 1)[1] for address in taken})


def launched_slices(session: Session, plan: LaunchPlan, kind: str) -> int:
    """How many slices the launched workers make: the cluster's, as a multislice run needs every host of every
    slice (the runtime waits for all of them); a plan that leaves hosts out of a multislice cluster cannot run
    there."""
    layout = session.cluster.layout
    if layout.slices > 1 and list(plan.workers) != list(range(layout.workers)):
        raise UsageError(
            f"the {kind} backend's launch plan runs on worker(s) {list(plan.workers)} only, and "
            f"this cluster is {layout.slices} slices of {layout.hosts} host(s): a multislice run needs "
            "every host of every slice",
            hint="use a single-slice cluster (gcp.slices: 1) for this backend",
        )
    return layout.slices


def trainer_env(
    session: Session,
    config: ClusterConfig,
    plan: LaunchPlan,
    resume: bool,
    kind: str | None = None,
) -> dict[str, str]:
    """What every launched worker's trainer gets besides its rank (the supervisor adds that and PYTHONPATH).

    ``kind``: the training backend, whose run spans every slice; None for a predict job, whose processes shard
    the input among themselves and are launched as one slice (no cross-slice runtime), as before
    multislice."""
    workers = session.cluster.workers
    hosts = [
        (workers[i].internal_address or workers[i].address).replace("localhost", "127.0.0.1")
        for i in plan.workers
    ]
    coordinator = f"{hosts[0]}:{_coordinator_port(hosts[0])}"
    peers = peer_addresses(hosts, coordinator)
    slices = launched_slices(session, plan, kind) if kind is not None else 1
    env = worker_env(
        config,
        {
            "TPUFT_COORDINATOR": coordinator,
            "TPUFT_PEERS": ",".join(peers),
            "TPUFT_NODE": config.name,  # the TPU node's name (TF's TPUClusterResolver on a pod slice)
            "TPUFT_NUM_SLICES": str(slices),
            # host/launch_env.py's TARGET_ENV: only a TPU's runtime takes libtpu flags
            "TPUFT_TARGET": session.shape.target,
            **plan.env,
        },
    )
    if slices > 1:
        env[MEGASCALE_PORT_ENV] = str(_megascale_port(hosts[0], {coordinator, *peers}))
    if resume:
        env["TPUFT_RESUME"] = "1"
    return env
