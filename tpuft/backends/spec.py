"""The plain records a backend states and the rest of tpuft reads: the venv it needs (:class:`EnvSpec`), the
cluster it plans for (:class:`ClusterShape`), how it launches (:class:`LaunchPlan`), where its trainer puts
things in the run dir (:class:`RunLayout`, with the checkpoint manifest), which optional recipe parts it
implements (:class:`Capabilities`), and what its end-of-run summary reads of the run (:class:`RunOutcome`).

The standard library only (and the storage type, for annotations): the cluster schema, the registry, the
worker (resume) and the converters import these without importing a backend, the recipe or the controller's
run code.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tpuft.storage import Storage

Target = Literal["cpu", "tpu"]
"""CPU for the local pod, TPU for real TPU hosts: the same backend needs different wheels for each."""

VENV_LAYOUT_VERSION = "1"
"""Bump when the way venvs are built changes, so that cached ones are rebuilt."""

KeyPath = tuple[str | int, ...]

LOCAL_DEVICES_ENV = "TPUFT_LOCAL_DEVICES"
"""Set by a backend's launch plan on local CPU workers: how many devices the trainer exposes
(``local.devices_per_ worker``). A variable of tpuft's rather than the runtime's own (``XLA_FLAGS``), so that
the trainer merges it into what the user's ``worker_env`` already sets instead of replacing it."""


COMPILE_CACHE_ENV = "TPUFT_COMPILE_CACHE"
"""Set by the launch plan of an engine with a persistent compilation cache (``train.compile_cache``): the
folder its trainers keep compiled programs in (:mod:`tpuft.worker.compile_cache`). A TPU host's is under its
own home (``~`` expanded there), the local pod's the machine-wide cache folder beside the backend venvs."""


def compile_cache_env(compile_cache: bool | None, kind: str, target: Target) -> dict[str, str]:
    """The launch plan's ``COMPILE_CACHE_ENV`` for engine ``kind``: on unless the recipe says false. The cache
    is per engine so that one engine's entries never count against another's."""
    if compile_cache is False:
        return {}
    if target == "tpu":
        return {COMPILE_CACHE_ENV: f"~/.cache/tpuft/xla/{kind}"}
    from tpuft.core.paths import compile_cache_root

    return {COMPILE_CACHE_ENV: str(compile_cache_root() / kind)}


@dataclass(frozen=True)
class EnvSpec:
    """A backend venv: its requirements, and the cache key that names it on every worker."""

    kind: str
    requirements: tuple[str, ...]
    python: str
    """Interpreter the venv is built from, on the worker."""
    pip_args: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()
    """Installed after ``requirements`` with ``--no-deps`` (packages whose own dependency lists cannot be
    trusted)."""
    min_python: str | None = None
    """The oldest Python the pins install on; the bootstrap looks for a newer interpreter on the worker if
    needed."""
    max_python: str | None = None
    """The newest Python the pins install on as wheels (a dependency without wheels past it would build from
    source). Not part of the key: it only narrows which interpreter builds the venv, and a venv built past it
    never completed."""
    local_sources: tuple[str, ...] = ()
    """Paths on this machine that ``no_deps`` names (a wheel, a checkout, a wheelhouse's wheels): shipped to
    workers that cannot read this machine's disk, and named there by their shipped copies."""
    sources_digest: str = ""
    """Content hash of ``local_sources``: a changed wheel or checkout gives a new venv."""

    @property
    def key(self) -> str:
        fields: list[object] = [VENV_LAYOUT_VERSION, self.kind, self.python, self.requirements, self.pip_args]
        if self.no_deps or self.min_python or self.sources_digest:
            fields += [self.no_deps, self.min_python, self.sources_digest]
        payload = json.dumps(fields)
        return f"{self.kind}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"

    def payload(self, no_deps: tuple[str, ...] | None = None) -> dict[str, Any]:
        """What ``tpuft/host/bootstrap.py`` reads from ``--spec`` (JSON-ready). ``no_deps`` replaces this
        spec's own for workers that install shipped copies of ``local_sources`` (``~/``-relative there); the
        key stays this spec's, so every worker caches the venv under the same name."""
        return {
            "key": self.key,
            "kind": self.kind,
            "requirements": list(self.requirements),
            "python": self.python,
            "pip_args": list(self.pip_args),
            "no_deps": list(self.no_deps if no_deps is None else no_deps),
            "min_python": self.min_python,
            "max_python": self.max_python,
        }


@dataclass(frozen=True)
class ClusterShape:
    """What a backend needs to know of the cluster to plan a run: hosts (workers), chips per host, and the
    target."""

    hosts: int
    chips_per_host: int
    target: Target
    devices_per_chip: int = 1
    """TPU devices per chip as TensorFlow counts replicas: 2 TensorCores on v2/v3, 1 from v4 on."""
    local_devices: int = 1
    """Devices each local CPU worker exposes (``local.devices_per_worker``), so the local pod rehearses the
    slice's device layout; the TPU target ignores it (a TPU host has its chips)."""
    local_devices_set: bool = False
    """Whether the user wrote ``local.devices_per_worker``: a backend that cannot rehearse several devices per
    worker refuses an explicit value with the reason, and uses 1 with a note when the default asked for
    more."""
    generation: str = ""
    """The TPU generation (``v4``, ``tpu7x``): what a backend whose framework cannot drive it refuses."""
    slices: int = 1
    """Multislice: ``hosts`` are this many equal slices (workers numbered slice by slice); the slices are the
    outer data-parallel axis of the mesh. A backend whose engine has no Multislice refuses ``slices > 1`` in
    ``check``."""

    @property
    def hosts_per_slice(self) -> int:
        return self.hosts // self.slices

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host


@dataclass(frozen=True)
class LaunchPlan:
    """Which workers run the trainer and how. The same list drives ``setup`` (it installs there only), the
    launch, ``TPUFT_NUM_WORKERS`` / ``TPUFT_WORKER_ID`` (position in this list) and the workers ``run.json``
    counts."""

    workers: tuple[int, ...]
    argv: tuple[str, ...] = ("-m", "tpuft.worker")
    """After the venv's python."""
    env: dict[str, str] = field(default_factory=dict)
    """What the backend's runtime needs on each launched worker (e.g. PJRT_DEVICE)."""
    ship: tuple[str, ...] = ("train", "eval", "test", "preprocess")
    """Recipe keys whose files are copied to workers that cannot read this machine's disk: ``data`` keys by
    name, others dotted (``backend.gin_files``); a list ships each of its files; ``gs://`` URLs stay."""


@dataclass(frozen=True)
class RunOutcome:
    """What a backend's end-of-run summary reads of its run: a plain record that the controller's run reader
    (``RunSnapshot.outcome``) fills, so that the backends never import the reader (an arrow up the layers)."""

    digests: dict[int, str] = field(default_factory=dict)
    """worker index -> the sha256 of its weights recorded by its last heartbeat (where one was)."""
    best_metric: tuple[str, float, int] | None = None
    """(eval metric, its best value, the step), or None without evaluations."""


MANIFEST_FORMAT = "tpuft-checkpoint-manifest-1"
"""The ``format`` of a checkpoint manifest: ``{"format": ..., "files": {relpath: size in bytes}}``."""


@dataclass(frozen=True)
class RunLayout:
    """Where a backend's trainer puts things in the run dir, and so how pull, monitor, convert and resume read
    them."""

    metrics: Literal["jsonl", "tensorboard"] = "jsonl"
    """``metrics.jsonl`` (one JSON object per logged step), or TensorBoard events only."""
    checkpoints: str = "checkpoints"
    """The folder (under the run dir) holding one folder per checkpoint."""
    checkpoint_format: str = "step_{step:08d}"
    checkpoint_pattern: str = r"^step_(\d+)$"
    """A complete checkpoint folder's name; group 1 is its step. A half-written one is named otherwise
    (``*.tmp``)."""
    writes_to_bucket: bool = False
    """True: the trainer writes a ``gs://`` run dir itself; False: it writes locally and tpuft mirrors it
    up."""
    exports_hf: bool = True
    """True: the trainer writes ``export/hf`` itself; False: ``tpuft convert --run`` makes it after the
    run."""
    manifest: str | None = None
    """A file the trainer writes last into each checkpoint, listing every other file of it with its size. When
    set, a checkpoint is complete only when its manifest is there and every file listed is there with that
    size: a checkpoint mirrored to a bucket is uploaded file by file under its final name, so there a
    well-named folder can be partial. A folder without the manifest is incomplete. None: the folder's name
    alone says it is complete."""
    markers: tuple[str, ...] = ("config.json",)
    """Paths inside a checkpoint folder that mark it as one a conversion reads (any one of them)."""
    weights: tuple[str, ...] = ("*",)
    """What a conversion reads of a checkpoint, as patterns over its files: a pattern names a file directly in
    the folder, one ending in ``/`` a whole subfolder (``state/``); the optimizer state of a large model is
    never fetched."""
    not_weights: tuple[str, ...] = ()
    """Files directly in a checkpoint folder that a conversion does not read (optimizer and trainer state)."""
    companions: tuple[str, ...] = ()
    """Files a conversion also reads beside the checkpoint: in its folder or in the folder above (T5X's
    config.gin)."""
    foreign_checkpoints: bool = False
    """True: checkpoints of this layout also come from elsewhere, without tpuft's manifest (T5X's own model
    dirs, the public checkpoints): a conversion takes them by their folder's name."""

    def step_of(self, name: str) -> int | None:
        match = re.match(self.checkpoint_pattern, name)
        return int(match.group(1)) if match else None

    def conversion_reads(self, inside: str) -> bool:
        """Whether a conversion reads this file of a checkpoint (its path inside the checkpoint folder)."""
        top, nested, _ = inside.partition("/")
        for pattern in self.weights:
            if pattern.endswith("/"):
                if nested and fnmatch.fnmatchcase(top, pattern[:-1]):
                    return True
            elif not nested and fnmatch.fnmatchcase(inside, pattern) and inside not in self.not_weights:
                return True
        return False

    def checkpoint_dir(self, run_dir: Path, step: int) -> Path:
        return run_dir / self.checkpoints / self.checkpoint_format.format(step=step)

    def local_checkpoints(self, folder: Path) -> list[tuple[int, Path]]:
        """Complete checkpoints in ``folder`` (a checkpoints folder), oldest first."""
        if not folder.is_dir():
            return []
        found = [(self.step_of(child.name), child) for child in folder.iterdir() if child.is_dir()]
        return sorted((step, path) for step, path in found if step is not None and self.is_complete(path))

    def checkpoint_steps(self, storage: Storage) -> dict[int, str]:
        """step -> folder name of each complete checkpoint of a run dir (local or in a bucket). With a
        manifest: one listing of the checkpoints folder, and one read per checkpoint whose manifest is
        there."""
        named = {}
        for name in storage.folders(self.checkpoints):
            step = self.step_of(name)
            if step is not None:
                named[step] = name
        if self.manifest is None or not named:
            return named
        contents: dict[str, dict[str, int]] = {}  # folder name -> {path inside it: size}
        for rel, size in storage.sizes(self.checkpoints).items():
            name, _, inside = rel[len(self.checkpoints) + 1 :].partition("/")
            contents.setdefault(name, {})[inside] = size
        steps = {}
        for step, name in named.items():
            files = contents.get(name, {})
            if self.manifest in files:
                if not manifest_gaps(storage.read_text(f"{self.checkpoints}/{name}/{self.manifest}"), files):
                    steps[step] = name
        return steps

    def is_complete(self, checkpoint: Path) -> bool:
        """Whether a local checkpoint folder holds every file its manifest lists, at the listed size (always
        true for a layout without a manifest)."""
        if self.manifest is None:
            return True
        try:
            listed = _manifest_files((checkpoint / self.manifest).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return False
        if listed is None:
            return False
        for rel, size in listed.items():
            path = checkpoint.joinpath(*rel.split("/"))
            if not path.is_file() or path.stat().st_size != size:
                return False
        return True

    def write_manifest(self, checkpoint: Path) -> Path:
        """List every file of ``checkpoint`` with its size in the manifest, written last (through a temp
        name)."""
        assert self.manifest is not None, "this layout has no checkpoint manifest"
        files = {
            path.relative_to(checkpoint).as_posix(): path.stat().st_size
            for path in sorted(checkpoint.rglob("*"))
            if path.is_file() and path.name != self.manifest
        }
        target = checkpoint / self.manifest
        partial = target.with_name(f".{self.manifest}.partial")
        partial.write_text(manifest_text(files))
        partial.replace(target)
        return target


def manifest_text(files: dict[str, int]) -> str:
    """A checkpoint manifest: every file of the checkpoint (path inside it -> size in bytes)."""
    return json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1, sort_keys=True)


def _manifest_files(text: str | None) -> dict[str, int] | None:
    """The manifest's ``{relpath: size}``; None when it is not one (unreadable, or cut short)."""
    try:
        data = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if (
        not isinstance(data, dict)
        or data.get("format") != MANIFEST_FORMAT
        or not isinstance(data.get("files"), dict)
    ):
        return None
    files = data["files"]
    if not all(isinstance(rel, str) and type(size) is int and size >= 0 for rel, size in files.items()):
        return None
    return files


def manifest_gaps(manifest_text: str | None, sizes: dict[str, int]) -> list[str]:
    """What keeps a checkpoint from being complete, given its manifest's text and the files it has (``{relpath
    inside the checkpoint: size}``): an empty list when every listed file is there with its listed size."""
    files = _manifest_files(manifest_text)
    if files is None:
        return ["no readable manifest"]
    gaps = []
    for rel, size in sorted(files.items()):
        have = sizes.get(rel)
        if have is None:
            gaps.append(f"{rel}: missing")
        elif have != size:
            gaps.append(f"{rel}: {have} bytes, expected {size}")
    return gaps


@dataclass(frozen=True)
class Capabilities:
    """What a backend implements of the recipe's optional shared parts, stated in the backend's own schema
    module (``backends/<kind>_schema.py``). One validation (``capability_problems`` in
    :mod:`tpuft.config.recipe`) refuses, at its line, a key that some backend declares and this one does not,
    when the recipe sets it to a non-default value, and names the backends that do support it. Giving a
    backend a feature is one more entry here, in its own file."""

    keys: frozenset[KeyPath] = frozenset()
    """Shared recipe keys (e.g. ``("train", "grad_accum_steps")``) this backend's trainer honours."""
    metrics: frozenset[str] = frozenset()
    """The ``eval.metric`` values this backend's trainer computes."""
    why_not: dict[str, str] = field(default_factory=dict)
    """Why this engine cannot do a shared key (dotted, ``train.sharding``) or metric (``bleu``) that another
    backend declares: the refusal's reason and the capability matrix's cell. Every shared key and metric
    another backend declares and this one does not must have its reason here
    (tests/config/test_capabilities.py checks)."""

    unsupported_generations: dict[str, str] = field(default_factory=dict)
    """TPU generations (the catalogue's names) this backend's framework cannot drive, and why: a recipe of
    this backend on such a TPU is refused before anything is created (on CPU workers, the rigs' and the
    local pod's, the generation is only a name and nothing is refused)."""

    def reason(self, key: KeyPath | str) -> str | None:
        """Why this backend refuses ``key`` (a key path or a metric name), if it says."""
        return self.why_not.get(key if isinstance(key, str) else ".".join(map(str, key)))
