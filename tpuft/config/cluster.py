"""The cluster file (``tpuft.yaml``): where training runs, the provider, the TPU shape, the bucket, how tpuft
reaches the workers, and preemption recovery. Loaded by :func:`tpuft.config.load_cluster`.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from tpuft.core import formats
from tpuft.core.config_types import (
    Command,
    Duration,
    Endpoint,
    Image,
    KeyPath,
    LaxPath,
    Network,
    PathText,
    ProjectId,
    Reservation,
    RuntimeVersion,
    Scope,
    ServiceAccount,
    StrictModel,
    UserName,
    Zone,
    check,
)
from tpuft.core.config_types import (
    path_from_file as _from_file,
)

if TYPE_CHECKING:
    from tpuft.backends.spec import ClusterShape
    from tpuft.core.accelerators import AcceleratorType


def _folder(text: str, info: ValidationInfo) -> Path:
    """:func:`_from_file` for a folder tpuft will create: a file in the way is refused now, not at
    ``create``."""
    path = _from_file(text, info)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder")
    return path


class LocalConfig(StrictModel):
    """The local provider: a "pod" of N worker folders on this machine, each a private HOME."""

    workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Number of local workers (per slice); default: the accelerator type's host count.",
    )
    slices: int = Field(
        1,
        ge=1,
        le=16,
        description="Multislice rehearsal: this many slices of `local.workers` workers each, with "
        "the environment, mesh shape, data sharding and failure semantics of `gcp.slices` (no "
        "data-centre network here). See docs/multislice.md.",
    )
    devices_per_worker: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Devices each local worker exposes, to rehearse the slice's device layout (replicas "
        "x partitions, batch split); default: the accelerator's chips per host. Lower it for "
        "speed. See docs/device-layout.md.",
    )
    state_dir: LaxPath | None = Field(
        None,
        description="Where worker folders live; default: $TPUFT_HOME/local/<name> (~/.tpuft/local/<name>).",
    )
    venv_cache: LaxPath | None = Field(
        None,
        description="Shared cache of backend venvs (all local workers share this machine); "
        "default: $TPUFT_VENV_CACHE or ~/.cache/tpuft/venvs.",
    )
    python: Command = Field(
        "python3", description="Base interpreter used to build backend venvs on the workers."
    )

    @field_validator("state_dir", "venv_cache")
    @classmethod
    def _folder_or_absent(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _folder(str(value), info)


class GcpConfig(StrictModel):
    """The GCP provider: a Cloud TPU VM (or pod slice, or queued resource) in a project and zone; or, with
    ``api: compute``, Compute Engine instances (a managed instance group per multi-host slice)."""

    project: ProjectId | None = Field(None, description="GCP project id (required for provider: gcp).")
    api: Literal["tpu", "compute"] = Field(
        "tpu",
        description="Which API creates the TPUs: tpu (the Cloud TPU API: v2-v6e, queued resources) or "
        "compute (Compute Engine: TPU7x, single-host v5p and v6e; a multi-host slice is a managed instance "
        "group with a workload policy). docs/compute-engine.md",
    )
    zone: Zone | None = Field(None, description="Zone, e.g. us-central2-b (required for provider: gcp).")
    skip_zone_check: bool = Field(
        False,
        description="Accept a gcp.zone that tpuft's table of zones per TPU generation (Google's TPU regions "
        "and zones page, dated in tpuft/core/tpu_zones.py) does not list for the accelerator: a zone newer "
        "than the table.",
    )
    runtime_version: RuntimeVersion | None = Field(
        None, description="TPU software version; default: the catalogue's for the generation."
    )
    topology: str | None = Field(
        None,
        description="Use an accelerator config (type + topology, e.g. 2x2x4) instead of the accelerator type "
        "name.",
    )
    spot: bool = Field(False, description="Spot VMs: cheaper, can be preempted at any time.")
    preemptible: bool = Field(False, description="Legacy preemptible VMs (use spot on newer generations).")
    reserved: bool = Field(False, description="Use reserved capacity.")
    labels: dict[str, str] = Field(default_factory=dict, max_length=63, description="Labels on the node.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Node metadata, e.g. startup-script.")
    network: Network | None = Field(None, description="VPC network (default: the project's default network).")
    subnetwork: Network | None = Field(
        None, description="Subnetwork, e.g. a subnet with Private Google Access."
    )
    internal_ip: bool = Field(
        False, description="No external IPs: workers are reached on their internal addresses."
    )
    service_account: ServiceAccount | None = Field(None, description="Service account e-mail the VMs run as.")
    scopes: list[Scope] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"],
        description="OAuth scopes.",
    )
    queued: bool = Field(
        False, description="Ask through a queued resource (waits for capacity instead of failing)."
    )
    reservation: Reservation | None = Field(None, description="Reservation name for a queued resource.")
    valid_until: str | None = Field(
        None,
        description="Queued resource: give up after this long, e.g. 6h or 90m (a duration) or an RFC 3339 "
        "time.",
    )
    slices: int = Field(1, ge=1, le=256, description="Multislice: this many slices (queued resources only).")
    tpu_api_endpoint: Endpoint | None = Field(
        None, description="Cloud TPU API endpoint (private endpoints; tests); also $TPUFT_TPU_API_ENDPOINT."
    )
    compute_api_endpoint: Endpoint | None = Field(
        None,
        description="gcp.api: compute: the Compute Engine API endpoint for every call, operation polls "
        "included (private endpoints; tests); also $TPUFT_COMPUTE_API_ENDPOINT.",
    )
    image: Image | None = Field(
        None,
        description="gcp.api: compute: the hosts' boot image (projects/P/global/images/family/F); default: "
        "Google's TPU image for the generation (ubuntu-os-accelerator-images).",
    )
    boot_disk_gb: int | None = Field(
        None, ge=10, le=65536, description="gcp.api: compute: boot disk size, GB (default: the image's)."
    )
    timeout: Duration = Field(
        30.0,
        description=(
            "Budget for one command's calls to Google Cloud (TPU API, Storage, token refresh), "
            "retries included: when the network is down a command fails within it."
        ),
    )
    venv_cache: PathText = Field(
        "~/.cache/tpuft/venvs", description="Where workers keep backend venvs (a path on the workers)."
    )
    python: Command = Field("python3", description="Interpreter on the workers that venvs are built from.")
    worker_device: Literal["tpu", "cpu"] = Field(
        "tpu",
        description="'cpu' when the hosts have no TPU (CPU VMs, test rigs): CPU wheels and PJRT_DEVICE=CPU.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GcpConfig:
        if self.spot and self.preemptible:
            raise ValueError("gcp.spot and gcp.preemptible exclude each other (spot is the newer kind)")
        if self.slices > 1 and not self.queued and self.api == "tpu":
            raise ValueError("gcp.slices > 1 (multislice) needs gcp.queued: true (or gcp.api: compute)")
        return self

    @field_validator("valid_until")
    @classmethod
    def _valid_until_ok(cls, value: str | None) -> str | None:
        if value is None or parse_duration(value) is not None:
            return value
        if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)", value):
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
                return value
            except ValueError:
                pass
        raise ValueError(
            "expected a duration like 6h, 90m, 3600s or an RFC 3339 time like 2026-12-01T00:00:00Z"
        )

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = self.api_problems()
        for key, value in self.labels.items():
            problem = formats.label_problem(key, value)
            if problem:
                found.append((("labels", key), problem))
        for key, value in self.metadata.items():
            problem = formats.metadata_problem(key, value)
            if problem:
                found.append((("metadata", key), problem))
        return found

    def api_problems(self) -> list[tuple[KeyPath, str]]:
        """Keys that only one of the two APIs reads, set for the other: refused, since they would be
        ignored."""
        tpu_only = {
            "queued": "queued resources are the Cloud TPU API's (a managed instance group waits for capacity "
            "by itself)",
            "runtime_version": "a Cloud TPU API software version; Compute Engine boots an image: use "
            "gcp.image",
            "topology": "Compute Engine takes the topology from the accelerator (its workload policy's)",
            "preemptible": "legacy preemptible TPUs are the Cloud TPU API's: use gcp.spot",
            "valid_until": "a queued resource's deadline (Cloud TPU API)",
            "tpu_api_endpoint": "the Cloud TPU API's endpoint: use gcp.compute_api_endpoint",
        }
        compute_only = ("compute_api_endpoint", "image", "boot_disk_gb")
        found: list[tuple[KeyPath, str]] = []
        if self.api == "compute":
            for key, why in tpu_only.items():
                if key in self.model_fields_set and getattr(self, key) not in (None, False):
                    found.append(((key,), f"does not apply to gcp.api: compute: {why}"))
            guest = self.metadata.get("enable-guest-attributes")
            if guest is not None and guest.upper() != "TRUE":
                found.append(
                    (
                        ("metadata", "enable-guest-attributes"),
                        "Compute Engine publishes the hosts' SSH host keys (which tpuft pins) only with "
                        "enable-guest-attributes=TRUE: leave the key out, tpuft sets it",
                    )
                )
        else:
            for key in compute_only:
                if getattr(self, key) is not None:
                    found.append(
                        ((key,), "applies to gcp.api: compute only (set gcp.api: compute, or remove it)")
                    )
        return found


def parse_duration(text: str) -> int | None:
    """``90m`` -> 5400 seconds; None when it is not a duration."""
    match = re.fullmatch(r"(\d{1,9})\s*([smhd])", text.strip())
    if not match:
        return None
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


class SshConfig(StrictModel):
    """How tpuft reaches the workers of a GCP cluster."""

    user: UserName | None = Field(None, description="Login user on the VMs (default: your local user name).")
    key_file: LaxPath = Field(
        Path("~/.ssh/google_compute_engine"),
        description="Private key (gcloud's by default; created if missing).",
    )
    port: int = Field(22, ge=1, le=65535, description="SSH port of the workers.")
    os_login: bool = Field(
        False, description="The project uses OS Login: do not put the key in instance metadata."
    )
    connect_attempts: int = Field(10, ge=1, le=100, description="Connection tries per worker (like gcloud).")
    retry_delay_s: float = Field(5.0, ge=0.0, le=300.0, description="Seconds between connection tries.")
    ssh_config: LaxPath | None = Field(
        Path("~/.ssh/config"),
        description="OpenSSH client config whose Host blocks apply to the workers (User, Port, IdentityFile, "
        "ProxyJump); user/key_file/port written in this file win over it. null: read none.",
    )

    @field_validator("key_file")
    @classmethod
    def _key_file_ok(cls, value: Path) -> Path:
        check(formats.path_text_problem(str(value)))
        if value.expanduser().is_dir():
            raise ValueError(
                f"{value} is a folder; give the private key file (e.g. ~/.ssh/google_compute_engine)"
            )
        return value

    @field_validator("ssh_config")
    @classmethod
    def _ssh_config_ok(cls, value: Path | None) -> Path | None:
        if value is not None:
            check(formats.path_text_problem(str(value)))
            if value.expanduser().is_dir():
                raise ValueError(f"{value} is a folder; give the ssh client config file (e.g. ~/.ssh/config)")
        return value

    def explicit(self) -> tuple[str, ...]:
        """Which of user, key_file and port this file (or --set) wrote with a value, sorted: those win over
        ssh_config's Host blocks; the rest are defaults that a Host block replaces (``user: null`` is a
        default)."""
        return tuple(
            name
            for name in ("key_file", "port", "user")
            if name in self.model_fields_set and getattr(self, name) is not None
        )


_ENV_TOKEN = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env_tokens(text: str) -> tuple[str, list[str]]:
    """``${VAR}`` -> its value in this process's environment, ``$$`` -> ``$``; returns the text and the names
    that are not set (left as written)."""
    missing: list[str] = []

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        if name not in os.environ:
            missing.append(name)
            return match.group(0)
        return os.environ[name]

    return _ENV_TOKEN.sub(one, text), missing


class RecoverConfig(StrictModel):
    """Preemption recovery: a watcher on the controller recreates a lost node and resumes the run from its
    last complete checkpoint. ``recover: true`` in the cluster file turns it on with these defaults."""

    enabled: bool = Field(False, description="Watch every run and recover it from infrastructure failures.")
    max_attempts: int = Field(
        10, ge=1, le=1000, description="Recoveries per run before the watcher gives up."
    )
    backoff: Duration = Field(
        30.0, description="Wait before the first recovery; doubles after each, up to backoff_max."
    )
    backoff_max: Duration = Field(900.0, description="The longest wait between two recoveries.")
    poll: Duration = Field(
        30.0, description="How often the watcher asks the TPU API about the node while attached."
    )

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value: Any) -> Any:
        """``recover: true`` / ``false`` is short for ``{enabled: ...}``; a mapping without ``enabled`` turns
        it on."""
        if isinstance(value, bool):
            return {"enabled": value}
        if isinstance(value, dict) and value and "enabled" not in value:
            return {**value, "enabled": True}
        return value


SHAPE_KEYS: tuple[KeyPath, ...] = (
    ("provider",),
    ("accelerator",),
    ("local", "workers"),
    ("local", "slices"),
    ("local", "devices_per_worker"),
    ("gcp", "slices"),
    ("gcp", "worker_device"),
)
"""The keys :meth:`ClusterConfig.shape` reads: a recipe is checked against the cluster only when none of them
was left out of a cluster file with problems (a default in its place would be another cluster)."""


class ClusterConfig(StrictModel):
    """Where training runs: the provider, the TPU shape and the bucket."""

    name: str = Field(
        "tpuft-local", description="Cluster (TPU node) name: lowercase letters, digits and dashes."
    )
    provider: Literal["local", "gcp"] = Field(
        "local", description="'local' (a pod of folders here) or 'gcp'."
    )
    accelerator: str = Field("v4-16", description="TPU accelerator type, e.g. v4-8, v5litepod-16, v6e-8.")
    bucket: str | None = Field(
        None,
        description="Run storage. gcp: gs://NAME (default gs://<project>-tpuft); local: a folder "
        "(default ~/.tpuft/buckets/<name>).",
    )
    worker_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for every worker process, e.g. XLA_FLAGS; ${VAR} takes VAR from this "
        "machine's "
        "environment (HF_TOKEN: ${HF_TOKEN}), $$ is a $. Sent over SSH's stdin, never in a command line.",
    )
    local: LocalConfig = Field(default_factory=LocalConfig)
    gcp: GcpConfig = Field(default_factory=GcpConfig)
    ssh: SshConfig = Field(default_factory=SshConfig)
    recover: RecoverConfig = Field(default_factory=RecoverConfig)
    _unset_env: dict[str, str] = PrivateAttr(default_factory=dict)
    """worker_env keys whose ``${VAR}`` is not set here (reported by ``cross_problems``)."""
    _shape_origin: str = PrivateAttr(default="")
    """Where the worker count was written (``tpuft.yaml:5: local.workers: 3``), set by the loader."""

    @field_validator("bucket")
    @classmethod
    def _bucket_fits_provider(cls, value: str | None, info: ValidationInfo) -> str | None:
        """gs:// for gcp; a folder for local (relative to the cluster file, like every path in it)."""
        if value is None:
            return None
        provider = info.data.get("provider")
        if provider == "gcp":
            if not value.startswith("gs://"):
                raise ValueError(f"provider gcp keeps runs in a bucket: expected gs://NAME (got {value!r})")
            check(formats.bucket_problem(value))
        elif provider == "local":
            if value.startswith("gs://"):
                raise ValueError(
                    f"{value!r}: the local provider keeps runs in a local folder; give a path (or leave "
                    "bucket unset)"
                )
            return str(_folder(value, info))
        return value

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", value):
            raise ValueError("must be 1-63 lowercase letters, digits or dashes, starting with a letter")
        return value

    @field_validator("accelerator")
    @classmethod
    def _accelerator_ok(cls, value: str) -> str:
        from tpuft.core.accelerators import lookup

        try:
            return lookup(value).name
        except Exception as exc:  # noqa: BLE001 - UsageError carries the list of valid types
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _expand_env_tokens(self) -> ClusterConfig:
        """``${VAR}`` from the controller's environment, so a token is named in the file and never written in
        it. An unset VAR stays as written here and is reported, at its key, by ``cross_problems``."""
        expanded, unset = {}, {}
        for key, text in self.worker_env.items():
            expanded[key], missing = expand_env_tokens(text)
            if missing:
                unset[key] = missing[0]
        self.worker_env = expanded
        self._unset_env = unset
        return self

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        from tpuft.core.accelerators import lookup

        found: list[tuple[KeyPath, str]] = []
        missing = [key for key in ("project", "zone") if not getattr(self.gcp, key)]
        if self.provider == "gcp" and missing:  # a check, not a validator: the rest is checked all the same
            found.append((("gcp",), f"provider gcp needs gcp.{' and gcp.'.join(missing)}"))
        for key, value in self.worker_env.items():
            unset = self._unset_env.get(key)
            if unset:
                found.append(
                    (
                        ("worker_env", key),
                        f"${{{unset}}} is not set in this machine's environment "
                        f"(export {unset}=... before running tpuft; $$ writes a $)",
                    )
                )
                continue
            problem = formats.env_name_problem(key) or formats.env_value_problem(value)
            if problem:
                found.append((("worker_env", key), problem))
        accelerator = lookup(self.accelerator)
        if self.provider == "gcp" and self.local.workers is not None:
            found.append(
                (
                    ("local", "workers"),
                    f"applies to provider local only; on gcp the workers are the hosts of {accelerator.name} "
                    f"({accelerator.hosts}): remove local.workers",
                )
            )
        if self.gcp.topology is not None:
            problem = formats.topology_problem(
                self.gcp.topology, accelerator.generation.topology_dims, accelerator.chips, accelerator.name
            )
            if problem:
                found.append((("gcp", "topology"), problem))
        if self.provider == "gcp" and self.local.devices_per_worker is not None:
            found.append(
                (
                    ("local", "devices_per_worker"),
                    f"applies to provider local only; on gcp each worker drives its host's chips "
                    f"({accelerator.chips_per_host}): remove local.devices_per_worker",
                )
            )
        if self.provider == "gcp":
            found += self._api_accelerator_problems(accelerator)
        if self.provider == "gcp" and self.gcp.zone and not self.gcp.skip_zone_check:
            from tpuft.core.tpu_zones import zone_problem

            problem = zone_problem(accelerator.generation.name, self.gcp.zone)
            if problem:
                found.append((("gcp", "zone"), problem))
        found += [(("gcp", *path), message) for path, message in self.gcp.cross_problems()]
        return found

    def _api_accelerator_problems(self, accelerator: AcceleratorType) -> list[tuple[KeyPath, str]]:
        """The accelerator against the API that would make it: TPU7x is Compute Engine's only; Compute Engine
        makes TPU7x and single-host v5p/v6e."""
        from tpuft.core.compute_tpus import compute_problem

        generation = accelerator.generation
        if self.gcp.api == "compute":
            problem = compute_problem(accelerator)
            return [(("accelerator",), problem)] if problem else []
        if "tpu" not in generation.apis:
            return [
                (
                    ("accelerator",),
                    f"{accelerator.name}: {generation.name} TPUs are made through Compute Engine, not the "
                    "Cloud TPU API (Google's TPU documentation, from TPU7x on): set gcp.api: compute",
                )
            ]
        return []

    def shape_keys(self) -> list[KeyPath]:
        """The keys that decide how many workers there are: what to point at when a recipe does not fit
        them."""
        if self.provider == "local":
            keys: list[KeyPath] = (
                [("local", "workers")] if self.local.workers is not None else [("accelerator",)]
            )
            return keys + [("local", "slices")] if self.local.slices > 1 else keys
        return [("accelerator",), ("gcp", "slices")] if self.gcp.slices > 1 else [("accelerator",)]

    def shape_origin(self) -> str:
        """``tpuft.yaml:5: local.workers: 3``: where the cluster's worker count comes from, for an error that
        is about the recipe and the cluster together (a batch that does not split over the workers)."""
        return self._shape_origin or f"accelerator: {self.accelerator} ({self.num_workers} workers)"

    @property
    def num_workers(self) -> int:
        """Worker hosts: the accelerator type's (times the slices of a multislice), or ``local.workers``
        locally."""
        from tpuft.core.accelerators import lookup

        hosts = lookup(self.accelerator).hosts
        return self.hosts_per_slice * self.slices if self.provider == "local" else hosts * self.gcp.slices

    @property
    def slices(self) -> int:
        """Multislice: the slices of the cluster (``local.slices`` or ``gcp.slices``); 1 for one slice."""
        return self.local.slices if self.provider == "local" else self.gcp.slices

    @property
    def hosts_per_slice(self) -> int:
        from tpuft.core.accelerators import lookup

        hosts = lookup(self.accelerator).hosts
        return (self.local.workers or hosts) if self.provider == "local" else hosts

    def shape(self, hosts: int | None = None) -> ClusterShape:
        """The cluster as a backend plans for it; ``hosts``: the workers the provider reports, when known."""
        from tpuft.backends.spec import ClusterShape
        from tpuft.core.accelerators import lookup

        accelerator = lookup(self.accelerator)
        if self.provider != "local":
            return ClusterShape(
                hosts or self.num_workers,
                accelerator.chips_per_host,
                self.gcp.worker_device,
                accelerator.generation.devices_per_chip,
                generation=accelerator.generation.name,
                slices=self.slices,
            )
        chosen = self.local.devices_per_worker
        return ClusterShape(
            hosts or self.num_workers,
            accelerator.chips_per_host,
            "cpu",
            accelerator.generation.devices_per_chip,
            local_devices=chosen or accelerator.chips_per_host,
            local_devices_set=chosen is not None,
            slices=self.slices,
        )
