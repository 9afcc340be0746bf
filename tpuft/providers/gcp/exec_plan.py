"""What a cold ``tpuft exec`` needs to reach a GCP cluster's workers, remembered per cluster file, so that the
next one skips the cluster file's validation (pydantic: about 0.2 s of a command that should cost one ``ssh``)
and the TPU API, and still never trusts a host key the API did not publish.

A plan is written after an ``exec`` that went through the whole path (the file validated, the node described
or remembered, the key in its metadata, the host keys pinned: :meth:`GcpProvider.prepare`) and holds no
secret: the file's SHA-256 and the environment its validation read, where the cluster's state lives, and the
resolved SSH settings. A file with ``worker_env`` gets no plan (its values, tokens among them, are read from
this machine's environment by the validation itself, and never land in tpuft's state files). :func:`load`
hands the plan out only when the file's bytes, tpuft's version and that environment are the same, and the
remembered workers (``cluster.json``) still have their host keys pinned in ``known_hosts`` for the same nodes
and addresses, which is exactly when ``prepare`` would do nothing; however old the workers are, because the
caller re-checks with the API when a connection fails (a recreated node answers with a key that is not pinned,
and is refused until then).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.core.paths import tpuft_home
from tpuft.core.records import Cluster
from tpuft.fleet.ssh_config import SshSettings, known_hosts_name
from tpuft.providers.gcp.cache import WorkerCache, cluster_of

PLAN_VERSION = 1
_PATHS = ("key_file", "known_hosts", "ssh_config")
"""SshSettings fields that are paths (JSON has strings)."""
_ENVIRONMENT = ("HOME", "LOGNAME", "USER", "LNAME", "USERNAME")
"""What the validation of a file without ``worker_env`` reads from the environment: ``~`` and the login name
(``getpass.getuser``'s variables)."""


@dataclass(frozen=True)
class ExecPlan:
    cluster: Cluster
    settings: SshSettings
    age_s: float
    """Since the workers were last confirmed (the API described the node, or :func:`confirm`): past the
    provider's cache time the caller tries each worker once before asking the API (a node that is gone should
    not cost ``connect_attempts`` x ``retry_delay_s`` first)."""
    memory: Path
    """The remembered workers' file (``cluster.json``)."""


def plan_path(config_path: str) -> Path:
    return tpuft_home() / "exec-plans" / f"{hashlib.sha256(config_path.encode()).hexdigest()[:24]}.json"


def identity(config_path: str) -> dict[str, Any] | None:
    """What must not have changed since the plan was made; None when the file cannot be read."""
    from tpuft import __version__

    # a tpuft being worked on changes it
    schema = Path(__file__).resolve().parents[2] / "config" / "cluster.py"
    try:
        digest = hashlib.sha256(Path(config_path).read_bytes()).hexdigest()
        schema_changed = schema.stat().st_mtime_ns
    except OSError:
        return None
    return {
        "plan": PLAN_VERSION,
        "tpuft": __version__,
        "schema": schema_changed,
        "file": config_path,
        "sha256": digest,
        "env": {name: os.environ.get(name) for name in _ENVIRONMENT},
    }


def remember(
    config_path: str, state_dir: Path, settings: SshSettings, cluster_name: str, key: str | None
) -> None:
    """Called once the whole path reached the workers (pins checked). ``key``: the ``user:public-key`` entry
    that must be in the node's metadata (None with OS Login). Best effort: a plan that cannot be written only
    means the next command takes the whole path again."""
    ident = identity(config_path)
    if ident is None:
        return
    fields = {
        name: (
            str(value)
            if name in _PATHS and value is not None
            else list(value)
            if name == "explicit"
            else value
        )
        for name, value in dataclasses.asdict(settings).items()
    }
    record = {
        "identity": ident,
        "state_dir": str(state_dir),
        "name": cluster_name,
        "settings": fields,
        "key": key,
    }
    path = plan_path(config_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(record))
        os.replace(partial, path)
    except OSError:
        pass


def forget(config_path: str) -> None:
    plan_path(config_path).unlink(missing_ok=True)


def load(config_path: str) -> ExecPlan | None:
    """The plan for this cluster file, or None: take the whole path (validate the file, ask the API if need
    be)."""
    try:
        record = json.loads(plan_path(config_path).read_text())
        if record.get("identity") != identity(config_path):
            return None
        fields = dict(record["settings"])
        for name in _PATHS:
            fields[name] = Path(fields[name]) if fields.get(name) is not None else None
        fields["explicit"] = tuple(fields["explicit"])
        settings = SshSettings(**fields)
        state_dir = Path(record["state_dir"])
        name = str(record["name"])
        key = record["key"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if settings.known_hosts is None or not settings.known_hosts.exists():
        return None
    # however old: see the module's docstring
    remembered = WorkerCache(state_dir / "cluster.json").read() or {}
    cluster = cluster_of(remembered, name, "gcp")
    if cluster is None:
        return None
    if key is not None and remembered.get("key") != key:
        return None  # the user's key is not known to be in this node's metadata: prepare adds it
    hosts = [known_hosts_name(w.address, settings.port) for w in cluster.workers]
    nodes = remembered.get("nodes")
    if not nodes or remembered.get("pins") != {"nodes": nodes, "hosts": hosts}:
        return None  # prepare would (re)pin: the whole path does it
    memory = state_dir / "cluster.json"
    return ExecPlan(cluster, settings, max(0.0, time.time() - float(remembered.get("time", 0))), memory)


def confirm(plan: ExecPlan) -> None:
    """Every worker answered with the host key the API published for this node: the remembered workers are as
    good as a fresh description for as long as one is trusted (the connection agent goes by the same time)."""
    cache = WorkerCache(plan.memory)
    record = cache.read()
    if record is not None and cluster_of(record, plan.cluster.name, "gcp") == plan.cluster:
        try:
            cache.write({**record, "time": time.time()})
        except OSError:
            pass
