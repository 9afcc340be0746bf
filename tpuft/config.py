"""The two files a user writes: the cluster file (``tpuft.yaml``) and a recipe (``recipes/NAME.yaml``).

Both are pydantic models with ``extra="forbid"``. Loading keeps a map from every key path to its YAML line, so each
problem is reported as ``file:line: key.path: what is wrong (got X)``, all problems at once, exit code 2, before
anything runs. ``--set a.b=c`` overrides are applied to the raw YAML first and located as ``--set a.b``.

This module is imported on the worker too (inside the backend venv), so it depends on pydantic and PyYAML only.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tpuft.errors import ConfigError

# --------------------------------------------------------------------------------------------------------------
# Cluster file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class LocalConfig(_Strict):
    """The local provider: a "pod" of N worker folders on this machine, each a private HOME."""

    workers: int | None = Field(
        None, ge=1, le=64, description="Number of local workers; default: the accelerator type's host count."
    )
    state_dir: Path | None = Field(
        None, description="Where worker folders live; default: $TPUFT_HOME/local/<name> (~/.tpuft/local/<name>)."
    )
    venv_cache: Path | None = Field(
        None,
        description="Shared cache of backend venvs (all local workers share this machine); "
        "default: $TPUFT_VENV_CACHE or ~/.cache/tpuft/venvs.",
    )
    python: str = Field("python3", description="Base interpreter used to build backend venvs on the workers.")


class GcpConfig(_Strict):
    """The GCP provider: a Cloud TPU VM (or pod slice, or queued resource) in a project and zone."""

    project: str | None = Field(None, description="GCP project id (required for provider: gcp).")
    zone: str | None = Field(None, description="Zone, e.g. us-central2-b (required for provider: gcp).")
    runtime_version: str | None = Field(None, description="TPU software version; default: the catalogue's for the generation.")
    topology: str | None = Field(
        None, description="Use an accelerator config (type + topology, e.g. 2x2x4) instead of the accelerator type name."
    )
    spot: bool = Field(False, description="Spot VMs: cheaper, can be preempted at any time.")
    preemptible: bool = Field(False, description="Legacy preemptible VMs (use spot on newer generations).")
    reserved: bool = Field(False, description="Use reserved capacity.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels on the node.")
    metadata: dict[str, str] = Field(default_factory=dict, description="Node metadata, e.g. startup-script.")
    network: str | None = Field(None, description="VPC network (default: the project's default network).")
    subnetwork: str | None = Field(None, description="Subnetwork, e.g. a subnet with Private Google Access.")
    internal_ip: bool = Field(False, description="No external IPs: workers are reached on their internal addresses.")
    service_account: str | None = Field(None, description="Service account e-mail the VMs run as.")
    scopes: list[str] = Field(
        default_factory=lambda: ["https://www.googleapis.com/auth/cloud-platform"], description="OAuth scopes."
    )
    queued: bool = Field(False, description="Ask through a queued resource (waits for capacity instead of failing).")
    reservation: str | None = Field(None, description="Reservation name for a queued resource.")
    valid_until: str | None = Field(
        None, description="Queued resource: give up after this long, e.g. 6h or 90m (a duration) or an RFC 3339 time."
    )
    slices: int = Field(1, ge=1, le=256, description="Multislice: this many slices (queued resources only).")
    tpu_api_endpoint: str | None = Field(
        None, description="Cloud TPU API endpoint (private endpoints; tests); also $TPUFT_TPU_API_ENDPOINT."
    )
    venv_cache: str = Field("~/.cache/tpuft/venvs", description="Where workers keep backend venvs (a path on the workers).")
    python: str = Field("python3", description="Interpreter on the workers that venvs are built from.")
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
        if value is None or parse_duration(value) is not None or re.fullmatch(r"\d{4}-\d\d-\d\dT.+", value):
            return value
        raise ValueError("expected a duration like 6h, 90m, 3600s or an RFC 3339 time like 2026-12-01T00:00:00Z")


def parse_duration(text: str) -> int | None:
    """``90m`` -> 5400 seconds; None when it is not a duration."""
    match = re.fullmatch(r"(\d+)\s*([smhd])", text.strip())
    if not match:
        return None
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


class SshConfig(_Strict):
    """How tpuft reaches the workers of a GCP cluster."""

    user: str | None = Field(None, description="Login user on the VMs (default: your local user name).")
    key_file: Path = Field(
        Path("~/.ssh/google_compute_engine"), description="Private key (gcloud's by default; created if missing)."
    )
    port: int = Field(22, ge=1, le=65535)
    os_login: bool = Field(False, description="The project uses OS Login: do not put the key in instance metadata.")
    connect_attempts: int = Field(10, ge=1, le=100, description="Connection tries per worker (like gcloud).")
    retry_delay_s: float = Field(5.0, ge=0.0, le=300.0, description="Seconds between connection tries.")


class ClusterConfig(_Strict):
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
        default_factory=dict, description="Extra environment for every worker process, e.g. XLA_FLAGS (no secrets)."
    )
    local: LocalConfig = Field(default_factory=LocalConfig)
    gcp: GcpConfig = Field(default_factory=GcpConfig)
    ssh: SshConfig = Field(default_factory=SshConfig)

    @field_validator("bucket")
    @classmethod
    def _bucket_fits_provider(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("provider") == "gcp" and value is not None and not value.startswith("gs://"):
            raise ValueError(f"provider gcp keeps runs in a bucket: expected gs://NAME (got {value!r})")
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

    @property
    def num_workers(self) -> int:
        from tpuft.accelerators import lookup

        return self.local.workers or lookup(self.accelerator).hosts


# --------------------------------------------------------------------------------------------------------------
# Recipe


class TorchXlaBackend(_Strict):
    """PyTorch/XLA: one process per worker host, PJRT runtime (TPU on TPU hosts, CPU on the local pod)."""

    kind: Literal["torch_xla"] = "torch_xla"
    torch_version: str = Field("2.9.0", description="torch and torch-xla are pinned together to this version.")
    extra_requirements: list[str] = Field(
        default_factory=list, description="More pip requirements for the worker venv (pinned, please)."
    )


Backend = Annotated[TorchXlaBackend, Field(discriminator="kind")]


class ModelConfig(_Strict):
    name_or_path: str | None = Field(
        None, description="A Hugging Face model id or a local directory to start from (e.g. google/t5-v1_1-small)."
    )
    config: dict[str, Any] | None = Field(
        None, description="Random-init model: keyword arguments for transformers.T5Config (d_model, num_layers, ...)."
    )
    tokenizer: str = Field(
        "byt5", description="'byt5' for the byte-level ByT5 tokenizer (needs no files), or an HF id / local path."
    )
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="Override the model's dropout rate.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.name_or_path is None) == (self.config is None):
            raise ValueError("give exactly one of model.name_or_path (pretrained) or model.config (random init)")
        return self


class DataConfig(_Strict):
    train: Path = Field(description="Training examples, JSON lines; relative paths are from the recipe's folder.")
    eval: Path | None = Field(None, description="Held-out examples in the same format (for eval.* metrics).")
    source_field: str = Field("source", description="JSON field holding the input text (dots reach into objects).")
    target_field: str = Field("target", description="JSON field holding the output text.")
    source_template: str | None = Field(
        None, description="Build the input from several fields, e.g. 'question: {question} context: {context}'."
    )
    target_template: str | None = Field(None, description="Build the output from several fields, e.g. '{label}'.")
    prefix: str = Field("", description="Task prefix prepended to every input, e.g. 'translate English to German: '.")
    max_source_length: int = Field(128, ge=1, le=65536, description="Inputs are truncated to this many tokens.")
    max_target_length: int = Field(32, ge=1, le=65536, description="Targets are truncated to this many tokens.")
    shuffle: bool = Field(True, description="Shuffle each worker's shard every epoch (seeded).")

    @field_validator("train", "eval")
    @classmethod
    def _exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        base = (info.context or {}).get("base_dir")
        path = value.expanduser()
        if not path.is_absolute() and base is not None:
            path = Path(base) / path
        path = Path(os.path.normpath(path))
        if (info.context or {}).get("check_files", True) and not path.is_file():
            raise ValueError(f"file not found: {path}")
        return path


class TrainConfig(_Strict):
    steps: int = Field(ge=1, description="Optimizer steps in total.")
    batch_size: int = Field(32, ge=1, description="Global batch: split evenly across workers.")
    optimizer: Literal["adafactor", "adamw"] = Field("adafactor", description="Adafactor (T5's) or AdamW.")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    schedule: Literal["linear", "constant"] = Field(
        "linear", description="After warm-up: 'linear' decays to 0 at the last step, 'constant' stays at the peak."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up from 0 to the peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm; null disables it.")
    seed: int = Field(0, description="Seeds model init and data order; the same on every worker.")
    log_every: int = Field(10, ge=1, description="Write a metrics line every N steps.")
    checkpoint_every: int | None = Field(
        None, ge=1, description="Worker 0 saves a checkpoint every N steps (and always at the end)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="How many recent checkpoints to keep.")

    @field_validator("warmup_steps")
    @classmethod
    def _warmup_fits(cls, value: int, info: ValidationInfo) -> int:
        steps = info.data.get("steps")
        if steps is not None and value > steps:
            raise ValueError(f"{value} warm-up steps is more than train.steps ({steps})")
        return value


class EvalConfig(_Strict):
    every: int | None = Field(100, ge=1, description="Evaluate every N steps (and at the end); null: only at the end.")
    batch_size: int = Field(64, ge=1, description="Global eval batch.")
    max_examples: int | None = Field(None, ge=1, description="Evaluate on at most this many held-out examples.")


class ExportConfig(_Strict):
    hf: bool = Field(True, description="Write a Hugging Face model dir to runs/<id>/export/hf at the end.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weights dtype of the export.")


class RecipeConfig(_Strict):
    """What to train: backend, model, data and the training/eval/export settings."""

    name: str = Field(description="Short recipe name; it prefixes run ids.")
    description: str = ""
    backend: Backend
    model: ModelConfig
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


# --------------------------------------------------------------------------------------------------------------
# Loading with locations

M = TypeVar("M", bound=BaseModel)
KeyPath = tuple[str | int, ...]


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


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (plain PyYAML keeps the last one silently)."""


def _read_yaml(text: str, source: str) -> tuple[Any, dict[KeyPath, int]]:
    try:
        node = yaml.compose(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{where}: not valid YAML: {problem}"], source=source) from None
    if node is None:
        return {}, {}
    lines: dict[KeyPath, int] = {(): node.start_mark.line + 1}
    problems: list[str] = []

    def walk(n: yaml.Node, path: KeyPath) -> None:
        if isinstance(n, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in n.value:
                key = key_node.value
                line = key_node.start_mark.line + 1
                if key in seen:
                    problems.append(
                        f"{source}:{line}: {_dotted(path + (key,))}: duplicate key (first set on line {seen[key]})"
                    )
                seen[key] = line
                lines[path + (key,)] = line
                walk(value_node, path + (key,))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                lines[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))

    walk(node, ())
    if problems:
        raise ConfigError(problems, source=source)
    data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    return data, lines


def parse_overrides(items: list[str]) -> list[tuple[KeyPath, Any, str]]:
    """``train.steps=50`` -> (("train", "steps"), 50, "train.steps=50"); values are parsed as YAML scalars."""
    parsed = []
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            problems.append(f"--set {item}: expected KEY.PATH=VALUE, e.g. --set train.steps=50")
            continue
        try:
            parsed_value = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as exc:
            problems.append(f"--set {item}: value is not valid YAML: {exc}")
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
    (("backend", "torch_xla", "x") -> ("backend", "x")), and return the model owning the last key."""
    path: list[str | int] = []
    owner: type[BaseModel] | None = model
    parts = list(loc)
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
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in {"literal_error", "union_tag_invalid"}:
        expected = re.findall(r"'([^']+)'", msg.split("expected", 1)[-1])
        probe = got.get("kind", "") if isinstance(got, dict) else got
        close = difflib.get_close_matches(str(probe), expected, n=1, cutoff=0.5)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    if got is not None and not isinstance(got, (dict, list)) and kind not in {"value_error", "assertion_error"}:
        msg += f" (got {got!r})"
    return path, msg


def _validate(
    model: type[M], data: Any, source: str, lines: dict[KeyPath, int], overrides: dict[KeyPath, str], context: dict
) -> M:
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            path, message = _describe_error(model, err)
            problems.append(f"{_locate(path, source, lines, overrides)}: {_dotted(path)}: {message}")
        raise ConfigError(problems, source=source) from None


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
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: {what} not found"], source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read {what}: {exc}"], source=str(path)) from None


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
    if path.is_file():
        return path
    from tpuft.paths import shipped_recipe

    shipped = shipped_recipe(str(path))
    return shipped if shipped is not None else path


def dump_recipe(recipe: RecipeConfig) -> str:
    """The resolved recipe as YAML (absolute paths, defaults filled in), written to the run dir."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)


def recipe_from_text(text: str, source: str) -> RecipeConfig:
    """Load a resolved recipe (paths already absolute) on the worker side."""
    return _load(RecipeConfig, text, source, None, [], True).value
