"""The recipe (``NAME.yaml``): what to train. Its ``backend:`` section is each registered backend's
own model (``backends/<kind>_schema.py``, found through the registry without importing any backend's planner),
told apart by ``kind``. Loaded by :func:`tpuft.config.load_recipe`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from tpuft.backends.registry import capabilities, config_models
from tpuft.config.data import DataConfig
from tpuft.config.report import ReportConfig
from tpuft.core.config_types import Count, Duration, KeyPath, ModelRef, StrictModel, TimeLimit, listed_once
from tpuft.model.t5_config import BYT5_VOCAB, T5Settings


def _backend_union() -> Any:
    """Every registered backend's own recipe section (``backends/<kind>_schema.py``), told apart by
    ``kind``."""
    models = tuple(config_models())
    # Union[...] rather than `|`: the members come from the registry at run time
    union = models[0] if len(models) == 1 else Union[models]  # noqa: UP007 - built at run time
    return Annotated[union, Field(discriminator="kind")]


Backend = _backend_union()


class PromptTuning(StrictModel):
    """Soft prompt tuning (Lester et al., 2021): the model is frozen and only a few prompt embeddings
    learn."""

    tokens: int = Field(100, ge=1, le=4096, description="Prompt length in embedding vectors.")
    init: Literal["vocab", "random"] = Field(
        "vocab",
        description="'vocab': start from the embeddings of random vocabulary tokens (the paper's best); "
        "'random'.",
    )


class ModelConfig(StrictModel):
    name_or_path: ModelRef | None = Field(
        None,
        description="A Hugging Face model id or a local directory to start from (e.g. google/t5-v1_1-small).",
    )
    config: T5Settings | None = Field(
        None,
        description="Random-init model: keyword arguments for transformers.T5Config (d_model, num_layers, "
        "...).",
    )
    tokenizer: ModelRef = Field(
        "byt5",
        description="'byt5' for the byte-level ByT5 tokenizer (needs no files), or an HF id / local path.",
    )
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="Override the model's dropout rate.")
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in the backward pass: less memory for about a third more compute.",
    )
    freeze: list[Literal["embeddings", "encoder", "decoder"]] = Field(
        default_factory=list,
        max_length=3,
        description="Parts whose weights are not trained (they stay bit-identical).",
    )
    prompt_tuning: PromptTuning | None = Field(
        None,
        description="Soft prompt tuning: train only `tokens` prompt vectors put before every input; the "
        "model is frozen.",
    )

    @field_validator("freeze")
    @classmethod
    def _freeze_once(cls, value: list[str]) -> list[str]:
        return listed_once(value)

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.name_or_path is not None and self.config is not None:
            raise ValueError(
                "give exactly one of model.name_or_path (pretrained) or model.config (random init)"
            )
        return self

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found = self._nulls_in_config()
        vocab = self.config.vocab_size if self.config is not None else None
        if self.tokenizer == "byt5" and vocab is not None and vocab < BYT5_VOCAB:
            found.append(
                (
                    ("config", "vocab_size"),
                    f"{vocab} is smaller than the byt5 tokenizer's {BYT5_VOCAB} ids (leave it out: "
                    "the tokenizer's size is the default)",
                )
            )
        return found

    def _nulls_in_config(self) -> list[tuple[KeyPath, str]]:
        """``d_model: null`` (or ``d_model:`` with nothing after it) validates as "not given", but the key was
        given: the resolved recipe passes ``d_model=None`` to transformers.T5Config on every worker, which
        crashes there."""
        if self.config is None:
            return []
        return [
            (
                ("config", key),
                "is null: leave the key out for transformers' default, or give a value: "
                f"{type(self.config).model_fields[key].description}",
            )
            for key in sorted(self.config.model_fields_set)
            if getattr(self.config, key) is None
        ]


class EarlyStopping(StrictModel):
    patience: Count = Field(description="Evaluations in a row without improvement before training stops.")
    min_delta: float = Field(
        0.0, ge=0.0, le=1e6, description="An improvement smaller than this does not count."
    )


class AdafactorSettings(StrictModel):
    """Adafactor as transformers implements it, every knob of seed 003's call exposed; the defaults are the T5
    fine-tuning ones (fixed learning rate from train.learning_rate and the schedule)."""

    eps: list[float] = Field(
        default_factory=lambda: [1e-30, 1e-3],
        min_length=2,
        max_length=2,
        description="[eps1, eps2]: regularisers of the squared gradient and of the update scale.",
    )
    clip_threshold: float = Field(1.0, gt=0.0, le=1e6, description="Clip the update's RMS to this.")
    decay_rate: float = Field(-0.8, ge=-10.0, le=0.0, description="Second-moment decay exponent.")
    beta1: float | None = Field(
        None, ge=0.0, lt=1.0, description="First moment (momentum); null: none (saves memory)."
    )
    scale_parameter: bool = Field(False, description="Scale the learning rate by the parameter's RMS.")
    relative_step: bool = Field(
        False, description="Adafactor's own time-dependent rate (ignores learning_rate)."
    )
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
        description="After warm-up: 'linear' decays to 0 at the last step, 'cosine' follows half a cosine "
        "to 0, 'constant' stays at the peak, 'inverse_sqrt' (T5's pretraining schedule) holds "
        "the peak for the warm-up steps, then peak*sqrt(warmup/step).",
    )
    warmup_steps: int = Field(
        0, ge=0, le=1_000_000_000, description="Linear warm-up from 0 to the peak learning rate."
    )
    weight_decay: float = Field(
        0.0, ge=0.0, le=1.0, description="Decoupled weight decay (AdamW's; 0 disables it)."
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0.0, le=1e6, description="Clip the global gradient norm; null disables it."
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seeds model init and data order; the same on every worker."
    )
    grad_accum_steps: Count = Field(
        1,
        description="Micro-batches per optimizer step: batch_size is still the global batch the optimizer "
        "sees.",
    )
    precision: Literal["float32", "bf16"] = Field(
        "float32",
        description="'bf16': XLA bfloat16 compute on TPU, autocast on CPU (weights and optimizer stay "
        "float32).",
    )
    adafactor: AdafactorSettings = Field(
        default_factory=lambda: AdafactorSettings(), description="Adafactor's knobs."
    )
    label_smoothing: float = Field(
        0.0, ge=0.0, lt=1.0, description="Label smoothing of the cross-entropy loss."
    )
    sharding: Literal["data", "fsdp"] = Field(
        "data",
        description="'data': a full copy per replica; 'fsdp': parameters sharded over every chip (SPMD).",
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
    startup_timeout: Duration = Field(
        1800.0,
        description="How long the trainers wait for every host (of every slice) to be up, i.e. past "
        "the runtime's rendezvous and its first step (the first compile included), before the "
        "run fails naming the hosts that never came; the wait is reported while it lasts: 1800, "
        "30m, 1h. Cold starts of many slices take minutes; raise it for a model whose first "
        "compile takes longer.",
    )
    hang_timeout: Duration = Field(
        600.0,
        description="A worker whose trainer makes no progress for this long (3x, at least a minute, while "
        "compiling, "
        "evaluating or checkpointing) is declared hung and the run is stopped: 600, 90s, 10m, 1h.",
    )
    compile_cache: bool | None = Field(
        None,
        description="Keep the compiled XLA programs on each host's disk (~/.cache/tpuft/xla/<kind>; the "
        "machine-wide cache folder on the local pod), so that a restarted trainer (a resume, a hang or "
        "a crash recovered, a killed controller) loads its train and eval steps instead of compiling them "
        "again: JAX's persistent compilation cache (t5x), torch_xla's (torch_xla). null: on where the "
        "engine has one; false: compile afresh every time.",
    )
    time_limit: TimeLimit | None = Field(
        None,
        description="A wall-clock budget for training, counted from each attempt's first step: once spent, "
        "the run saves a checkpoint at the next log_every step, runs its test evaluation and export, and "
        "ends as finished (its heartbeat says ended: time_limit). `tpuft resume RUN --time-limit 2h` "
        "continues from that checkpoint with a new budget (each attempt gets the whole limit): 5400, 90m, "
        "12h. null: no limit.",
    )
    max_cost: float | None = Field(
        None,
        gt=0.0,
        le=1e9,
        description="Stop the run with a checkpoint once its cost so far (every attempt's chip-hours x "
        "the catalogue's list price for on-demand, spot or reserved capacity, as created; an "
        "estimate, in USD) reaches this. Worker 0's supervisor checks it, so it holds with no "
        "terminal attached; `tpuft resume` continues from that checkpoint (raise it with --set "
        "first). On the local pod it counts what the same hours would cost on the cluster's "
        "accelerator. null: no limit.",
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
    every: Count | None = Field(
        100, description="Evaluate every N steps (and at the end); null: only at the end."
    )
    batch_size: int = Field(64, ge=1, le=1 << 20, description="Global eval batch.")
    max_examples: Count | None = Field(None, description="Evaluate on at most this many held-out examples.")
    metric: EvalMetric | None = Field(
        None,
        description="What ranks evaluations (keep_best, early_stopping): exact_match, accuracy, "
        "token_accuracy, loss, "
        "bleu or rouge_l; default: exact match (text-to-text) or accuracy (classification).",
    )
    generate_examples: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Greedy-decode this many held-out examples at every evaluation for BLEU and ROUGE-L "
        "(on the host; default 256 when eval.metric is bleu or rouge_l).",
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
    description: str = Field(
        "", max_length=100_000, description="What the recipe does, for `tpuft recipes ls` and show."
    )
    backend: Backend = Field(
        description="How the model is trained: a mapping whose kind is torch_xla, keras or t5x."
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig,
        description="The model: pretrained weights or a config, and the tokenizer.",
    )
    data: DataConfig = Field(
        description="Training and held-out data: files or a Hugging Face dataset, fields, lengths."
    )
    train: TrainConfig = Field(
        description="Steps, batch, optimizer, schedule, checkpoints, keep-best, early stopping."
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Held-out evaluation: how often, on how many, which metric."
    )
    export: ExportConfig = Field(
        default_factory=ExportConfig, description="The Hugging Face export at the end of a run."
    )
    report: ReportConfig = Field(
        default_factory=ReportConfig, description="Experiment tracking: TensorBoard (always), W&B, MLflow."
    )

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
            raise ValueError("must be letters, digits, '_', '.' or '-' (64 at most)")
        return value

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        for section in ("backend", "model"):
            found += [
                ((section, *path), message) for path, message in getattr(self, section).cross_problems()
            ]
        return found + self.backend.recipe_problems(self) + capability_problems(self)


# ----------------------------------------------------------------------------------------------------------
# What a backend supports


def capability_problems(recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
    """The one check of :class:`~tpuft.backends.spec.Capabilities`: a shared key that some backend declares
    and this recipe's backend does not, set to a non-default value, and an ``eval.metric`` this backend does
    not compute; each located at its key and naming the backends that do support it."""
    every = capabilities()
    kind = recipe.backend.kind
    own = every[kind]
    optional = sorted(
        set().union(*(c.keys for c in every.values())) - own.keys, key=lambda key: tuple(map(str, key))
    )
    found: list[tuple[KeyPath, str]] = []
    for key in optional:
        if _is_set(recipe, key):
            supporting = [name for name, c in every.items() if key in c.keys]
            verb = "supports" if len(supporting) == 1 else "support"
            why = own.reason(key)
            because = f": {why}" if why else ""
            found.append(
                (
                    key,
                    f"not supported by the {kind} backend{because} ({_backends(supporting)} {verb} it); "
                    "remove it",
                )
            )
    metric = recipe.eval.metric
    if metric is not None and metric not in own.metrics:
        computing = [name for name, c in every.items() if metric in c.metrics]
        verb = "computes" if len(computing) == 1 else "compute"
        who = f"{_backends(computing)} {verb} it" if computing else "no backend computes it"
        why = own.reason(metric)
        because = f": {why}" if why else ""
        found.append(
            (
                ("eval", "metric"),
                f"{metric} is not computed by the {kind} backend{because} ({who}); use "
                f"{', '.join(sorted(own.metrics))}",
            )
        )
    return found


def _is_set(recipe: RecipeConfig, key: KeyPath) -> bool:
    """Whether the recipe gives ``key`` a value other than its default."""
    owner: Any = recipe
    for part in key[:-1]:
        owner = getattr(owner, str(part))
    name = str(key[-1])
    default = type(owner).model_fields[name].get_default(call_default_factory=True)
    return bool(getattr(owner, name) != default)


def _backends(kinds: list[str]) -> str:
    """``the keras backend`` / ``the keras and torch_xla backends``."""
    names = sorted(kinds)
    if len(names) == 1:
        return f"the {names[0]} backend"
    return f"the {', '.join(names[:-1])} and {names[-1]} backends"
