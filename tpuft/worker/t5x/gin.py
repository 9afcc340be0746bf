"""What a T5X run is told: the seqio task spec, ``run_dir/t5x/tasks.py`` and the run gin, from the recipe
alone.

Pure functions of the recipe and the run id, kept apart from the trainer's process state so that a test can
parse the gin with gin itself, as ``t5x.train`` does, without training (tests/worker/test_t5x_parts.py). The
traps they handle (absolute ``TRAIN_STEPS``, the schedule's offset, ``USE_CACHED_TASKS``, the loss normalising
factor, short-form overrides under dynamic registration) are described in :mod:`tpuft.worker.t5x.train`.
"""

from __future__ import annotations

import pprint
import re
from pathlib import Path
from typing import Any

from tpuft.backends.t5x_schema import (
    PRETRAINING_LOSS_FACTOR,
    checkpoint_step,
    gin_value,
    microbatches,
    model_gins,
)
from tpuft.config import RecipeConfig
from tpuft.worker.hf_data import has_held_out
from tpuft.worker.t5x import keys as t5x_keys
from tpuft.worker.t5x.data import finetune_spec
from tpuft.worker.t5x.multislice import mesh_bindings


def task_spec(run_id: str, recipe: RecipeConfig) -> dict[str, Any]:
    """The plain spec ``run_dir/t5x/task.json`` holds and ``tasks.py`` registers with seqio."""
    from tpuft.worker.t5x.tasks import DEFAULT_VOCABULARIES

    backend, data = recipe.backend, recipe.data
    if backend.vocabulary is not None:
        vocab, extra_ids = backend.vocabulary, backend.extra_ids
    else:
        vocab, default_extra = DEFAULT_VOCABULARIES[backend.family or "byt5"]
        extra_ids = default_extra if backend.family != "byt5" else backend.extra_ids
    spec: dict[str, Any] = {
        "name": task_name(run_id),
        "task": backend.task,
        "vocabulary": vocab,
        "extra_ids": extra_ids,
    }
    if backend.task == "span_corruption":
        spec.update(
            corpus=list(data.corpus),
            inputs_length=data.max_source_length,
            noise_density=backend.noise_density,
            mean_noise_span_length=backend.mean_noise_span_length,
        )
    else:
        spec.update(finetune_spec(recipe))  # the data section as it is (tpuft/worker/t5x/data.py)
    return spec


def task_name(run_id: str) -> str:
    return "tpuft_" + re.sub(r"[^A-Za-z0-9_]", "_", run_id)


def initial_step(recipe: RecipeConfig) -> int:
    backend = recipe.backend
    if backend.initial_checkpoint is None:
        return 0
    if backend.initial_step is not None:
        return backend.initial_step
    return checkpoint_step(backend.initial_checkpoint) or 0


def tasks_module(spec: dict[str, Any]) -> str:
    return (
        '"""The seqio task of this tpuft run (generated from its recipe; see '
        'tpuft/worker/t5x/tasks.py)."""\n\n'
        "from tpuft.worker.t5x.tasks import register\n\n"
        f"TASK = register({pprint.pformat(spec, indent=4, sort_dicts=True)})\n"
    )


def learning_rate_bindings(recipe: RecipeConfig, initial: int) -> dict[str, Any]:
    """tpuft's schedule over this run's steps as T5X's ``create_learning_rate_scheduler`` factors, offset by
    the initial checkpoint's step (T5X's step is absolute)."""
    train = recipe.train
    peak, warmup, steps = train.learning_rate, train.warmup_steps, train.steps
    prefix = "utils.create_learning_rate_scheduler"
    relative = t5x_keys.relative_step_schedule(train.adafactor, initial)
    if relative is not None:  # Adafactor's own rate replaces the recipe's schedule, as in transformers
        return {f"{prefix}.{key}": value for key, value in relative.items()}
    if train.schedule == "linear":
        warm = max(warmup, 1)
        bindings = {
            "factors": "linear_decay",
            "base_learning_rate": peak,
            "warmup_steps": warm,
            "decay_factor": 1.0 / max(steps - warm, 1),
        }
    elif (
        train.schedule == "cosine"
    ):  # T5X's cosine factor decays from the end of the warm-up to the last step
        bindings = {
            "factors": "constant * linear_warmup * cosine_decay" if warmup else "constant * cosine_decay",
            "base_learning_rate": peak,
            "warmup_steps": max(warmup, 1),
            "steps_per_cycle": max(steps - warmup, 1),
        }
    elif train.schedule == "inverse_sqrt":
        bindings = {
            "factors": "constant * rsqrt_normalized_decay",
            "base_learning_rate": peak,
            "warmup_steps": max(warmup, 1),
        }
    else:
        bindings = {
            "factors": "constant * linear_warmup" if warmup else "constant",
            "base_learning_rate": peak,
            "warmup_steps": max(warmup, 1),
        }
    bindings["step_offset"] = initial
    return {f"{prefix}.{key}": value for key, value in bindings.items()}


def run_gin(
    recipe: RecipeConfig,
    spec: dict[str, Any],
    *,
    model_dir: str,
    initial_step: int,
    cpu: bool,
    resumed_at: int = 0,
    slices: int = 1,
    devices: int = 0,
) -> str:
    """The run's gin: the model gin(s), T5X's fine-tuning run gin, then every binding the recipe implies, then
    the user's ``gin_overrides`` (last, so they win). ``slices`` > 1: a Multislice run over ``devices`` in
    all, the slices as the mesh's outer ``replica`` axis (:func:`tpuft.worker.t5x.multislice.mesh_bindings`).

    The training data's shuffle seed is ``train.seed`` (T5X's default draws a new one from the clock), plus
    the step a resumed run starts at: T5X does not checkpoint a seqio pipeline's position, so a resumed run
    reads the data in a new order (rather than again from the start of the same one) that is still
    reproducible."""
    backend, train, data, evaluation = recipe.backend, recipe.train, recipe.data, recipe.eval
    includes = list(backend.gin_files) or list(model_gins(backend.family, backend.size) or ())
    has_eval = backend.task == "finetune" and has_held_out(data, "eval")
    inputs_length = data.max_source_length
    targets_length = data.max_target_length
    if backend.task == "span_corruption":
        from tpuft.worker.t5x.tasks import random_spans_helper

        needed = random_spans_helper(inputs_length, backend.noise_density, backend.mean_noise_span_length)[1]
        targets_length = max(targets_length, needed)
    if backend.loss_normalizing_factor == "auto":
        factor = None
        if (
            backend.initial_checkpoint is not None
            and backend.task == "finetune"
            and backend.family is not None
        ):
            factor = PRETRAINING_LOSS_FACTOR.get(backend.family)
    else:
        factor = backend.loss_normalizing_factor
    vocab = spec["vocabulary"]
    if vocab == "byt5":
        vocabulary = {"seqio.ByteVocabulary.extra_ids": spec["extra_ids"]}
    else:
        vocabulary = {
            "seqio.SentencePieceVocabulary.sentencepiece_model_file": vocab,
            "seqio.SentencePieceVocabulary.extra_ids": spec["extra_ids"],
        }
    binds: dict[str, Any] = {
        "MODEL_DIR": model_dir,
        "MIXTURE_OR_TASK_NAME": spec["name"],
        "TASK_FEATURE_LENGTHS": {"inputs": inputs_length, "targets": targets_length},
        "TRAIN_STEPS": initial_step + train.steps,
        "INITIAL_CHECKPOINT_PATH": backend.initial_checkpoint,
        "USE_CACHED_TASKS": False,
        "BATCH_SIZE": train.batch_size,
        "RANDOM_SEED": train.seed,
        "train/utils.DatasetConfig.seed": train.seed + resumed_at,
        "LOSS_NORMALIZING_FACTOR": factor,
        "EVAL_PERIOD": evaluation.every or train.steps,
        "EVALUATOR_NUM_EXAMPLES": evaluation.max_examples,
        "train_script.train.stats_period": train.log_every,
        "utils.SaveCheckpointConfig.period": train.checkpoint_every or train.steps,
        "utils.SaveCheckpointConfig.keep": None,  # tpuft prunes: the last ones and the best
        "trainer.Trainer.num_microbatches": microbatches(recipe),
        "partitioning.PjitPartitioner.num_partitions": backend.num_partitions,
        **mesh_bindings(slices, devices, backend.num_partitions),
        "network.T5Config.dtype": t5x_keys.network_dtype(recipe, cpu),
        "seqio.Evaluator.logger_cls": ["@seqio.PyLoggingLogger", "@t5x_hooks.EvalLogger"],
        "infer_eval/utils.DatasetConfig.batch_size": evaluation.batch_size,
        "EVAL_STEPS": -(-evaluation.max_examples // train.batch_size) if evaluation.max_examples else 20,
    }
    if recipe.model.dropout is not None:
        binds["DROPOUT_RATE"] = recipe.model.dropout
    if train.weight_decay:
        binds["adafactor.Adafactor.weight_decay_rate"] = train.weight_decay
    if train.max_grad_norm is not None:
        binds["adafactor.Adafactor.global_norm_clip_threshold"] = train.max_grad_norm
    if not has_eval:
        binds["train_script.train.train_eval_dataset_cfg"] = None
        binds["train_script.train.infer_eval_dataset_cfg"] = None
    binds.update(learning_rate_bindings(recipe, initial_step))
    network = network_module(backend.family, [_read_text(path) for path in backend.gin_files])
    binds.update(t5x_keys.key_bindings(recipe, initial_step=initial_step, network=network))
    if network is None:
        # the user's gin names its own network module: dtype is theirs to bind
        binds.pop("network.T5Config.dtype")
    imports = {**GIN_IMPORTS, **t5x_keys.GIN_IMPORTS}
    if network is not None:
        imports["network"] = network
    lines = [
        "# Generated by tpuft for this run from its recipe; T5X reads it as --gin_file.",
        "from __gin__ import dynamic_registration",
        "import __main__ as train_script",
        "import seqio",
        *(import_line(name, module) for name, module in imports.items() if name != "seqio"),
        "",
    ]
    lines += [f"include {path!r}" for path in includes]
    lines += ["include 't5x/configs/runs/finetune.gin'", ""]
    lines += [f"VOCABULARY = @{next(iter(vocabulary)).rsplit('.', 1)[0]}()"]
    lines += [f"{name} = {gin_value(value)}" for name, value in vocabulary.items()]
    lines += [f"{name} = {gin_value(value)}" for name, value in binds.items()]
    if backend.gin_overrides:
        lines += ["", "# backend.gin_overrides"]
        lines += [
            f"{qualify(name, imports)} = {gin_value(value)}" for name, value in backend.gin_overrides.items()
        ]
    return "\n".join(lines) + "\n"


GIN_IMPORTS = {
    "seqio": "seqio",
    "adafactor": "t5x.adafactor",
    "models": "t5x.models",
    "partitioning": "t5x.partitioning",
    "trainer": "t5x.trainer",
    "utils": "t5x.utils",
    "t5x_hooks": "tpuft.worker.t5x.hooks",
}
"""Modules the run gin imports (gin's dynamic registration needs every configurable's module imported)."""


def import_line(name: str, module: str) -> str:
    """The gin import that makes ``module`` known as ``name`` (``from tpuft.worker.t5x import hooks as
    t5x_hooks``): the bindings name modules by their short names, which since the rooms (worker/t5x/) are not
    always the module's own."""
    parent, _, last = module.rpartition(".")
    return f"from {parent} import {last}" + (f" as {name}" if name != last else "")


def network_module(family: str | None, user_gins: list[str]) -> str | None:
    """The module whose ``T5Config`` the model gin configures: t5x's T5 network for t5_1_0/t5_1_1/mt5/byt5,
    the scalable one for umt5, or whatever the user's gin imports as ``network``."""
    if family == "umt5":
        return "t5x.examples.scalable_t5.network"
    if family is not None:
        return "t5x.examples.t5.network"
    for text in user_gins:
        match = re.search(r"^from\s+([\w.]+)\s+import\s+network\s*$", text, re.MULTILINE)
        if match:
            return f"{match.group(1)}.network"
    return None


def qualify(binding: str, imports: dict[str, str]) -> str:
    """``PjitPartitioner.num_partitions`` -> ``partitioning.PjitPartitioner.num_partitions``: under dynamic
    registration a binding names its module; the short form users copy from T5X's docs is given the imported
    module that has that name."""
    scope, _, name = binding.rpartition("/")
    head = name.split(".", 1)[0]
    if head in imports or "." not in name or head.isupper():
        return binding
    import importlib

    for alias, module in imports.items():
        try:
            if hasattr(importlib.import_module(module), head):
                return f"{scope + '/' if scope else ''}{alias}.{name}"
        except ImportError:
            continue
    return binding


def _read_text(path: str) -> str:
    if path.startswith("gs://"):
        import tensorflow as tf

        with tf.io.gfile.GFile(path) as handle:
            return handle.read()
    return Path(path).read_text(encoding="utf-8")
