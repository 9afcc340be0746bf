"""create / status / delete / exec: the cluster's lifecycle and ad-hoc commands on its workers."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuft.config import ClusterConfig
from tpuft.core.accelerators import AcceleratorType, lookup
from tpuft.core.errors import UsageError
from tpuft.core.records import Cluster, Progress, State
from tpuft.fleet.base import FleetResult, LineSink
from tpuft.fleet.spec import command_argv, exec_env, parse_one_worker, parse_worker_list
from tpuft.ops.common import Session, open_session, worker_env
from tpuft.providers import get_provider
from tpuft.run import goodput


@dataclass
class CreateResult:
    cluster: Cluster
    created: bool
    accelerator: AcceleratorType


def create(config: ClusterConfig, progress: Progress | None = None) -> CreateResult:
    started = time.time()
    provider = get_provider(config)
    cluster, created = provider.create(progress)
    if created:  # the next run launched on it counts the wait (tpuft.run.goodput)
        queued = capacity_wait(provider)
        if queued is not None:
            goodput.remember_cluster_event(provider.state_dir(), "queue_wait", *queued)
        goodput.remember_cluster_event(provider.state_dir(), "provision", started, time.time() - started)
    return CreateResult(cluster=cluster, created=created, accelerator=lookup(config.accelerator))


def capacity_wait(provider: object) -> tuple[float, float] | None:
    """(start, seconds) of the wait for capacity of the queued resource the provider has just created (until
    PROVISIONING), for goodput's ``queue_wait``; None for a node created directly, or a provider without
    queues."""
    return getattr(getattr(provider, "nodes", None), "queue_wait", None)


@dataclass
class CostEstimate:
    chips: int
    slices: int
    per_hour: float | None

    def describe(self, accelerator: str, spot: bool) -> str:
        if self.per_hour is None:
            return f"{accelerator} x {self.slices}: no public price known"
        kind = "spot VMs cost less than this on-demand list price" if spot else "on-demand list price"
        return (
            f"{accelerator} x {self.slices} slice(s) = {self.chips} chips: about ${self.per_hour:,.2f} "
            f"per hour ({kind}; an estimate)"
        )


def cost_to_confirm(config: ClusterConfig) -> CostEstimate | None:
    """What a user must agree to before ``create`` spends money: the estimate for a cloud cluster that does
    not exist yet; None for the local provider or a cluster that is reused as it is."""
    if config.provider == "local" or status(config).state != State.NOT_FOUND:
        return None
    return cost_estimate(config)


def cost_estimate(config: ClusterConfig) -> CostEstimate:
    acc = lookup(config.accelerator)
    slices = config.gcp.slices if config.provider == "gcp" else 1
    price = acc.price_per_hour
    return CostEstimate(
        chips=acc.chips * slices, slices=slices, per_hour=None if price is None else price * slices
    )


def status(config: ClusterConfig) -> Cluster:
    return get_provider(config).get()


def delete(config: ClusterConfig, progress: Progress | None = None, *, force: bool = False) -> bool:
    """Refuses while a run trains on the cluster (deleting it would throw the run away, export and all);
    ``force`` stops such runs first (recorded as stopped, resumable on a new cluster of the same shape)."""
    from tpuft.ops.lifecycle import alive_runs, stop

    alive = alive_runs(config)
    if alive and not force:
        ids = ", ".join(run.id for run in alive)
        raise UsageError(
            f"run {ids} is training on cluster {config.name!r}: deleting the cluster would end it",
            hint=f"Stop it first: tpuft stop {alive[0].id}  (or tpuft delete --force stops it, then deletes)",
        )
    for run in alive:
        if progress:
            progress(f"stopping run {run.id}")
        stop(config, run, reason=f"cluster {config.name} deleted (tpuft delete --force)")
    provider = get_provider(config)
    deleted = provider.delete(progress)
    if (
        config.provider != "local"
    ):  # its agent ends by itself once the cluster is forgotten; its ssh masters go now
        from tpuft.ops.agent_client import forget_control_paths

        forget_control_paths(provider.state_dir())
    return deleted


def exec_command(
    config: ClusterConfig,
    command: Sequence[str],
    *,
    workers: str | None = None,
    on_line: LineSink | None = None,
    cluster_path: Path | None = None,
    use_agent: bool = False,
    agent_tried: bool = False,
    refresh: bool = False,
) -> FleetResult:
    """Run ``command`` on the workers in parallel. One argument is a shell line (``bash -c``); several are
    argv. Each sees the cluster file's ``worker_env`` and its place (``TPUFT_WORKER_ID``,
    ``TPUFT_NUM_WORKERS``, and on several slices ``TPUFT_SLICE_ID``, ``TPUFT_NUM_SLICES``), sent as
    every worker process's environment is (:func:`tpuft.ops.common.worker_env`), warm or cold.

    ``use_agent`` (the CLI): try the cluster's connection agent first (:mod:`tpuft.ops.agent`), unless the
    caller already did (``agent_tried``), and after a run over SSH start one for next time. ``cluster_path``
    is the file ``config`` came from (None: the default lookup), which names the agent and the plan the next
    cold ``exec`` reads (:mod:`tpuft.ops.quick_exec`). ``refresh``: the remembered workers failed, ask the API
    first."""
    argv = command_argv(command)
    from tpuft.ops import agent_client

    path = (
        agent_client.resolve_cluster_path(None if cluster_path is None else str(cluster_path))
        if use_agent
        else None
    )
    if path is not None and not agent_tried:
        warm = agent_client.try_exec(path, command, workers, on_line or (lambda index, line: None))
        if warm is not None:
            return warm
    from tpuft.fleet.ssh import SshConnectError, SshFleet

    if (
        refresh
    ):  # what the remembered plan said failed: forget it all (addresses, pins), as the retry below does
        getattr(get_provider(config), "forget", lambda: None)()
    session = open_session(config, cached=not refresh)
    forget = getattr(session.provider, "forget", None)
    try:
        result = _exec(session, argv, workers, on_line)
    except SshConnectError:
        if forget is None or refresh:
            raise
        forget()  # the remembered addresses may be stale (the node was recreated): ask the API and retry once
        session = open_session(config)
        result = _exec(session, argv, workers, on_line)
    if isinstance(session.fleet, SshFleet):
        plan_for = path or agent_client.resolve_cluster_path(
            None if cluster_path is None else str(cluster_path)
        )
        remember = getattr(session.provider, "remember_exec_plan", None)
        if plan_for is not None and remember is not None:
            remember(plan_for)
        if path is not None:
            agent_client.ensure_agent(path)
    return result


def _exec(session: Session, argv: list[str], workers: str | None, on_line: LineSink | None) -> FleetResult:
    layout = session.cluster.layout
    chosen = parse_worker_list(workers, layout)
    return session.fleet.run(
        argv,
        workers=chosen,
        on_line=on_line,
        env=lambda w: worker_env(session.config, exec_env(w.index, layout)),
    )


def shell_argv(config: ClusterConfig, spec: str) -> tuple[list[str], dict[str, str], str | None]:
    """argv, extra environment and working directory for an interactive shell on one worker (``spec``:
    ``--worker``, a flat index or ``S:I``)."""
    session = open_session(config, cached=True)
    worker = parse_one_worker(spec, session.cluster.layout)
    target = session.cluster.workers[worker]
    if target.home is not None:  # local: a shell in the worker's folder, as that worker's HOME
        return ["bash", "-l"], {"HOME": str(target.home), "TPUFT_WORKER_ID": str(worker)}, str(target.home)
    from tpuft.fleet.ssh_config import known_hosts_name, openssh_options
    from tpuft.ops import agent_client

    session.provider.prepare(session.cluster)  # the key exists and is in the node's metadata
    settings = session.provider.ssh_settings()  # type: ignore[attr-defined]
    # pinned from the API by prepare
    known_hosts = settings.known_hosts or session.provider.state_dir() / "known_hosts"
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        "ssh",
        "-t",
        *openssh_options(settings, target.address),  # ~/.ssh/config applies as in the fleet
        "-o",
        f"StrictHostKeyChecking={'yes' if settings.known_hosts else 'accept-new'}",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        # the pins are by the worker's address and the cluster's port, whatever a Host block's HostName/Port
        # say
        *(
            ["-o", f"HostKeyAlias={known_hosts_name(target.address, settings.port)}"]
            if settings.known_hosts
            else []
        ),
        "-o",
        "ServerAliveInterval=30",
        *agent_client.control_options(session.provider.state_dir(), target.address, settings),
        target.address,
    ]
    return argv, {}, None
