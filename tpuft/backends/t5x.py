"""T5X: gin + seqio, the same multi-controller JAX program on every host of a pod.

The recipe names a model by family and size (one of t5x's own ``examples/`` gins) or by the user's gin files, the
task (fine-tuning on JSON lines, or span-corruption pretraining on plain text), and the few bindings every user
sets; the worker (``tpuft/worker/t5x_train.py``) writes the seqio task module and the run gin from them into the run
dir, so nobody writes Python or pastes gin by hand, and starts ``t5x.train`` in-process.

On TPU hosts JAX's runtime finds the other hosts itself (every host must start: one that does not makes the others
wait). On the local CPU pod the trainer calls ``jax.distributed.initialize`` with worker 0 as the coordinator, and
JAX's gloo CPU collectives make the rehearsal a real 2-host run.

Pins (tested together on Python 3.11 and in CI, see ``../shared/wheels/README.md`` for how they were found):
jax/jaxlib 0.10.2 need Python >= 3.11 (jax >= 0.11 needs 3.12). The TPU VM images built on Ubuntu 22.04
(``tpu-ubuntu2204-base``, ``v2-alpha-tpuv4-pod``, ``v2-alpha-tpuv5``/``v6e``) ship Python 3.10, where jaxlib stops at
0.6.2: ``tpuft setup`` then builds the venv from a newer interpreter found on the worker (python3.13/3.12/3.11) and,
when there is none, stops with what to install (``gcp.python`` names the interpreter to use). t5x, airio and
jestimator are not on PyPI and name their git dependencies unpinned, so they are installed with ``--no-deps`` after
the pinned PyPI set: from their git repositories at the tested commits, or from ``backend.t5x_source``.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from tpuft.backends.base import (
    PYTORCH_XLA_KEYS,
    ClusterShape,
    EnvSpec,
    KeyPath,
    LaunchPlan,
    RunLayout,
    Target,
    text_metric_problems,
    unsupported,
)
from tpuft.config_types import PathText, Requirement, StrictModel, path_from_file

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.runs import RunSnapshot

Family = Literal["t5_1_0", "t5_1_1", "mt5", "byt5", "umt5"]
Size = Literal["tiny", "small", "base", "large", "xl", "xxl"]

_T5_1_0_NAMES = {"xl": "3B", "xxl": "11B"}


def model_gins(family: str, size: str) -> tuple[str, ...] | None:
    """The gin files (paths inside the t5x package) that define ``family`` at ``size``; None when t5x has none."""
    if family == "umt5":
        if size == "tiny":
            return None
        base = "t5x/examples/scalable_t5"
        return (
            f"{base}/mt5/{size}.gin",
            f"{base}/umt5/architectures/encoder_decoder.gin",
            f"{base}/umt5/optimizer/adafactor.gin",
            f"{base}/umt5/vocab.gin",
        )
    if family == "t5_1_0":
        return (f"t5x/examples/t5/t5_1_0/{_T5_1_0_NAMES.get(size, size)}.gin",)
    return (f"t5x/examples/t5/{family}/{size}.gin",)


PRETRAINING_LOSS_FACTOR = {"t5_1_0": 233472.0, "t5_1_1": 233472.0, "mt5": 233472.0, "byt5": 193536.0}
"""T5X's advice for fine-tuning the public checkpoints that were pretrained in Mesh TensorFlow: normalise the loss by
the pretraining batch's target tokens (2048 x 114 for T5 and mT5, 1024 x 189 for ByT5), not by this batch's."""

SENTINELS_BUILT_IN = {"t5_1_0", "t5_1_1", "mt5", "umt5"}
"""Families whose default SentencePiece vocabulary has the sentinel ids (``<extra_id_N>``) span corruption needs."""

T5X_COMMIT = "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"
AIRIO_COMMIT = "69897df7d9a427b947a9f7bb4164c7782b43e601"
JESTIMATOR_COMMIT = "326824a477feef6d92e6f44175000907a72899ca"
GIT_SOURCES = (
    f"t5x @ git+https://github.com/google-research/t5x@{T5X_COMMIT}",
    f"airio @ git+https://github.com/google/airio@{AIRIO_COMMIT}",
    f"jestimator @ git+https://github.com/google-research/jestimator@{JESTIMATOR_COMMIT}",
)
"""What a user's workers install by default: the upstream repositories at the commits tpuft is tested with."""
SOURCE_PACKAGES = ("t5x", "airio", "jestimator")

JAX_VERSION = "0.10.2"
MIN_PYTHON = "3.11"
PINNED = (
    "flax==0.12.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore==0.1.86",
    "seqio==0.0.20",
    "gin-config==0.5.0",
    "clu==0.0.12",
    "fiddle==0.3.1",
    "optax==0.2.8",
    "chex==0.1.92",
    "jaxtyping==0.3.11",
    "grain==0.2.18",
    "cached_property",
    "tensorflow-cpu==2.21.0",  # seqio's input pipelines; the CPU wheel on TPU hosts too (JAX owns the chips)
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    "tensorboard",  # TF 2.21 no longer pulls it in, and `import t5x` needs it
    "sentencepiece>=0.2",
    "numpy>=1.26",
    "pydantic>=2.6",
    "pyyaml>=6",
    "google-cloud-storage>=2.14",  # the worker mirrors a gs:// run dir and reads gs:// checkpoints to export
)
"""The PyPI set that installs and trains with t5x at ``T5X_COMMIT`` (Python 3.11, CPU and TPU)."""


class T5xBackend(StrictModel):
    """T5X: gin + seqio, one JAX process per host (every host of a pod)."""

    kind: Literal["t5x"] = "t5x"
    task: Literal["finetune", "span_corruption"] = Field(
        "finetune",
        description="'finetune': text-to-text on data.train (JSON lines); 'span_corruption': T5's pretraining "
        "objective on data.corpus (plain text).",
    )
    family: Family | None = Field(None, description="A t5x model gin by family and size, e.g. byt5 + tiny.")
    size: Size | None = Field(None, description="tiny, small, base, large, xl or xxl (t5_1_0: xl = 3B, xxl = 11B).")
    gin_files: list[PathText] = Field(
        default_factory=list,
        max_length=64,
        description="Your own model gin file(s) instead of family/size (paths relative to the recipe, or gs://); "
        "they must bind MODEL and VOCABULARY as t5x's example gins do.",
    )
    initial_checkpoint: PathText | None = Field(
        None,
        description="Start from this T5X checkpoint (e.g. gs://t5-data/pretrained_models/t5x/t5_1_1_base/"
        "checkpoint_1000000); null: random init.",
    )
    initial_step: int | None = Field(
        None, ge=0, le=1_000_000_000,
        description="The initial checkpoint's step, when its folder is not named checkpoint_<step>.",
    )  # fmt: skip
    vocabulary: PathText | None = Field(
        None,
        description="'byt5' (bytes), or a SentencePiece .model (a path or gs:// URL); null: the model gin's own.",
    )
    extra_ids: int = Field(
        0, ge=0, le=10_000,
        description="Sentinel ids seqio appends to a SentencePiece vocabulary (T5 used 100); span corruption "
        "needs them unless the .model has <extra_id_N> pieces itself.",
    )  # fmt: skip
    noise_density: float = Field(0.15, gt=0.0, lt=1.0, description="Span corruption: the share of tokens masked.")
    mean_noise_span_length: float = Field(3.0, ge=1.0, le=1000.0, description="Span corruption: mean span length.")
    loss_normalizing_factor: float | Literal["auto"] | None = Field(
        "auto",
        description="'auto': T5X's advice (the pretraining batch's target tokens when fine-tuning a public "
        "checkpoint of a known family, else per-batch); a number; or null for per-batch.",
    )
    num_microbatches: int | None = Field(None, ge=1, le=65536, description="Gradient accumulation in microbatches.")
    num_partitions: int = Field(1, ge=1, le=65536, description="Model-parallel partitions (PjitPartitioner).")
    dtype: Literal["bfloat16", "float32"] | None = Field(
        None, description="Activations dtype; default bfloat16 on TPU, float32 on CPU."
    )
    gin_overrides: dict[str, Any] = Field(
        default_factory=dict,
        max_length=1000,
        description="Any other gin binding, e.g. {'network.T5Config.vocab_size': 64128}; values are Python "
        "literals, or text starting with @ or % for gin references.",
    )
    t5x_source: PathText | None = Field(
        None,
        description="Where t5x, airio and jestimator come from: null for their git repositories at the tested "
        "commits, or a local checkout, a t5x wheel, or a folder of wheels (a wheelhouse), shipped to the workers.",
    )
    extra_requirements: list[Requirement] = Field(
        default_factory=list, max_length=200, description="More pip requirements for the worker venv (pinned, please)."
    )

    @field_validator("gin_files")
    @classmethod
    def _gin_files_exist(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return [_local_or_url(text, info, "gin file") for text in value]

    @field_validator("t5x_source")
    @classmethod
    def _source_exists(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if value.startswith(("gs://", "http://", "https://", "git+")):
            raise ValueError("give a local path (a checkout, a wheel or a folder of wheels); null uses the git repositories")
        path = Path(path_from_file(value, info)).resolve()
        if (info.context or {}).get("check_files", True):
            if not path.exists():
                raise ValueError(f"not found: {path}")
            checkout = (path / "setup.py").exists() or (path / "pyproject.toml").exists()
            if path.is_dir() and not checkout and not any(path.glob("*.whl")):
                raise ValueError(f"{path} is neither a t5x checkout (setup.py) nor a folder of t5x/airio/jestimator wheels")
        return str(path)

    @field_validator("vocabulary")
    @classmethod
    def _vocabulary_ok(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or value == "byt5":
            return value
        return _local_or_url(value, info, "SentencePiece model")

    @field_validator("gin_overrides")
    @classmethod
    def _bindings_ok(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name, bound in value.items():
            if not _BINDING.fullmatch(name):
                raise ValueError(f"{name!r} is not a gin binding name (e.g. 'PjitPartitioner.num_partitions')")
            gin_value(bound)  # raises ValueError naming what cannot be written
        return value

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        named = self.family is not None or self.size is not None
        if named and self.gin_files:
            found.append((("gin_files",), "give either family + size (a t5x example gin) or gin_files, not both"))
        elif not named and not self.gin_files:
            found.append((("family",), "required: a model by family and size (e.g. family: byt5, size: tiny), or gin_files"))
        elif named and (self.family is None or self.size is None):
            missing = "size" if self.size is None else "family"
            found.append(((missing,), f"required with backend.{'family' if missing == 'size' else 'size'}"))
        elif self.family is not None and self.size is not None and model_gins(self.family, self.size) is None:
            found.append((("size",), f"t5x has no {self.family} {self.size} gin (umt5 starts at small)"))
        if self.gin_files and not named and self.vocabulary is None:
            found.append((("vocabulary",), "required with backend.gin_files: byt5, or the SentencePiece .model your "
                          "gin's VOCABULARY uses (tpuft binds VOCABULARY and the task's vocabulary to the same one)"))
        if self.vocabulary is None and self.family in SENTINELS_BUILT_IN and self.extra_ids:
            found.append((("extra_ids",), f"the {self.family} vocabulary has its sentinel ids built in; seqio would "
                          f"add {self.extra_ids} more and outgrow the model's vocab_size: leave extra_ids at 0"))
        if self.task == "span_corruption":
            found += self._sentinel_problems()
        if self.initial_checkpoint is not None and self.initial_step is None and checkpoint_step(self.initial_checkpoint) is None:
            found.append(
                (
                    ("initial_step",),
                    f"{self.initial_checkpoint!r} is not named checkpoint_<step>: give its step here, so that tpuft "
                    "can count this run's steps after it (T5X's TRAIN_STEPS is absolute)",
                )
            )
        return found

    def _sentinel_problems(self) -> list[tuple[KeyPath, str]]:
        """Span corruption replaces each masked span with a sentinel id, counted down from the top of the vocabulary;
        without sentinel ids there, the sentinels overwrite real pieces (the model then learns that some ordinary
        pieces mean "masked here"). A local .model is read here; one in a bucket is checked on the workers."""
        if self.vocabulary in (None, "byt5") or self.extra_ids or self.vocabulary.startswith("gs://"):
            return []  # the families' default vocabularies have their sentinels; ByT5 uses the top byte values
        top = sentencepiece_last_piece(Path(self.vocabulary))
        if top is None or "extra_id" in top:
            return []
        return [
            (
                ("extra_ids",),
                f"span corruption needs sentinel ids, and the top piece of {self.vocabulary} is the ordinary piece "
                f"{top!r}: its sentinels would overwrite real pieces. Set backend.extra_ids (T5 used 100) and make the "
                "model's vocab_size at least the vocabulary's size plus these ids",
            )
        ]

    def recipe_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        model = recipe.model
        for key in ("name_or_path", "config"):
            if getattr(model, key) is not None:
                found.append(
                    (("model", key), "the t5x backend takes its model from backend.family + backend.size (or "
                     "backend.gin_files) and backend.initial_checkpoint; remove model." + key)
                )
        if model.tokenizer != "byt5":
            found.append((("model", "tokenizer"), "the t5x backend's vocabulary is backend.vocabulary (byt5 or a "
                          "SentencePiece .model); remove model.tokenizer"))
        data = recipe.data
        if self.task == "finetune":
            if data.train is None:
                found.append((("data", "train"), "required for task finetune: training examples, JSON lines"))
            if data.corpus:
                found.append((("data", "corpus"), "a corpus is for task span_corruption (backend.task)"))
        else:
            if not data.corpus:
                found.append((("data", "corpus"), "required for task span_corruption: text files or globs, one document a line"))
            if data.train is not None or data.eval is not None:
                key = "train" if data.train is not None else "eval"
                found.append((("data", key), "task span_corruption reads data.corpus, not JSON lines"))
        train = recipe.train
        if train.optimizer != "adafactor":
            found.append((("train", "optimizer"), "the t5x model gins train with T5X's Adafactor; set adafactor (or "
                          "bind OPTIMIZER in backend.gin_overrides)"))
        if train.checkpoint_every and recipe.eval.every and data.eval is not None:
            small, large = sorted((train.checkpoint_every, recipe.eval.every))
            if large % small:
                found.append((("eval", "every"), f"T5X needs the eval and checkpoint periods to be multiples of each "
                              f"other (train.checkpoint_every is {train.checkpoint_every})"))
        # seqio trims inputs at their end; T5X keeps the best checkpoint by the eval metric anyway (keep_best)
        found += unsupported(recipe, "t5x", ("data", "truncation"), ("data", "label_field"), ("data", "labels"),
                             ("train", "early_stopping"), ("data", "source_transforms"), ("data", "target_transforms"),
                             ("data", "preprocess"), *PYTORCH_XLA_KEYS)
        found += text_metric_problems(recipe, "t5x")
        return found


_BINDING = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(/[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)*")


def gin_value(value: Any) -> str:
    """A recipe value as gin text: Python literals as themselves, ``@ref`` / ``%MACRO`` as references."""
    if isinstance(value, str) and re.fullmatch(r"[@%][A-Za-z_][\w./]*(\(\))?", value):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} cannot be written as a gin value (gin has no infinity or NaN)")
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(gin_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{gin_value(k)}: {gin_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"{value!r} cannot be written as a gin value")


def sentencepiece_last_piece(path: Path) -> str | None:
    """The last piece of a SentencePiece ``.model`` (a ModelProto: field 1 repeats SentencePiece messages whose
    field 1 is the piece), read without sentencepiece; None when the file is not one."""
    try:
        data = path.read_bytes()
    except OSError:
        return None

    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("truncated")
            byte = data[at]
            value |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not byte & 0x80:
                return value, at

    last = None
    at = 0
    try:
        while at < len(data):
            key, at = varint(at)
            kind = key & 7
            if kind == 0:
                _, at = varint(at)
            elif kind == 1:
                at += 8
            elif kind == 5:
                at += 4
            elif kind == 2:
                size, at = varint(at)
                if key >> 3 == 1:
                    inner_key, inner = data[at], at + 1
                    if inner_key == 0x0A:  # field 1, length-delimited: the piece
                        length, inner = varint(inner)
                        last = data[inner : inner + length].decode("utf-8", "replace")
                at += size
            else:
                return None
    except ValueError:
        return None
    return last


def checkpoint_step(path: str) -> int | None:
    match = re.search(r"checkpoint_(\d+)/*$", path)
    return int(match.group(1)) if match else None


def _local_or_url(text: str, info: ValidationInfo, what: str) -> str:
    if text.startswith("gs://"):
        return text
    path = Path(path_from_file(text, info)).resolve()
    if (info.context or {}).get("check_files", True) and not path.is_file():
        raise ValueError(f"{what} not found: {path}")
    return str(path)


def source_requirements(source: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requirements installed with --no-deps, local paths they name) for ``backend.t5x_source``."""
    if source is None:
        return GIT_SOURCES, ()
    path = Path(source)
    if path.is_dir() and not (path / "setup.py").exists() and not (path / "pyproject.toml").exists():
        wheels = sorted(path.glob("*.whl"))
        named = []
        for package in SOURCE_PACKAGES:
            found = [w for w in wheels if w.name.split("-")[0].lower() == package]
            named.append(str(found[-1]) if found else next(g for g in GIT_SOURCES if g.startswith(package)))
        return tuple(named), tuple(n for n in named if n.startswith("/"))
    return (str(path), *GIT_SOURCES[1:]), (str(path),)


def source_digest(paths: tuple[str, ...]) -> str:
    """Content hash of the local sources, so that a changed wheel or checkout gives a new venv."""
    digest = hashlib.sha256()
    for text in paths:
        path = Path(text)
        files = sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(path.parent)).encode())
            try:
                digest.update(hashlib.sha256(file.read_bytes()).digest())
            except OSError:
                digest.update(b"?")
    return digest.hexdigest()[:16]


LAYOUT = RunLayout(
    checkpoint_format="checkpoint_{step}",
    checkpoint_pattern=r"^checkpoint_(\d+)$",
    manifest="manifest.json",
)
"""T5X writes ``checkpoints/checkpoint_N`` (Orbax) itself, the run's MODEL_DIR: in the bucket for a gs:// run dir.
Worker 0 adds tpuft's ``manifest.json`` once Orbax has finished a checkpoint, so pull, convert and resume take only
complete ones. TensorBoard events, metrics.jsonl and predictions go to the run dir as with every backend."""


class T5x:
    kind = "t5x"
    config_model = T5xBackend
    layout = LAYOUT

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, T5xBackend)
        jax = f"jax[tpu]=={JAX_VERSION}" if target == "tpu" else f"jax=={JAX_VERSION}"
        no_deps, local = source_requirements(backend_config.t5x_source)
        requirements = (jax, f"jaxlib=={JAX_VERSION}", *PINNED, *backend_config.extra_requirements)
        return EnvSpec(
            kind=self.kind,
            requirements=requirements,
            python=python,
            no_deps=no_deps,
            min_python=MIN_PYTHON,
            local_sources=local,
            sources_digest=source_digest(local) if local else "",
        )

    @staticmethod
    def data_parallel(recipe: RecipeConfig, shape: ClusterShape) -> int:
        """Data-parallel replicas: every device (chips on TPU, one CPU device per host locally) over the
        model-parallel partitions."""
        devices = shape.chips if shape.target == "tpu" else shape.hosts
        return max(1, devices // recipe.backend.num_partitions)

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        backend = recipe.backend
        devices = shape.chips if shape.target == "tpu" else shape.hosts
        if devices % backend.num_partitions:
            found.append((("backend", "num_partitions"), f"{backend.num_partitions} does not divide the {devices} devices"))
            return found
        replicas = self.data_parallel(recipe, shape)
        step = replicas * (backend.num_microbatches or 1)
        if recipe.train.batch_size % step:
            what = f"{replicas} data-parallel replicas" + (f" x {backend.num_microbatches} microbatches" if backend.num_microbatches else "")
            found.append((("train", "batch_size"), f"{recipe.train.batch_size} does not split evenly over {what} "
                          f"(use a multiple of {step})"))
        return found

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false"}
        if shape.target == "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        return LaunchPlan(workers=tuple(range(shape.hosts)), env=env, ship=("train", "eval", "corpus", "backend.gin_files", "backend.vocabulary"))

    def summarize(self, snapshot: RunSnapshot, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """The best checkpoint by the eval metric: kept besides the last ones, and the one export/hf is made from."""
        best = snapshot.best_metric
        if best is None:
            return {}, []
        name, value, step = best
        folder = LAYOUT.checkpoint_format.format(step=step)
        return {"best_checkpoint": {"name": folder, "metric": name, "value": value}}, [
            ("best checkpoint", f"{folder} ({name.removeprefix('eval_')} {value:.4f})")
        ]


BACKEND = T5x()
