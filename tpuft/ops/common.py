"""Pieces every verb needs: the provider for a cluster file, a ready cluster, and the tpuft package on
workers."""

from __future__ import annotations

import functools
import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuft.backends.base import ClusterShape
from tpuft.config import ClusterConfig
from tpuft.core.errors import UsageError
from tpuft.core.paths import RECIPES_FOLDER, package_root
from tpuft.core.records import Cluster, State
from tpuft.fleet.base import Fleet, FleetResult, failure_error
from tpuft.providers import Provider, get_provider

PACKAGE_HOME = ".tpuft/pkg"
"""Under each worker's HOME: one folder per version of the tpuft package, named by a hash of its files."""
NOT_SHIPPED = frozenset({RECIPES_FOLDER})
"""The package's top-level folders that workers never read, left out of the copy and its hash: the shipped
recipes and their data (MBs; a run sends its recipe resolved and uploads its data on its own)."""


@dataclass
class Session:
    """A cluster file resolved to its provider and the live cluster."""

    config: ClusterConfig
    provider: Provider
    cluster: Cluster

    @property
    def shape(self) -> ClusterShape:
        """The cluster as a backend plans for it, with the workers the provider reports."""
        return self.config.shape(len(self.cluster.workers))

    @functools.cached_property
    def fleet(self) -> Fleet:
        """One fleet per session: SSH connections are opened once and reused by every step of a verb."""
        self.provider.prepare(self.cluster)
        return self.provider.fleet(self.cluster)


def worker_env(config: ClusterConfig, own: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every worker process tpuft starts (``exec``, ``setup``'s bootstrap, ``train``'s
    check and its supervisors and trainers): the cluster file's ``worker_env``, then tpuft's own variables for
    that process, which win (the cluster file may not name ``TPUFT_*``, ``HOME`` or ``PYTHONPATH`` anyway).

    It is handed to the fleet as ``env``, the one secret-safe channel: over SSH the values travel on the
    channel's stdin (:func:`tpuft.fleet.ssh_remote.env_payload`), on the local pod in the process environment,
    never in an argv that ``ps`` would show. Every caller goes through here, so no verb can forget
    ``worker_env``."""
    return {**config.worker_env, **(own or {})}


def open_session(config: ClusterConfig, *, require_ready: bool = True, cached: bool = False) -> Session:
    """``cached``: accept the provider's recent memory of a READY cluster (no API call) for quick commands."""
    provider = get_provider(config)
    remembered = getattr(provider, "cached", None) if cached else None
    cluster = (remembered() if remembered else None) or provider.get()
    if require_ready and cluster.state != State.READY:
        if cluster.state == State.NOT_FOUND:
            raise UsageError(
                f"cluster {config.name!r} ({config.provider}) does not exist", hint="Create it: tpuft create"
            )
        problem = cluster.details.get("problem", "")
        raise UsageError(
            f"cluster {config.name!r} is {cluster.state}{': ' + problem if problem else ''}",
            hint="Recreate it: tpuft delete --yes && tpuft create",
        )
    return Session(config=config, provider=provider, cluster=cluster)


@functools.cache
def package_hash() -> str:
    """Once per process: a launch ships the package and runs a probe under this name, so a file edited in
    between (an editable install being worked on) must not split them between two folders."""
    digest = hashlib.sha256()
    root = package_root()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if relative.parts[0] in NOT_SHIPPED or "__pycache__" in path.parts:
            continue
        if path.is_file() and path.suffix in {".py", ".yaml", ".typed"}:
            digest.update(str(relative).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _not_shipped(folder: str, names: list[str]) -> set[str]:
    """``copytree``'s ignore: caches anywhere, :data:`NOT_SHIPPED` at the package's top."""
    ignored = shutil.ignore_patterns("__pycache__", "*.pyc")(folder, names)
    if Path(folder) == package_root():
        ignored |= NOT_SHIPPED & set(names)
    return ignored


def ship_package(session: Session, workers: Sequence[int] | None = None) -> str:
    """Copy this tpuft package to the workers (all by default; once per version); returns its folder under
    HOME."""
    folder = f"{PACKAGE_HOME}/{package_hash()}"
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "tpuft"
        shutil.copytree(package_root(), staged, ignore=_not_shipped)
        session.fleet.put(staged, f"{folder}/tpuft", workers=workers)
    return folder


def on_worker(session: Session, index: int, relative: str) -> str:
    """A HOME-relative path as an absolute path on that worker (local workers know their HOME)."""
    home = session.cluster.workers[index].home
    return str(home / relative) if home is not None else relative


def raise_on_failure(result: FleetResult, what: str, *, worker_exit_code: bool = False) -> None:
    error = failure_error(result, what, worker_exit_code=worker_exit_code)
    if error is not None:
        raise error
