"""What ``tpuft recipes show --summary RECIPE`` works out: the recipe's model, its parameters per module
(total and trainable, after ``model.freeze`` and prompt tuning) and the memory one device needs to train it,
against the HBM of the cluster's accelerator. Pure Python, offline: the model is found by
:mod:`tpuft.model.recipe_model` (a known hub id, a local folder's config.json or the recipe's
``model.config``; a T5X family and size with the ``T5Config`` bindings of ``gin_overrides``,
:mod:`tpuft.model.gin_network`; a BERT classifier's encoder, pooler and head), its shapes come from
:mod:`tpuft.model.shapes`, the sharding from :mod:`tpuft.model.fsdp_plan`. A model it cannot size is a located
error that says so (:class:`~tpuft.model.recipe_model.ModelUnknown`), never the size of another model.

The memory model, per device (a chip from v4 on; a TensorCore on v2/v3, which frameworks use as two devices):
  weights      float32 (``train.precision: bf16`` is bf16 *compute*: XLA / autocast cast per op; the weights,
  their
               gradients and the optimizer state stay float32). ``sharding: data`` holds them whole on every
               device, ``fsdp`` holds each device's shard (:func:`tpuft.model.fsdp_plan.plan`: large matrices
               split, vectors whole).
  gradients    float32, trainable parameters only, sharded like the weights.
  optimizer    AdamW: two float32 moments per trainable parameter. Adafactor: a factored second moment (rows +
  columns
               floats for a matrix, the whole vector for a vector), plus a float32 first moment when
               ``train.adafactor.beta1`` is set. Sharded like the weights (a matrix's factor along its sharded
               dimension is split, the other is whole).
  fsdp working set  the largest unit (a block, or the embedding table) gathered whole while it runs, and the
  full
               gradient of its trainable part before the reduce-scatter, float32. An estimate; XLA may overlap
               more.
  activations  a rough estimate of what the backward pass keeps per example (per layer: the projections, the
               attention scores and probabilities, the feed-forward outputs), times the examples one device
               runs per micro-batch: global batch / devices / grad_accum_steps. bf16 counts 2 bytes, float32
               4; the logits and the loss's float32 log-softmax count in full. With gradient checkpointing
               only each block's input is kept, plus one block recomputed at a time. Dropout masks, XLA's
               temporaries and the runtime's own reserve are not counted: keep some headroom.

Freezing. ``model.freeze: [embeddings]`` freezes ``shared`` (the token embedding of both stacks, and the
output layer of a tied model) and the separate ``lm_head`` of an untied one (T5 v1.1, mT5, ByT5): both map
between token ids and vectors. ``encoder`` / ``decoder`` freeze every parameter under ``encoder.`` /
``decoder.`` (their final layer norms included). Prompt tuning freezes the whole model and trains
``prompt.weight``: tokens x d_model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.model import fsdp_plan
from tpuft.model import shapes as model_shapes
from tpuft.model.recipe_model import ModelSource, resolve_model
from tpuft.model.shapes import Shape

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.core.accelerators import AcceleratorType

FLOAT32 = 4
MODULES = ("shared", "encoder", "decoder", "lm_head", "prompt")
ENCODER_MODULES = ("embeddings", "encoder", "pooler", "classifier")
"""The modules of a BERT classifier (:func:`tpuft.model.shapes.bert_classifier_shapes`)."""
FREEZE_GROUPS = {
    "embeddings": ("shared", "lm_head", "embeddings"),
    "encoder": ("encoder",),
    "decoder": ("decoder",),
}
PROMPT_PARAM = "prompt.weight"
"""The name the summary gives the soft prompt (prompt tuning): ``tokens x d_model``, trainable."""
# ----------------------------------------------------------------------------------------------------------
# Parameters per module


def module_of(name: str) -> str:
    """``shared``, ``encoder``, ``decoder``, ``lm_head`` or ``prompt``: the top-level module a parameter is
    under."""
    return name.split(".", 1)[0]


def trainable_names(shapes: dict[str, Shape], freeze: list[str], prompt_tuning: bool) -> set[str]:
    """The parameters that learn: all but the frozen groups; with prompt tuning, only the prompt."""
    if prompt_tuning:
        return {name for name in shapes if module_of(name) == "prompt"}
    frozen = {module for group in freeze for module in FREEZE_GROUPS[group]}
    return {name for name in shapes if module_of(name) not in frozen}


@dataclass
class ModuleRow:
    module: str
    params: int
    trainable: int
    note: str = ""


def module_rows(
    shapes: dict[str, Shape], trainable: set[str], tied: bool, modules: tuple[str, ...] = MODULES
) -> list[ModuleRow]:
    rows = []
    for module in modules:
        names = [n for n in shapes if module_of(n) == module]
        if module == "lm_head" and not names:
            rows.append(ModuleRow("lm_head", 0, 0, "tied: the output layer is shared" if tied else ""))
            continue
        if not names:
            continue
        total = sum(model_shapes.numel(shapes[n]) for n in names)
        learn = sum(model_shapes.numel(shapes[n]) for n in names if n in trainable)
        note = {
            "shared": "token embeddings of both stacks" + (" and the output layer" if tied else ""),
            "prompt": "soft prompt (prompt tuning)",
            "pooler": "dense + tanh over the first token",
            "classifier": "the classification head",
        }.get(module, "")
        if module == "embeddings":
            note = "token, position and token-type embeddings, layer norm"
        rows.append(ModuleRow(module, total, learn, note))
    return rows


# ----------------------------------------------------------------------------------------------------------
# Memory per device


@dataclass
class Setup:
    """The training settings the memory model needs, whatever backend the recipe names."""

    backend: str
    sharding: str
    """``data`` (a full copy per device), ``fsdp``, or ``model-parallel`` (``backend.num_partitions`` > 1)."""
    shard_over: int
    """Devices each parameter is split over: all of them for fsdp, num_partitions for a partitioned model,
    else 1."""
    optimizer: str
    beta1: float | None
    precision: str
    gradient_checkpointing: bool
    grad_accum_steps: int
    notes: list[str] = field(default_factory=list)


def training_setup(recipe: RecipeConfig, devices: int) -> Setup:
    """The recipe's ``train`` settings, and what a backend section says instead where it has its own knobs
    (read by name, so that no backend is named here): ``precision`` (float32 / mixed_bfloat16 / auto) or
    ``dtype`` (float32 / bfloat16) for the compute precision, ``num_partitions`` for a model split over
    devices, ``num_microbatches`` for gradient accumulation. Keys a backend does not implement are refused at
    their default by its recipe check, so the ``train`` values hold wherever the backend has no knob of its
    own."""
    train, backend = recipe.train, recipe.backend
    beta1 = train.adafactor.beta1 if train.optimizer == "adafactor" else None
    notes: list[str] = []
    precision = train.precision
    own = getattr(backend, "precision", None) or getattr(backend, "dtype", None)
    if own is not None:
        precision = "float32" if own == "float32" else "bf16"
        if own == "auto":
            notes.append("backend.precision auto is bfloat16 compute on TPU")
    partitions = min(int(getattr(backend, "num_partitions", 1) or 1), devices)
    if partitions > 1:
        sharding, shard_over = "model-parallel", partitions
        notes.append(
            f"backend.num_partitions {partitions}: the backend's partitioner splits the model over "
            f"{partitions} devices; counted like fsdp over that many, an approximation"
        )
    else:
        sharding = train.sharding
        shard_over = devices if sharding == "fsdp" else 1
    accum = getattr(backend, "num_microbatches", None) or train.grad_accum_steps
    return Setup(
        backend.kind,
        sharding,
        shard_over,
        train.optimizer,
        beta1,
        precision,
        recipe.model.gradient_checkpointing,
        accum,
        notes,
    )


def accepts_checkpointing(recipe: RecipeConfig) -> bool:
    """Whether the recipe's backend would take ``model.gradient_checkpointing: true`` (its own recipe check
    says)."""
    trial = recipe.model_copy(
        update={"model": recipe.model.model_copy(update={"gradient_checkpointing": True})}
    )
    return not any(
        path[:2] == ("model", "gradient_checkpointing") for path, _ in trial.backend.recipe_problems(trial)
    )


def optimizer_bytes(spec_plan: fsdp_plan.ParamPlan, optimizer: str, beta1: float | None) -> int:
    """Bytes of optimizer state one device holds for one trainable parameter (see the module docstring)."""
    if optimizer == "adamw":
        return 2 * spec_plan.bytes_per_chip
    local = spec_plan.local_shape
    if len(local) >= 2:  # transformers' Adafactor: factored when ndim >= 2 (row: mean over the last dim)
        rows = model_shapes.numel(local[:-1])
        cols = model_shapes.numel(local[:-2] + local[-1:])
        second = (rows + cols) * FLOAT32
    else:
        second = spec_plan.bytes_per_chip
    return second + (spec_plan.bytes_per_chip if beta1 is not None else 0)


def activation_bytes(
    config: dict[str, Any], source_len: int, target_len: int, precision: str, checkpointing: bool
) -> int:
    """A rough estimate of what the backward pass keeps per example (see the module docstring)."""
    act = 2 if precision == "bf16" else 4
    d, inner, ff, h = (
        config["d_model"],
        config["num_heads"] * config["d_kv"],
        config["d_ff"],
        config["num_heads"],
    )
    k = 4 if model_shapes.is_gated(config) else 2  # wi outputs, activation, (gate product)
    s, t, vocab = source_len, target_len, config["vocab_size"]
    encoder_layer = s * (6 * d + 4 * inner + k * ff) + 2 * h * s * s
    # feed-forward
    decoder_layer = (
        t * (3 * d + 4 * inner)
        + 2 * h * t * t  # self-attention
        + t * (3 * d + 2 * inner)
        + 2 * s * inner
        + 2 * h * t * s  # cross-attention
        + t * (3 * d + k * ff)
    )
    around = 2 * (s + t) * d  # embeddings out, final layer norms
    logits = t * vocab * (act + 4)  # logits + the loss's float32 log-softmax
    if checkpointing:
        kept = config["num_layers"] * s * d + config["num_decoder_layers"] * t * d + s * d
        kept += max(encoder_layer, decoder_layer)
    else:
        kept = config["num_layers"] * encoder_layer + config["num_decoder_layers"] * decoder_layer
    return (kept + around) * act + logits


def encoder_activation_bytes(
    config: dict[str, Any], source_len: int, precision: str, checkpointing: bool
) -> int:
    """The same estimate for a BERT encoder: per layer the projections, the attention scores and
    probabilities, the feed-forward outputs (biases and layer norms kept whole); the pooler and the head are
    negligible."""
    act = 2 if precision == "bf16" else 4
    d, ff, h, s = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_attention_heads"],
        source_len,
    )
    layer = s * (10 * d + 2 * ff) + 2 * h * s * s
    around = 2 * s * d
    if checkpointing:
        kept = config["num_hidden_layers"] * s * d + layer
    else:
        kept = config["num_hidden_layers"] * layer
    return (kept + around) * act


def fsdp_working_set(shapes: dict[str, Shape], trainable: set[str]) -> tuple[int, int]:
    """(elements, of which gathered weights) of the largest unit FSDP has whole at once: one block of a stack,
    or a top-level tensor (the embedding table), gathered, plus the full gradient of its trainable part."""
    units: dict[str, tuple[int, int]] = {}
    for name, shape in shapes.items():
        parts = name.split(".")
        unit = ".".join(parts[:3]) if len(parts) > 3 and parts[1] in ("block", "layer") else name
        weights, grads = units.get(unit, (0, 0))
        size = model_shapes.numel(shape)
        units[unit] = (weights + size, grads + (size if name in trainable else 0))
    weights, grads = max(units.values(), key=lambda wg: (wg[0] + wg[1], wg[0]), default=(0, 0))
    return weights + grads, weights


@dataclass
class MemoryRow:
    what: str
    bytes: int
    how: str


@dataclass
class Summary:
    recipe: str
    backend: str
    model: ModelSource
    modules: list[ModuleRow]
    total_params: int
    trainable_params: int
    accelerator: str
    devices: int
    device_word: str
    """``chip``, or ``core`` on v2/v3."""
    hbm_bytes: int
    """HBM of one device."""
    setup: Setup
    examples_per_device: int
    """Per micro-batch: global batch / devices / grad_accum_steps, rounded up."""
    source_len: int
    target_len: int
    memory: list[MemoryRow]
    plan: fsdp_plan.Plan
    notes: list[str]

    @property
    def total_bytes(self) -> int:
        return sum(row.bytes for row in self.memory)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def margin_bytes(self) -> int:
        """HBM left over (negative: missing)."""
        return self.hbm_bytes - self.total_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "backend": self.backend,
            "model": {"name": self.model.name, "origin": self.model.origin, "config": self.model.config},
            "parameters": {
                "total": self.total_params,
                "trainable": self.trainable_params,
                "modules": [
                    {"module": r.module, "params": r.params, "trainable": r.trainable, "note": r.note}
                    for r in self.modules
                ],
            },
            "accelerator": self.accelerator,
            "devices": self.devices,
            "device": self.device_word,
            "hbm_bytes_per_device": self.hbm_bytes,
            "training": {
                "sharding": self.setup.sharding,
                "shard_over": self.setup.shard_over,
                "optimizer": self.setup.optimizer,
                "adafactor_beta1": self.setup.beta1,
                "precision": self.setup.precision,
                "gradient_checkpointing": self.setup.gradient_checkpointing,
                "grad_accum_steps": self.setup.grad_accum_steps,
                "examples_per_device": self.examples_per_device,
                "source_len": self.source_len,
                "target_len": self.target_len,
            },
            "memory_per_device": {row.what: {"bytes": row.bytes, "how": row.how} for row in self.memory},
            "total_bytes_per_device": self.total_bytes,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "sharding_plan": (
                None
                if self.setup.shard_over == 1
                else {k: v for k, v in self.plan.to_json().items() if k != "specs"}
            ),
            "notes": self.notes,
        }


def summarize(
    recipe: RecipeConfig, accelerator: AcceleratorType, *, slices: int = 1, recipe_dir: Path | None = None
) -> Summary:
    """The summary of ``recipe`` trained on ``slices`` slices of ``accelerator``."""
    source = resolve_model(recipe, recipe_dir)
    config = source.config
    encoder = source.kind == "bert"
    shapes = (
        model_shapes.bert_classifier_shapes(config, config["num_labels"])
        if encoder
        else model_shapes.t5_shapes(config)
    )
    prompt = recipe.model.prompt_tuning
    if prompt is not None:
        shapes[PROMPT_PARAM] = (prompt.tokens, config["d_model"])
    trainable = trainable_names(shapes, list(recipe.model.freeze), prompt is not None)
    modules = (
        module_rows(shapes, trainable, False, ENCODER_MODULES)
        if encoder
        else module_rows(shapes, trainable, config["tie_word_embeddings"])
    )

    per_chip = accelerator.generation.devices_per_chip
    devices = accelerator.chips * slices * per_chip
    setup = training_setup(recipe, devices)
    layout = fsdp_plan.plan(shapes, setup.shard_over, FLOAT32)
    replicas = max(1, devices // setup.shard_over) if setup.sharding == "model-parallel" else devices
    examples = max(1, math.ceil(recipe.train.batch_size / replicas / setup.grad_accum_steps))
    source_len = recipe.data.max_source_length + (prompt.tokens if prompt is not None else 0)
    target_len = 0 if encoder else recipe.data.max_target_length

    total = model_shapes.count(shapes)
    learn = sum(model_shapes.numel(shapes[n]) for n in trainable)
    word = "core" if per_chip > 1 else "chip"
    spread = (
        f"sharded over {setup.shard_over} {word}s" if setup.shard_over > 1 else f"a full copy on every {word}"
    )
    memory = [
        MemoryRow(
            "weights",
            layout.bytes_per_chip,
            f"float32, {fmt_count(total)} parameters, {spread}"
            + (f" ({len(layout.replicated)} small tensors whole)" if setup.shard_over > 1 else ""),
        ),
        MemoryRow(
            "gradients",
            sum(layout.params[n].bytes_per_chip for n in trainable),
            f"float32, the {fmt_count(learn)} trainable parameters",
        ),
        MemoryRow(
            "optimizer",
            sum(optimizer_bytes(layout.params[n], setup.optimizer, setup.beta1) for n in trainable),
            _optimizer_words(setup),
        ),
    ]
    if setup.shard_over > 1:
        elements, gathered = fsdp_working_set(shapes, trainable)
        what = ", and its full gradient" if elements > gathered else " (frozen: no gradient)"
        memory.append(
            MemoryRow(
                "fsdp working set",
                elements * FLOAT32,
                f"estimate: the largest unit ({fmt_count(gathered)} parameters) gathered{what}",
            )
        )
    if encoder:
        act = encoder_activation_bytes(config, source_len, setup.precision, setup.gradient_checkpointing)
    else:
        act = activation_bytes(config, source_len, target_len, setup.precision, setup.gradient_checkpointing)
    tokens = f"{source_len}" if encoder else f"{source_len}+{target_len}"
    memory.append(
        MemoryRow(
            "activations",
            act * examples,
            f"estimate: {examples} x {fmt_bytes(act)} per example ({tokens} tokens, "
            f"{setup.precision}{', gradient checkpointing' if setup.gradient_checkpointing else ''})",
        )
    )
    notes = list(setup.notes)
    if setup.precision == "bf16":
        notes.append("bf16 means bfloat16 compute: weights, gradients and optimizer state stay float32")
    if not setup.gradient_checkpointing and act * examples > sum(row.bytes for row in memory) / 2:
        if accepts_checkpointing(recipe):
            notes.append(
                "model.gradient_checkpointing: true keeps much less activation memory (about 1/3 more "
                "compute)"
            )
    if recipe.model.config is not None and recipe.model.config.tie_word_embeddings is False:
        notes.append(
            "model.config.tie_word_embeddings false: counted with a separate lm_head, as transformers 4 "
            "builds it; transformers 5 builds a fresh T5 tied whatever it says (it only stops rescaling)"
        )
    return Summary(
        recipe=recipe.name,
        backend=setup.backend,
        model=source,
        modules=modules,
        total_params=total,
        trainable_params=learn,
        accelerator=accelerator.name if slices == 1 else f"{slices} x {accelerator.name}",
        devices=devices,
        device_word=word,
        hbm_bytes=accelerator.generation.hbm_bytes_per_device,
        setup=setup,
        examples_per_device=examples,
        source_len=source_len,
        target_len=target_len,
        memory=memory,
        plan=layout,
        notes=notes,
    )


def _optimizer_words(setup: Setup) -> str:
    if setup.optimizer == "adamw":
        return "AdamW: two float32 moments per trainable parameter"
    first = f"a float32 first moment (beta1 {setup.beta1})" if setup.beta1 is not None else "no first moment"
    return f"Adafactor: factored second moment (rows + columns per matrix), {first}"


def fmt_count(n: int) -> str:
    """60.5M, 11.31B: parameter counts as people read them."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.{2 if unit == 'B' else 1}f}{unit}"
    return str(n)


def fmt_bytes(n: float) -> str:
    """1.32 GiB, 512.0 MiB: binary units, as HBM is sold."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for size, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= size:
            return f"{sign}{n // size:.0f} {unit}" if n % size == 0 else f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"
