"""The two files a user writes: the cluster file (``tpuft.yaml``) and a recipe (``recipes/NAME.yaml``).

Both are pydantic models with ``extra="forbid"`` and strict types (YAML ``true`` is not 1, ``1.5`` is not an int,
numbers are finite and bounded). Loading keeps a map from every key path to its YAML line, so each problem is
reported as ``file:line: key.path: what is wrong (got X)``, all problems at once, exit code 2, before anything runs.
``--set a.b=c`` overrides are applied to the raw YAML first and located as ``--set a.b``. The YAML itself is read by
:mod:`tpuft.safe_yaml` (bounded size, depth and alias expansion; YAML 1.2 scalars).

This module is imported on the worker too (inside the backend venv), so it depends on pydantic and PyYAML only.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tpuft import formats, safe_yaml
from tpuft.config_types import (
    Command,
    Count,
    Duration,
    Endpoint,
    KeyPath,
    LaxPath,
    ModelRef,
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
    path_from_file as _from_file,
)
from tpuft.errors import ConfigError

if TYPE_CHECKING:
    from tpuft.backends.base import ClusterShape
from tpuft.t5_config import BYT5_VOCAB, T5Settings
from tpuft.templates import TemplateError, template_fields

# --------------------------------------------------------------------------------------------------------------
# Cluster file


def _folder(text: str, info: ValidationInfo) -> Path:
    """:func:`_from_file` for a folder tpuft will create: a file in the way is refused now, not at ``create``."""
    path = _from_file(text, info)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder")
    return path


class LocalConfig(StrictModel):
    """The local provider: a "pod" of N worker folders on this machine, each a private HOME."""

    workers: int | None = Field(
        None, ge=1, le=64, description="Number of local workers; default: the accelerator type's host count."
    )
    state_dir: LaxPath | None = Field(
        None, description="Where worker folders live; default: $TPUFT_HOME/local/<name> (~/.tpuft/local/<name>)."
    )
    venv_cache: LaxPath | None = Field(
        None,
        description="Shared cache of backend venvs (all local workers share this machine); "
        "default: $TPUFT_VENV_CACHE or ~/.cache/tpuft/venvs.",
    )
    python: Command = Field("python3", description="Base interpreter used to build backend venvs on the workers.")

    @field_validator("state_dir", "venv_cache")
    @classmethod
    def _folder_or_absent(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else _folder(str(value), info)


class GcpConfig(StrictModel):
    """The GCP provider: a Cloud TPU VM (or pod slice, or queued resource) in a project and zone."""

    project: ProjectId | None = Field(None, description="GCP project id (required for provider: gcp).")
    zone: Zone | None = Field(None, description="Zone, e.g. us-central2-b (required for provider: gcp).")
    runtime_version: RuntimeVersion | None = Field(None, description="TPU software version; default: the catalogue's for the generation.")
    topology: str | None = Field(
        None, description="Use an accelerator config (type + topology, e.g. 2x2x4) instead of the accelerator type name."
    )
    spot: bool = Field(False, description="Spot VMs: cheaper, can be preempted at any time.")
    preemptible: bool = Field(False, description="Legacy preemptible VMs (use spot on newer generations).")
    reserved: bool = Field(False, description="Use reserved capacity.")
    labels: dict[str, str] = Field(default_factory=dict, max_length=63, description="Labels on the node.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Node metadata, e.g. startup-script.")
    network: Network | None = Field(None, description="VPC network (default: the project's default network).")
    subnetwork: Network | None = Field(None, description="Subnetwork, e.g. a subnet with Private Google Access.")
    internal_ip: bool = Field(False, description="No external IPs: workers are reached on their internal addresses.")
    service_account: ServiceAccount | None = Field(None, description="Service account e-mail the VMs run as.")
    scopes: list[Scope] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"], description="OAuth scopes."
    )
    queued: bool = Field(False, description="Ask through a queued resource (waits for capacity instead of failing).")
    reservation: Reservation | None = Field(None, description="Reservation name for a queued resource.")
    valid_until: str | None = Field(
        None, description="Queued resource: give up after this long, e.g. 6h or 90m (a duration) or an RFC 3339 time."
    )
    slices: int = Field(1, ge=1, le=256, description="Multislice: this many slices (queued resources only).")
    tpu_api_endpoint: Endpoint | None = Field(
        None, description="Cloud TPU API endpoint (private endpoints; tests); also $TPUFT_TPU_API_ENDPOINT."
    )
    venv_cache: PathText = Field("~/.cache/tpuft/venvs", description="Where workers keep backend venvs (a path on the workers).")
    python: Command = Field("python3", description="Interpreter on the workers that venvs are built from.")
    worker_device: Literal["tpu", "cpu"] = Field(
        "tpu", description="'cpu' when the hosts have no TPU (CPU VMs, test rigs): CPU wheels and PJRT_DEVICE=CPU."
    )

    @model_validator(mode="after")
    def _consistent(self) -> GcpConfig:
        if self.spot and self.preemptible:
            raise ValueError("gcp.spot and gcp.preemptible exclude each other (spot is the newer kind)")
        if self.slices > 1 and not self.queued:
            raise ValueError("gcp.slices > 1 (multislice) needs gcp.queued: true")
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
        raise ValueError("expected a duration like 6h, 90m, 3600s or an RFC 3339 time like 2026-12-01T00:00:00Z")

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        for key, value in self.labels.items():
            problem = formats.label_problem(key, value)
            if problem:
                found.append((("labels", key), problem))
        for key, value in self.metadata.items():
            problem = formats.metadata_problem(key, value)
            if problem:
                found.append((("metadata", key), problem))
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
        Path("~/.ssh/google_compute_engine"), description="Private key (gcloud's by default; created if missing)."
    )
    port: int = Field(22, ge=1, le=65535)
    os_login: bool = Field(False, description="The project uses OS Login: do not put the key in instance metadata.")
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
            raise ValueError(f"{value} is a folder; give the private key file (e.g. ~/.ssh/google_compute_engine)")
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
        ssh_config's Host blocks; the rest are defaults that a Host block replaces (``user: null`` is a default)."""
        return tuple(
            name for name in ("key_file", "port", "user") if name in self.model_fields_set and getattr(self, name) is not None
        )


_ENV_TOKEN = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env_tokens(text: str) -> tuple[str, list[str]]:
    """``${VAR}`` -> its value in this process's environment, ``$$`` -> ``$``; returns the text and the names that are
    not set (left as written)."""
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
    """Preemption recovery: a watcher on the controller recreates a lost node and resumes the run from its last
    complete checkpoint. ``recover: true`` in the cluster file turns it on with these defaults."""

    enabled: bool = Field(False, description="Watch every run and recover it from infrastructure failures.")
    max_attempts: int = Field(10, ge=1, le=1000, description="Recoveries per run before the watcher gives up.")
    backoff: Duration = Field(30.0, description="Wait before the first recovery; doubles after each, up to backoff_max.")
    backoff_max: Duration = Field(900.0, description="The longest wait between two recoveries.")
    poll: Duration = Field(30.0, description="How often the watcher asks the TPU API about the node while attached.")

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value: Any) -> Any:
        """``recover: true`` / ``false`` is short for ``{enabled: ...}``; a mapping without ``enabled`` turns it on."""
        if isinstance(value, bool):
            return {"enabled": value}
        if isinstance(value, dict) and value and "enabled" not in value:
            return {**value, "enabled": True}
        return value


class ClusterConfig(StrictModel):
    """Where training runs: the provider, the TPU shape and the bucket."""

    name: str = Field("tpuft-local", description="Cluster (TPU node) name: lowercase letters, digits and dashes.")
    provider: Literal["local", "gcp"] = Field("local", description="'local' (a pod of folders here) or 'gcp'.")
    accelerator: str = Field("v4-16", description="TPU accelerator type, e.g. v4-8, v5litepod-16, v6e-8.")
    bucket: str | None = Field(
        None,
        description="Run storage. gcp: gs://NAME (default gs://<project>-tpuft); local: a folder "
        "(default ~/.tpuft/buckets/<name>).",
    )
    worker_env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment for every worker process, e.g. XLA_FLAGS; ${VAR} takes VAR from this machine's "
        "environment (HF_TOKEN: ${HF_TOKEN}), $$ is a $. Sent over SSH's stdin, never in a command line.",
    )
    local: LocalConfig = Field(default_factory=LocalConfig)
    gcp: GcpConfig = Field(default_factory=GcpConfig)
    ssh: SshConfig = Field(default_factory=SshConfig)
    recover: RecoverConfig = Field(default_factory=RecoverConfig)
    _unset_env: dict[str, str] = PrivateAttr(default_factory=dict)
    """worker_env keys whose ``${VAR}`` is not set here (reported by ``cross_problems``)."""

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
                    f"{value!r}: the local provider keeps runs in a local folder; give a path (or leave bucket unset)"
                )
            return str(_folder(value, info))
        return value

    @field_validator("gcp")
    @classmethod
    def _gcp_complete(cls, value: GcpConfig, info: ValidationInfo) -> GcpConfig:
        missing = [key for key in ("project", "zone") if not getattr(value, key)]
        if info.data.get("provider") == "gcp" and missing:
            raise ValueError(f"provider gcp needs gcp.{' and gcp.'.join(missing)}")
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
        from tpuft.accelerators import lookup

        try:
            return lookup(value).name
        except Exception as exc:  # UsageError carries the list of valid types
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _expand_env_tokens(self) -> ClusterConfig:
        """``${VAR}`` from the controller's environment, so a token is named in the file and never written in it.
        An unset VAR stays as written here and is reported, at its key, by ``cross_problems``."""
        expanded, unset = {}, {}
        for key, text in self.worker_env.items():
            expanded[key], missing = expand_env_tokens(text)
            if missing:
                unset[key] = missing[0]
        self.worker_env = expanded
        self._unset_env = unset
        return self

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        from tpuft.accelerators import lookup

        found: list[tuple[KeyPath, str]] = []
        for key, value in self.worker_env.items():
            unset = self._unset_env.get(key)
            if unset:
                found.append((("worker_env", key), f"${{{unset}}} is not set in this machine's environment "
                                                   f"(export {unset}=... before running tpuft; $$ writes a $)"))
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
        found += [(("gcp", *path), message) for path, message in self.gcp.cross_problems()]
        return found

    @property
    def num_workers(self) -> int:
        """Worker hosts: the accelerator type's (times the slices of a multislice), or ``local.workers`` locally."""
        from tpuft.accelerators import lookup

        hosts = lookup(self.accelerator).hosts
        return (self.local.workers or hosts) if self.provider == "local" else hosts * self.gcp.slices

    def shape(self, hosts: int | None = None) -> ClusterShape:
        """The cluster as a backend plans for it; ``hosts``: the workers the provider reports, when known."""
        from tpuft.accelerators import lookup
        from tpuft.backends.base import ClusterShape

        accelerator = lookup(self.accelerator)
        target = "cpu" if self.provider == "local" else self.gcp.worker_device
        return ClusterShape(hosts or self.num_workers, accelerator.chips_per_host, target,
                            accelerator.generation.devices_per_chip)


# --------------------------------------------------------------------------------------------------------------
# Recipe


def _backend_union() -> Any:
    """Every registered backend's own recipe section (``backends/<kind>.py``), told apart by ``kind``."""
    from tpuft.backends.registry import config_models

    models = tuple(config_models())
    union = models[0] if len(models) == 1 else Union[models]  # noqa: UP007 - built at run time from the registry
    return Annotated[union, Field(discriminator="kind")]


Backend = _backend_union()


class PromptTuning(StrictModel):
    """Soft prompt tuning (Lester et al., 2021): the model is frozen and only a few prompt embeddings learn."""

    tokens: int = Field(100, ge=1, le=4096, description="Prompt length in embedding vectors.")
    init: Literal["vocab", "random"] = Field(
        "vocab", description="'vocab': start from the embeddings of random vocabulary tokens (the paper's best); 'random'."
    )


class ModelConfig(StrictModel):
    name_or_path: ModelRef | None = Field(
        None, description="A Hugging Face model id or a local directory to start from (e.g. google/t5-v1_1-small)."
    )
    config: T5Settings | None = Field(
        None, description="Random-init model: keyword arguments for transformers.T5Config (d_model, num_layers, ...)."
    )
    tokenizer: ModelRef = Field(
        "byt5", description="'byt5' for the byte-level ByT5 tokenizer (needs no files), or an HF id / local path."
    )
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="Override the model's dropout rate.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass: less memory for about a third more compute."
    )
    freeze: list[Literal["embeddings", "encoder", "decoder"]] = Field(
        default_factory=list, max_length=3, description="Parts whose weights are not trained (they stay bit-identical)."
    )
    prompt_tuning: PromptTuning | None = Field(
        None, description="Soft prompt tuning: train only `tokens` prompt vectors put before every input; the model is frozen."
    )

    @field_validator("freeze")
    @classmethod
    def _freeze_once(cls, value: list[str]) -> list[str]:
        twice = sorted({part for part in value if value.count(part) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.name_or_path is not None and self.config is not None:
            raise ValueError("give exactly one of model.name_or_path (pretrained) or model.config (random init)")
        return self

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        vocab = self.config.vocab_size if self.config is not None else None
        if self.tokenizer == "byt5" and vocab is not None and vocab < BYT5_VOCAB:
            return [
                (
                    ("config", "vocab_size"),
                    f"{vocab} is smaller than the byt5 tokenizer's {BYT5_VOCAB} ids (leave it out: the tokenizer's "
                    "size is the default)",
                )
            ]
        return []


TransformName = Literal["strip_diacritics", "lowercase", "nfc", "nfkc", "collapse_whitespace", "strip"]
"""Text transforms a recipe names (tpuft/worker/text_transforms.py); seed 003's task is ``source_transforms:
[strip_diacritics]`` on the same field as the target."""


class HfDataset(StrictModel):
    """A Hugging Face dataset: a hub id (the workers must reach the hub), a local dataset folder, or a builder
    (``json``, ``csv``, ``parquet``, ``text``) over ``data_files`` that may be local or ``gs://``."""

    path: str = Field(description="Hub id (e.g. wmt16), a local folder, or a builder: json, csv, parquet, text.")
    name: str | None = Field(None, description="The dataset's configuration, e.g. ro-en.")
    split: str = Field("train", description="Split to train on.")
    eval_split: str | None = Field(None, description="Split to evaluate on (e.g. validation); none: no evaluation data.")
    data_files: list[PathText] | dict[str, list[PathText]] = Field(
        default_factory=list, max_length=100_000,
        description="For a builder: files (or globs) of the train split, or {split: [files]}; local or gs://.",
    )
    streaming: bool = Field(True, description="Stream the data (never held whole in memory); false: download, map.")
    revision: str | None = Field(None, description="Hub revision (a tag, branch or commit) for reproducibility.")
    shuffle_buffer: int = Field(10_000, ge=0, le=10_000_000, description="Streaming shuffle buffer in examples (0: off).")
    loader_workers: int = Field(1, ge=0, le=64, description="Data-loader processes per worker (0: in the trainer).")

    @field_validator("path")
    @classmethod
    def _path_ok(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip() or any(ord(c) < 32 for c in value):
            raise ValueError(f"expected a dataset id, folder or builder name (got {value!r})")
        if value.startswith((".", "/", "~")):
            path = Path(os.path.normpath(_from_file(value, info)))
            if (info.context or {}).get("check_files", True) and not path.is_dir():
                raise ValueError(f"dataset folder not found: {path}")
            return str(path)
        return value

    @field_validator("data_files")
    @classmethod
    def _files_ok(cls, value: list[str] | dict[str, list[str]], info: ValidationInfo) -> list[str] | dict[str, list[str]]:
        def resolve(items: list[str]) -> list[str]:
            return [item if item.startswith("gs://") else str(Path(os.path.normpath(_from_file(item, info)))) for item in items]

        if isinstance(value, dict):
            return {split: resolve(items) for split, items in value.items()}
        return resolve(value)

    @model_validator(mode="after")
    def _splits_have_files(self) -> HfDataset:
        """A list of data_files is the train split's; with data_files given, load_dataset knows no other split."""
        if isinstance(self.data_files, list):
            if self.data_files and self.eval_split is not None and self.eval_split != self.split:
                raise ValueError(
                    f"data_files is a list, the files of split {self.split!r}: to evaluate on {self.eval_split!r} "
                    f"give both, e.g. data_files: {{{self.split}: [...], {self.eval_split}: [...]}}"
                )
            return self
        for role, split in (("split", self.split), ("eval_split", self.eval_split)):
            if split is not None and split not in self.data_files:
                raise ValueError(f"{role} {split!r} has no files in data_files (it names: "
                                 f"{', '.join(self.data_files) or 'none'})")
        return self


class DataConfig(StrictModel):
    train: LaxPath | None = Field(
        None, description="Training examples, JSON lines; relative paths are from the recipe's folder."
    )
    corpus: list[PathText] = Field(
        default_factory=list,
        max_length=10_000,
        description="Plain text for pretraining (span corruption), one document a line: files or globs, local "
        "(relative to the recipe's folder) or gs://.",
    )
    eval: LaxPath | None = Field(None, description="Held-out examples in the same format (for eval.* metrics).")
    source_field: str = Field("source", description="JSON field holding the input text (dots reach into objects).")
    target_field: str = Field("target", description="JSON field holding the output text.")
    source_template: str | None = Field(
        None, description="Build the input from several fields, e.g. 'question: {question} context: {context}'."
    )
    target_template: str | None = Field(None, description="Build the output from several fields, e.g. '{label}'.")
    prefix: str = Field("", max_length=4096, description="Task prefix prepended to every input, e.g. 'translate English to German: '.")
    max_source_length: int = Field(128, ge=1, le=65536, description="Inputs are truncated to this many tokens.")
    max_target_length: int = Field(32, ge=1, le=65536, description="Targets are truncated to this many tokens.")
    shuffle: bool = Field(True, description="Shuffle each worker's shard every epoch (seeded).")
    truncation: Literal["head", "tail", "head+tail"] = Field(
        "head",
        description="Which tokens of an input longer than max_source_length are kept: 'head' the first ones, 'tail' "
        "the last ones, 'head+tail' the first and the last half (long questions whose end matters too).",
    )
    source_transforms: list[TransformName] = Field(
        default_factory=list, max_length=16,
        description="Named text transforms applied to the input, in order, e.g. [strip_diacritics] with source_field "
        "and target_field the same field: the task of restoring diacritics, with no code.",
    )
    target_transforms: list[TransformName] = Field(
        default_factory=list, max_length=16, description="Named text transforms applied to the output, in order."
    )
    preprocess: str | None = Field(
        None,
        description="A hook for anything else: 'file.py:function' (relative to the recipe, shipped to the workers) or "
        "'package.module:function' (installed in the worker venv). It gets each record (a dict) and returns the "
        "record to use, or None to drop it.",
    )
    hf: HfDataset | None = Field(
        None, description="A Hugging Face dataset instead of data.train/data.eval files: streamed, sharded over workers."
    )
    label_field: str | None = Field(
        None, description="Classification: the JSON field holding each example's label (a name from labels, or its index)."
    )
    labels: list[str] = Field(
        default_factory=list, max_length=100_000, description="Classification: the label names, in class-id order."
    )

    @field_validator("train", "eval")
    @classmethod
    def _exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = Path(os.path.normpath(_from_file(str(value), info)))
        if (info.context or {}).get("check_files", True):
            if not path.exists():
                raise ValueError(f"file not found: {path}")
            if not path.is_file():
                raise ValueError(f"{path} is not a regular file (a folder, device or FIFO)")
        return path

    @field_validator("corpus")
    @classmethod
    def _corpus_files(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """Local globs are expanded now (sorted, so every worker sees the same list) and must match a file."""
        import glob

        files: list[str] = []
        for text in value:
            if text.startswith("gs://"):
                files.append(text)
                continue
            pattern = str(Path(os.path.normpath(_from_file(text, info))))
            found = sorted(p for p in glob.glob(pattern) if os.path.isfile(p)) if glob.has_magic(pattern) else [pattern]
            if (info.context or {}).get("check_files", True):
                if not found:
                    raise ValueError(f"{text!r} matches no file")
                for path in found:
                    if not os.path.isfile(path):
                        raise ValueError(f"file not found: {path}")
            files.extend(found)
        return files

    @field_validator("preprocess")
    @classmethod
    def _preprocess_ok(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        target, sep, function = value.rpartition(":")
        if not sep or not target or not function.isidentifier():
            raise ValueError(f"expected 'file.py:function' or 'package.module:function' (got {value!r})")
        if target.endswith(".py"):
            path = Path(os.path.normpath(_from_file(target, info)))
            if (info.context or {}).get("check_files", True) and not path.is_file():
                raise ValueError(f"file not found: {path}")
            return f"{path}:{function}"
        if not all(part.isidentifier() for part in target.split(".")):
            raise ValueError(f"{target!r} is neither a .py file nor a dotted module name")
        return value

    @model_validator(mode="after")
    def _one_dataset(self) -> DataConfig:
        if self.hf is not None and (self.train is not None or self.eval is not None):
            raise ValueError("give data.hf or data.train/data.eval files, not both")
        return self

    @field_validator("labels")
    @classmethod
    def _labels_ok(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if not name.strip():
                raise ValueError("a label name is empty")
            if name in seen:
                raise ValueError(f"label {name!r} is listed twice")
            seen.add(name)
        if len(value) == 1:
            raise ValueError("one label is no classification: list at least two")
        return value

    @field_validator("source_field", "target_field", "label_field")
    @classmethod
    def _field_name_ok(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value or any(part == "" for part in value.split(".")) or any(ord(c) < 32 for c in value):
            raise ValueError(f"expected a JSON field name, with dots to reach into objects (got {value!r})")
        return value

    @field_validator("source_template", "target_template")
    @classmethod
    def _template_ok(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            fields = template_fields(value)
        except TemplateError as exc:
            raise ValueError(f"{exc} (got {value!r})") from None
        if not fields:
            raise ValueError(f"the template names no field, so every example would be the same text (got {value!r})")
        return value


class EarlyStopping(StrictModel):
    patience: Count = Field(description="Evaluations in a row without improvement before training stops.")
    min_delta: float = Field(0.0, ge=0.0, le=1e6, description="An improvement smaller than this does not count.")


class AdafactorSettings(StrictModel):
    """Adafactor as transformers implements it, every knob of seed 003's call exposed; the defaults are the T5
    fine-tuning ones (fixed learning rate from train.learning_rate and the schedule)."""

    eps: list[float] = Field(
        default_factory=lambda: [1e-30, 1e-3], min_length=2, max_length=2,
        description="[eps1, eps2]: regularisers of the squared gradient and of the update scale.",
    )
    clip_threshold: float = Field(1.0, gt=0.0, le=1e6, description="Clip the update's RMS to this.")
    decay_rate: float = Field(-0.8, ge=-10.0, le=0.0, description="Second-moment decay exponent.")
    beta1: float | None = Field(None, ge=0.0, lt=1.0, description="First moment (momentum); null: none (saves memory).")
    scale_parameter: bool = Field(False, description="Scale the learning rate by the parameter's RMS.")
    relative_step: bool = Field(False, description="Adafactor's own time-dependent rate (ignores learning_rate).")
    warmup_init: bool = Field(False, description="With relative_step: warm the relative step up from 1e-6.")

    @field_validator("eps")
    @classmethod
    def _eps_ok(cls, value: list[float]) -> list[float]:
        if not all(0.0 < e < 1.0 for e in value):
            raise ValueError(f"expected two numbers between 0 and 1 (got {value})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> AdafactorSettings:
        if self.warmup_init and not self.relative_step:
            raise ValueError("warmup_init needs relative_step: true")
        return self


class TrainConfig(StrictModel):
    steps: Count = Field(description="Optimizer steps in total.")
    batch_size: int = Field(32, ge=1, le=1 << 20, description="Global batch: split evenly across workers.")
    optimizer: Literal["adafactor", "adamw"] = Field("adafactor", description="Adafactor (T5's) or AdamW.")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    schedule: Literal["linear", "cosine", "constant", "inverse_sqrt"] = Field(
        "linear",
        description="After warm-up: 'linear' decays to 0 at the last step, 'cosine' follows half a cosine to 0, "
        "'constant' stays at the peak, "
        "'inverse_sqrt' (T5's pretraining schedule) holds the peak for the warm-up steps, then peak*sqrt(warmup/step).",
    )
    warmup_steps: int = Field(0, ge=0, le=1_000_000_000, description="Linear warm-up from 0 to the peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float | None = Field(1.0, gt=0.0, le=1e6, description="Clip the global gradient norm; null disables it.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seeds model init and data order; the same on every worker.")
    grad_accum_steps: Count = Field(
        1, description="Micro-batches per optimizer step: batch_size is still the global batch the optimizer sees."
    )
    precision: Literal["float32", "bf16"] = Field(
        "float32", description="'bf16': XLA bfloat16 compute on TPU, autocast on CPU (weights and optimizer stay float32)."
    )
    adafactor: AdafactorSettings = Field(default_factory=lambda: AdafactorSettings(), description="Adafactor's knobs.")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="Label smoothing of the cross-entropy loss.")
    sharding: Literal["data", "fsdp"] = Field(
        "data", description="'data': a full copy per replica; 'fsdp': parameters sharded over every chip (SPMD)."
    )
    log_every: Count = Field(10, description="Write a metrics line every N steps.")
    checkpoint_every: Count | None = Field(
        None, description="Worker 0 saves a checkpoint every N steps (and always at the end)."
    )
    keep_checkpoints: int = Field(2, ge=1, le=10_000, description="How many recent checkpoints to keep.")
    keep_best: bool = Field(
        False, description="Also keep the checkpoint with the best eval metric (exact match, accuracy, ...)."
    )
    early_stopping: EarlyStopping | None = Field(
        None, description="Stop when the eval metric has not improved for `patience` evaluations."
    )
    hang_timeout: Duration = Field(
        600.0,
        description="A worker whose trainer makes no progress for this long (3x, at least a minute, while compiling, "
        "evaluating or checkpointing) is declared hung and the run is stopped: 600, 90s, 10m, 1h.",
    )

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_fits(cls, value: int, info: ValidationInfo) -> int:
        steps = info.data.get("steps")
        if steps is not None and value > steps:
            raise ValueError(f"{value} warm-up steps is more than train.steps ({steps})")
        return value


EvalMetric = Literal["exact_match", "accuracy", "token_accuracy", "loss", "bleu", "rouge_l"]


class EvalConfig(StrictModel):
    every: Count | None = Field(100, description="Evaluate every N steps (and at the end); null: only at the end.")
    batch_size: int = Field(64, ge=1, le=1 << 20, description="Global eval batch.")
    max_examples: Count | None = Field(None, description="Evaluate on at most this many held-out examples.")
    metric: EvalMetric | None = Field(
        None,
        description="What ranks evaluations (keep_best, early_stopping): exact_match, accuracy, token_accuracy, loss, "
        "bleu or rouge_l; default: exact match (text-to-text) or accuracy (classification).",
    )
    generate_examples: int = Field(
        0, ge=0, le=1_000_000,
        description="Greedy-decode this many held-out examples at every evaluation for BLEU and ROUGE-L (on the host; "
        "default 256 when eval.metric is bleu or rouge_l).",
    )

    @model_validator(mode="after")
    def _decodes_for_text_metrics(self) -> EvalConfig:
        if self.metric in ("bleu", "rouge_l") and not self.generate_examples:
            self.generate_examples = 256
        return self


class ExportConfig(StrictModel):
    hf: bool = Field(True, description="Write a Hugging Face model dir to runs/<id>/export/hf at the end.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weights dtype of the export.")


class RecipeConfig(StrictModel):
    """What to train: backend, model, data and the training/eval/export settings."""

    name: str = Field(description="Short recipe name; it prefixes run ids.")
    description: str = Field("", max_length=100_000)
    backend: Backend
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig
    eval: EvalConfig = Field(default_factory=EvalConfig)
    export: ExportConfig = Field(default_factory=ExportConfig)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (64 at most)")
        return value

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        for section in ("backend", "model"):
            found += [((section, *path), message) for path, message in getattr(self, section).cross_problems()]
        return found + self.backend.recipe_problems(self)


# --------------------------------------------------------------------------------------------------------------
# Loading with locations

M = TypeVar("M", bound=BaseModel)


@dataclass
class Loaded(Generic[M]):
    """A validated config plus where each key came from, for errors found later (e.g. against the cluster)."""

    value: M
    source: str
    lines: dict[KeyPath, int] = field(default_factory=dict)
    overrides: dict[KeyPath, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        return _locate(path, self.source, self.lines, self.overrides)

    def problem(self, path: KeyPath, message: str) -> str:
        return f"{self.where(path)}: {_dotted(path)}: {message}"


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _locate(path: KeyPath, source: str, lines: dict[KeyPath, int], overrides: dict[KeyPath, str]) -> str:
    for depth in range(len(path), 0, -1):
        if path[:depth] in overrides:
            return f"--set {overrides[path[:depth]]}"
    for depth in range(len(path), -1, -1):
        if path[:depth] in lines:
            return f"{source}:{lines[path[:depth]]}"
    return source


def _read_yaml(text: str, source: str) -> tuple[Any, dict[KeyPath, int]]:
    try:
        return safe_yaml.load(text)
    except safe_yaml.YamlProblem as exc:
        where = f"{source}:{exc.line}" if exc.line is not None else source
        key = f"{_dotted(exc.path)}: " if exc.path else ""
        raise ConfigError([f"{where}: {key}{exc.message}"], source=source) from None


MAX_OVERRIDE_CHARS = 16_384


def parse_overrides(items: list[str]) -> list[tuple[KeyPath, Any, str]]:
    """``train.steps=50`` -> (("train", "steps"), 50, "train.steps=50"); values are parsed as YAML scalars."""
    parsed = []
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part.strip() for part in key.split(".")):
            problems.append(f"--set {item}: expected KEY.PATH=VALUE, e.g. --set train.steps=50")
            continue
        if len(value) > MAX_OVERRIDE_CHARS:
            problems.append(f"--set {key}=...: the value is over {MAX_OVERRIDE_CHARS:,} characters")
            continue
        try:
            parsed_value = safe_yaml.load_value(value) if value.strip() else ""
        except safe_yaml.YamlProblem as exc:
            problems.append(f"--set {item}: the value is not valid: {exc.message}")
            continue
        path: KeyPath = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        parsed.append((path, parsed_value, item))
    if problems:
        raise ConfigError(problems, source="--set")
    return parsed


def _apply_overrides(data: Any, overrides: list[tuple[KeyPath, Any, str]]) -> tuple[Any, dict[KeyPath, str]]:
    where: dict[KeyPath, str] = {}
    problems = []
    if not isinstance(data, dict):
        data = {}
    for path, value, text in overrides:
        node: Any = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part) if isinstance(node, dict) else None
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                problems.append(f"--set {text}: {_dotted(path[: i + 1])} is not a mapping (got {child!r})")
                break
            node = child
        else:
            node[path[-1]] = value
            where[path] = text
    if problems:
        raise ConfigError(problems, source="--set")
    return data, where


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_models_in(arg))
    return out


def _walk_loc(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[KeyPath, type[BaseModel] | None]:
    """Turn pydantic's error location into the user's key path, dropping discriminated-union tags
    (("backend", "torch_xla", "x") -> ("backend", "x")) and type tags ("function-after[...]", "int"), and return
    the model owning the last key."""
    path: list[str | int] = []
    owner: type[BaseModel] | None = model
    parts = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    while parts:
        part = parts.pop(0)
        path.append(part)
        if not parts:
            break
        info = owner.model_fields.get(part) if owner is not None and isinstance(part, str) else None
        if info is None:
            owner = None
            continue
        candidates = _models_in(info.annotation)
        if info.discriminator is not None and parts and isinstance(parts[0], str):
            tag = parts.pop(0)
            candidates = [c for c in candidates if c.model_fields["kind"].default == tag]
        owner = candidates[0] if len(candidates) == 1 else None
    return tuple(path), owner


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "none", "is-instance", "lax-or-strict", "json-or-python"}

_FRIENDLY = {
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_parsing_size": "expected a whole number of sensible size",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected text (quote it in YAML)",
    "dict_type": "expected a mapping of keys",
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
    "list_type": "expected a list",
    "path_type": "expected a file path",
    "none_required": "expected nothing (null)",
}


def _describe_error(model: type[BaseModel], err: dict[str, Any]) -> tuple[KeyPath, str]:
    path, owner = _walk_loc(model, tuple(err["loc"]))
    kind = err["type"]
    got = err.get("input")
    last = path[-1] if path else None
    if kind == "extra_forbidden":
        allowed = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(last), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return path, f"unknown key{hint} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        info = owner.model_fields.get(last) if owner is not None and isinstance(last, str) else None
        desc = info.description if info is not None and info.description else ""
        return path, "required key is missing" + (f": {desc}" if desc else "")
    msg = _FRIENDLY.get(kind) or err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in {"literal_error", "union_tag_invalid"}:
        expected = re.findall(r"'([^']+)'", msg.split("expected", 1)[-1])
        probe = got.get("kind", "") if isinstance(got, dict) else got
        close = difflib.get_close_matches(str(probe), expected, n=1, cutoff=0.5)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    if got is not None and not isinstance(got, (dict, list)) and kind not in {"value_error", "assertion_error"}:
        shown = repr(got)
        msg += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return path, msg


def _cross_problems(value: BaseModel, prefix: KeyPath = ()) -> list[tuple[KeyPath, str]]:
    own = value.cross_problems() if isinstance(value, StrictModel) else []
    return [(prefix + path, message) for path, message in own]


def _validate(
    model: type[M], data: Any, source: str, lines: dict[KeyPath, int], overrides: dict[KeyPath, str], context: dict
) -> M:
    try:
        value = model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            path, message = _describe_error(model, err)
            problems.append(f"{_locate(path, source, lines, overrides)}: {_dotted(path)}: {message}")
        raise ConfigError(problems, source=source) from None
    found = _cross_problems(value)
    if found:
        raise ConfigError(
            [f"{_locate(path, source, lines, overrides)}: {_dotted(path)}: {message}" for path, message in found],
            source=source,
        )
    return value


def _load(
    model: type[M], text: str, source: str, base_dir: Path | None, overrides: list[str], check_files: bool
) -> Loaded[M]:
    data, lines = _read_yaml(text, source)
    if data is not None and not isinstance(data, dict):
        raise ConfigError([f"{source}:1: expected a mapping of keys at the top level"], source=source)
    data, where = _apply_overrides(data or {}, parse_overrides(overrides))
    context = {"base_dir": base_dir, "check_files": check_files}
    value = _validate(model, data, source, lines, where, context)
    return Loaded(value=value, source=source, lines=lines, overrides=where, raw=data)


def _read_text(path: Path, what: str) -> str:
    try:
        return safe_yaml.read_config_text(path, what)
    except safe_yaml.YamlProblem as exc:
        where = f"{path}:{exc.line}" if exc.line is not None else str(path)
        raise ConfigError([f"{where}: {exc.message}"], source=str(path)) from None


DEFAULT_CLUSTER_FILE = "tpuft.yaml"


def cluster_file(explicit: Path | None = None) -> Path | None:
    """``--config`` > ``$TPUFT_CONFIG`` > ``./tpuft.yaml`` > None (the embedded default)."""
    if explicit is not None:
        return explicit
    env = os.environ.get("TPUFT_CONFIG")
    if env:
        return Path(env)
    here = Path.cwd() / DEFAULT_CLUSTER_FILE
    return here if here.is_file() else None


def load_cluster(path: Path | None = None, overrides: list[str] | None = None) -> Loaded[ClusterConfig]:
    chosen = cluster_file(path)
    if chosen is None:
        from tpuft.paths import package_root

        default = package_root() / "_defaults" / "tpuft.yaml"
        return _load(ClusterConfig, default.read_text(), "(embedded default tpuft.yaml)", None, overrides or [], True)
    return _load(ClusterConfig, _read_text(chosen, "cluster file"), str(chosen), chosen.parent, overrides or [], True)


def load_recipe(path: Path, overrides: list[str] | None = None, *, check_files: bool = True) -> Loaded[RecipeConfig]:
    path = resolve_recipe_path(path)
    return _load(
        RecipeConfig, _read_text(path, "recipe"), str(path), path.parent.resolve(), overrides or [], check_files
    )


def resolve_recipe_path(path: Path) -> Path:
    """A recipe is a file path, or the name of a shipped recipe (``quickstart`` -> recipes/quickstart.yaml)."""
    if os.path.lexists(path):
        return path
    from tpuft.paths import shipped_recipe

    shipped = shipped_recipe(str(path))
    return shipped if shipped is not None else path


def dump_recipe(recipe: RecipeConfig) -> str:
    """The resolved recipe as YAML (absolute paths, defaults filled in), written to the run dir."""
    return safe_yaml.dump(recipe.model_dump(mode="json"))


def recipe_from_text(text: str, source: str, *, check_files: bool = True) -> RecipeConfig:
    """Load a resolved recipe (paths already absolute) on the worker side; on the controller (``resume``) without
    checking its files: a remote run's recipe names the workers' copies of its data (``~/.tpuft/data/<run>/...``)."""
    return _load(RecipeConfig, text, source, None, [], check_files).value
