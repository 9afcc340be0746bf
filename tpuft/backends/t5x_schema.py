"""The T5X backend as the recipe and the run-dir readers know it: its ``backend:`` section (a model by family
and size or by gin files, the task, the gin bindings), what it supports of the shared recipe, and its run
layout; with the gin and checkpoint-name helpers the section's validation and the worker share. Pydantic and
the stdlib only (the planner, with the pins, is :mod:`tpuft.backends.t5x`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from tpuft.backends.spec import Capabilities, KeyPath, RunLayout
from tpuft.core.config_types import PathText, Requirement, StrictModel, path_from_file

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig

Family = Literal["t5_1_0", "t5_1_1", "mt5", "byt5", "umt5"]
Size = Literal["tiny", "small", "base", "large", "xl", "xxl"]

_T5_1_0_NAMES = {"xl": "3B", "xxl": "11B"}


def model_gins(family: str, size: str) -> tuple[str, ...] | None:
    """The gin files (paths inside the t5x package) that define ``family`` at ``size``; None when t5x has
    none."""
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
"""T5X's advice for fine-tuning the public checkpoints that were pretrained in Mesh TensorFlow: normalise the
loss by the pretraining batch's target tokens (2048 x 114 for T5 and mT5, 1024 x 189 for ByT5), not by this
batch's."""

SENTINELS_BUILT_IN = {"t5_1_0", "t5_1_1", "mt5", "umt5"}
"""Families whose default SentencePiece vocabulary has the sentinel ids (``<extra_id_N>``) span corruption
needs."""


class T5xBackend(StrictModel):
    """T5X: gin + seqio, one JAX process per host (every host of a pod)."""

    kind: Literal["t5x"] = "t5x"
    task: Literal["finetune", "span_corruption"] = Field(
        "finetune",
        description="'finetune': text-to-text on data.train (JSON lines); 'span_corruption': "
        "T5's pretraining objective on data.corpus (plain text).",
    )
    family: Family | None = Field(None, description="A t5x model gin by family and size, e.g. byt5 + tiny.")
    size: Size | None = Field(
        None, description="tiny, small, base, large, xl or xxl (t5_1_0: xl = 3B, xxl = 11B)."
    )
    gin_files: list[PathText] = Field(
        default_factory=list,
        max_length=64,
        description="Your own model gin file(s) instead of family/size (paths relative to the recipe, "
        "or gs://); they must bind MODEL and VOCABULARY as t5x's example gins do.",
    )
    initial_checkpoint: PathText | None = Field(
        None,
        description="Start from this T5X checkpoint (e.g. gs://t5-data/pretrained_models/t5x/t5_1_1_base/"
        "checkpoint_1000000); null: random init.",
    )
    initial_step: int | None = Field(
        None,
        ge=0,
        le=1_000_000_000,
        description="The initial checkpoint's step, when its folder is not named checkpoint_<step>.",
    )
    vocabulary: PathText | None = Field(
        None,
        description="'byt5' (bytes), or a SentencePiece .model (a path or gs:// URL); null: the model gin's "
        "own.",
    )
    extra_ids: int = Field(
        0,
        ge=0,
        le=10_000,
        description="Sentinel ids seqio appends to a SentencePiece vocabulary (T5 used 100); span corruption "
        "needs them unless the .model has <extra_id_N> pieces itself.",
    )
    noise_density: float = Field(
        0.15, gt=0.0, lt=1.0, description="Span corruption: the share of tokens masked."
    )
    mean_noise_span_length: float = Field(
        3.0, ge=1.0, le=1000.0, description="Span corruption: mean span length."
    )
    loss_normalizing_factor: float | Literal["auto"] | None = Field(
        "auto",
        description="'auto': T5X's advice (the pretraining batch's target tokens when fine-tuning a public "
        "checkpoint of a known family, else per-batch); a number; or null for per-batch.",
    )
    num_microbatches: int | None = Field(
        None, ge=1, le=65536, description="Gradient accumulation in microbatches."
    )
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
        description="Where t5x, airio and jestimator come from: null for their git repositories at "
        "the tested commits, or a local checkout, a t5x wheel, or a folder of wheels (a "
        "wheelhouse), shipped to the workers.",
    )
    extra_requirements: list[Requirement] = Field(
        default_factory=list,
        max_length=200,
        description="More pip requirements for the worker venv (pinned, please).",
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
            raise ValueError(
                "give a local path (a checkout, a wheel or a folder of wheels); null uses the git "
                "repositories"
            )
        path = Path(path_from_file(value, info)).resolve()
        if (info.context or {}).get("check_files", True):
            if not path.exists():
                raise ValueError(f"not found: {path}")
            checkout = (path / "setup.py").exists() or (path / "pyproject.toml").exists()
            if path.is_dir() and not checkout and not any(path.glob("*.whl")):
                raise ValueError(
                    f"{path} is neither a t5x checkout (setup.py) nor a folder of t5x/airio/jestimator wheels"
                )
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
                raise ValueError(
                    f"{name!r} is not a gin binding name (e.g. 'PjitPartitioner.num_partitions')"
                )
            gin_value(bound)  # raises ValueError naming what cannot be written
        return value

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        named = self.family is not None or self.size is not None
        if named and self.gin_files:
            found.append(
                (("gin_files",), "give either family + size (a t5x example gin) or gin_files, not both")
            )
        elif not named and not self.gin_files:
            found.append(
                (
                    ("family",),
                    "required: a model by family and size (e.g. family: byt5, size: tiny), or gin_files",
                )
            )
        elif named and (self.family is None or self.size is None):
            missing = "size" if self.size is None else "family"
            found.append(((missing,), f"required with backend.{'family' if missing == 'size' else 'size'}"))
        elif self.family is not None and self.size is not None and model_gins(self.family, self.size) is None:
            found.append((("size",), f"t5x has no {self.family} {self.size} gin (umt5 starts at small)"))
        if self.gin_files and not named and self.vocabulary is None:
            found.append(
                (
                    ("vocabulary",),
                    "required with backend.gin_files: byt5, or the SentencePiece .model your gin's "
                    "VOCABULARY uses (tpuft binds VOCABULARY and the task's vocabulary to the same one)",
                )
            )
        if self.vocabulary is None and self.family in SENTINELS_BUILT_IN and self.extra_ids:
            found.append(
                (
                    ("extra_ids",),
                    f"the {self.family} vocabulary has its sentinel ids built in; seqio would "
                    f"add {self.extra_ids} more and outgrow the model's vocab_size: leave extra_ids at 0",
                )
            )
        if self.task == "span_corruption":
            found += self._sentinel_problems()
        if (
            self.initial_checkpoint is not None
            and self.initial_step is None
            and checkpoint_step(self.initial_checkpoint) is None
        ):
            found.append(
                (
                    ("initial_step",),
                    f"{self.initial_checkpoint!r} is not named checkpoint_<step>: give its step here, "
                    "so that tpuft can count this run's steps after it (T5X's TRAIN_STEPS is absolute)",
                )
            )
        return found

    def _sentinel_problems(self) -> list[tuple[KeyPath, str]]:
        """Span corruption replaces each masked span with a sentinel id, counted down from the top of the
        vocabulary; without sentinel ids there, the sentinels overwrite real pieces (the model then learns
        that some ordinary pieces mean "masked here"). A local .model is read here; one in a bucket is checked
        on the workers."""
        if self.vocabulary in (None, "byt5") or self.extra_ids or self.vocabulary.startswith("gs://"):
            # the families' default vocabularies have their sentinels; ByT5 uses the top byte values
            return []
        top = sentencepiece_last_piece(Path(self.vocabulary))
        if top is None or "extra_id" in top:
            return []
        return [
            (
                ("extra_ids",),
                f"span corruption needs sentinel ids, and the top piece of {self.vocabulary} is the "
                f"ordinary piece {top!r}: its sentinels would overwrite real pieces. Set backend.extra_ids "
                "(T5 used 100) and make the model's vocab_size at least the vocabulary's size plus these ids",
            )
        ]

    def recipe_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        model = recipe.model
        for key in ("name_or_path", "config"):
            if getattr(model, key) is not None:
                found.append(
                    (
                        ("model", key),
                        "the t5x backend takes its model from backend.family + backend.size (or "
                        "backend.gin_files) and backend.initial_checkpoint; remove model." + key,
                    )
                )
        if model.tokenizer != "byt5":
            found.append(
                (
                    ("model", "tokenizer"),
                    "the t5x backend's vocabulary is backend.vocabulary (byt5 or a "
                    "SentencePiece .model); remove model.tokenizer",
                )
            )
        data = recipe.data
        if self.task == "finetune":
            if data.train is None and data.hf is None:
                found.append(
                    (
                        ("data", "train"),
                        "required for task finetune: training examples (a data file, or "
                        "a Hugging Face dataset as data.hf)",
                    )
                )
            if data.corpus:
                found.append((("data", "corpus"), "a corpus is for task span_corruption (backend.task)"))
        else:
            if not data.corpus:
                found.append(
                    (
                        ("data", "corpus"),
                        "required for task span_corruption: text files or globs, one document a line",
                    )
                )
            for key in (
                "train",
                "eval",
                "test",
                "hf",
            ):  # a pretraining run has nothing to decode for a test either
                if getattr(data, key) is not None:
                    found.append((("data", key), "task span_corruption reads data.corpus, not JSON lines"))
                    break
        train = recipe.train
        if train.optimizer != "adafactor":
            found.append(
                (
                    ("train", "optimizer"),
                    "the t5x model gins train with T5X's Adafactor; set adafactor (or "
                    "bind OPTIMIZER in backend.gin_overrides)",
                )
            )
        found += shared_key_problems(self, recipe)
        if (
            train.checkpoint_every
            and recipe.eval.every
            and (data.eval is not None or (data.hf and data.hf.eval_split))
        ):
            small, large = sorted((train.checkpoint_every, recipe.eval.every))
            if large % small:
                found.append(
                    (
                        ("eval", "every"),
                        f"T5X needs the eval and checkpoint periods to be multiples of each "
                        f"other (train.checkpoint_every is {train.checkpoint_every})",
                    )
                )
        return found


REMAT_FAMILIES = {"umt5"}
"""Families whose t5x network (the scalable T5) has a remat policy in its config; t5x's T5 network has
none."""


def microbatches(recipe: RecipeConfig) -> int | None:
    """T5X's ``num_microbatches``: ``train.grad_accum_steps`` or ``backend.num_microbatches``, one meaning
    (:func:`shared_key_problems` refuses the two when they disagree)."""
    steps = recipe.train.grad_accum_steps
    return steps if steps > 1 else recipe.backend.num_microbatches


def shared_key_problems(backend: T5xBackend, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
    """The shared keys where T5X has a setting of its own too, or a condition of its own."""
    found: list[tuple[KeyPath, str]] = []
    train, model = recipe.train, recipe.model
    accum = train.grad_accum_steps
    if accum > 1 and backend.num_microbatches is not None and backend.num_microbatches != accum:
        found.append(
            (
                ("train", "grad_accum_steps"),
                f"{accum} disagrees with backend.num_microbatches ({backend.num_microbatches}): "
                "they are the same setting on T5X (its microbatches); give one",
            )
        )
    elif accum > 1 and train.batch_size % accum:
        found.append(
            (
                ("train", "grad_accum_steps"),
                f"{accum} microbatches do not split train.batch_size ({train.batch_size}) evenly",
            )
        )
    if train.precision == "bf16" and backend.dtype == "float32":
        found.append(
            (
                ("train", "precision"),
                "bf16 disagrees with backend.dtype (float32): they are the same "
                "setting on T5X (the network's activation dtype); give one",
            )
        )
    if model.gradient_checkpointing and backend.family is not None and backend.family not in REMAT_FAMILIES:
        found.append(
            (
                ("model", "gradient_checkpointing"),
                f"t5x's T5 network (family {backend.family}) has no remat "
                "policy to bind; its scalable T5 network has one (family umt5, or backend.gin_files over "
                "t5x.examples.scalable_t5.network)",
            )
        )
    if train.early_stopping is not None:
        data = recipe.data
        if data.eval is None and not (data.hf and data.hf.eval_split):
            found.append(
                (("train", "early_stopping"), "needs data.eval: T5X stops on its inference evaluations")
            )
        elif train.checkpoint_every and recipe.eval.every and recipe.eval.every % train.checkpoint_every:
            found.append(
                (
                    ("train", "early_stopping"),
                    f"T5X stops after an evaluation, so every evaluation must be a "
                    f"checkpoint step: make eval.every ({recipe.eval.every}) a multiple of "
                    f"train.checkpoint_every ({train.checkpoint_every})",
                )
            )
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
    """The last piece of a SentencePiece ``.model`` (a ModelProto: field 1 repeats SentencePiece messages
    whose field 1 is the piece), read without sentencepiece; None when the file is not one."""
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


LAYOUT = RunLayout(
    checkpoint_format="checkpoint_{step}",
    checkpoint_pattern=r"^checkpoint_(\d+)$",
    manifest="manifest.json",
    markers=("checkpoint", "state/_METADATA"),
    weights=("checkpoint", "_CHECKPOINT_METADATA", "target.*", "target.*/", "state/"),
    companions=("config.gin",),
    foreign_checkpoints=True,
)
"""T5X writes ``checkpoints/checkpoint_N`` (Orbax) itself, the run's MODEL_DIR: in the bucket for a gs:// run
dir. Worker 0 adds tpuft's ``manifest.json`` once Orbax has finished a checkpoint, so pull, convert and resume
take only complete ones. TensorBoard events, metrics.jsonl and predictions go to the run dir as with every
backend. A conversion reads one step's parameters only: a legacy checkpoint's msgpack file and ``target.*``
arrays (never ``state.*``), an Orbax checkpoint's ``state/`` store (the optimizer state shares its OCDBT
files), and the run's ``config.gin``."""


CAPABILITIES = Capabilities(
    keys=frozenset(
        {
            ("train", "compile_cache"),
            # the training side, as bindings of the run gin (tpuft/worker/t5x/keys.py)
            ("train", "precision"),
            ("train", "adafactor"),
            ("train", "label_smoothing"),
            ("train", "grad_accum_steps"),
            ("train", "sharding"),
            ("train", "early_stopping"),
            ("model", "freeze"),
            ("model", "gradient_checkpointing"),
            # the data side, in the seqio task (tpuft/worker/t5x/tasks.py, t5x_data.py)
            ("data", "truncation"),
            ("data", "source_transforms"),
            ("data", "target_transforms"),
            ("data", "preprocess"),
            ("data", "hf"),
            ("eval", "generate_examples"),
        }
    ),
    metrics=frozenset({"exact_match", "accuracy", "token_accuracy", "loss", "bleu", "rouge_l"}),
    why_not={
        "data.label_field": "T5X trains text-to-text models, where a label is the target "
        "text (data.target_field or data.target_template: '{label}'); an encoder's "
        "classification head is the keras backend's backend.task: classification",
        "data.labels": "T5X trains text-to-text models, where a label is the target text as it is written; "
        "label "
        "names for a classification head are the keras backend's backend.task: classification",
        "model.prompt_tuning": "T5X's prompt tuning is a separate package "
        "(google-research/prompt-tuning: its own network layers and partitioning "
        "rules), not in the pinned T5X stack, and gin bindings of t5x "
        "alone cannot put trainable vectors before the encoder's inputs",
    },
)
"""The training-side shared keys are bindings of the run gin (:mod:`tpuft.worker.t5x.keys`; where T5X has the
same setting of its own, ``backend.num_microbatches`` and ``backend.dtype``, :func:`shared_key_problems`
refuses the two disagreeing). The data-side keys are the seqio task's: its source builds examples with the
shared ``make_example`` (transforms, the preprocess hook, data files or ``data.hf``), a preprocessor cuts
inputs as ``data.truncation`` says, and its metric_fns score the inference eval's decodes with the shared
scorer (BLEU, ROUGE-L), whose first ``eval.generate_examples`` are shown."""

SECTION = T5xBackend
