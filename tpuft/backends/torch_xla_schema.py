"""The PyTorch/XLA backend as the recipe and the run-dir readers know it: its ``backend:`` section, what it
supports of the shared recipe, and its run layout. Pydantic and the stdlib only (the planner is
:mod:`tpuft.backends.torch_xla`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from tpuft.backends.spec import Capabilities, KeyPath, RunLayout
from tpuft.core.config_types import Requirement, StrictModel, Version

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig


class TorchXlaBackend(StrictModel):
    """PyTorch/XLA: one process per worker host, PJRT runtime (TPU on TPU hosts, CPU on the local pod)."""

    kind: Literal["torch_xla"] = "torch_xla"
    torch_version: Version = Field(
        "2.9.0", description="torch and torch-xla are pinned together to this version."
    )
    extra_requirements: list[Requirement] = Field(
        default_factory=list,
        max_length=200,
        description="More pip requirements for the worker venv (pinned, please).",
    )

    def recipe_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        model, data, train = recipe.model, recipe.data, recipe.train
        if model.name_or_path is None and model.config is None:
            found.append(
                (
                    ("model",),
                    "give exactly one of model.name_or_path (pretrained) or model.config (random init)",
                )
            )
        if data.train is None and data.hf is None:
            found.append(
                (
                    ("data", "train"),
                    "required key is missing: training examples, JSON lines (or data.hf, "
                    "a Hugging Face dataset)",
                )
            )
        if data.corpus:
            found.append(
                (
                    ("data", "corpus"),
                    "a pretraining corpus is for the t5x backend's span_corruption task; "
                    "the torch_xla backend trains on data.train (JSON lines) or data.hf",
                )
            )
        has_eval = data.eval is not None or (data.hf is not None and data.hf.eval_split is not None)
        for key, on in (("keep_best", train.keep_best), ("early_stopping", train.early_stopping is not None)):
            if on and not has_eval:
                found.append((("train", key), "needs evaluations: give data.eval (or data.hf.eval_split)"))
        if model.prompt_tuning is not None and model.freeze:
            found.append(
                (("model", "freeze"), "prompt tuning already freezes the whole model; remove model.freeze")
            )
        if set(model.freeze) >= {"embeddings", "encoder", "decoder"}:
            found.append((("model", "freeze"), "that freezes every weight: nothing would train"))
        return found


LAYOUT = RunLayout(
    manifest="manifest.json",
    not_weights=("optimizer.pt", "trainer_state.json", "scheduler.pt", "rng_state.pth"),
)
"""metrics.jsonl; ``checkpoints/step_N`` (HF weights + optimizer + trainer state, then ``manifest.json``)
written by worker 0 through a temp dir; an HF export at the end. A bucket run is written locally on each
worker and mirrored up file by file, so a checkpoint there is complete once every file its manifest lists is
there at its size."""


CAPABILITIES = Capabilities(
    unsupported_generations={
        "tpu7x": "torch_xla 2.9 (the version tpuft installs) reads the TPU's type as vN-SIZE and does not "
        "know tpu7x-SIZE; TPU7x support came after it (pytorch/xla PR 9586)",
    },
    keys=frozenset(
        {
            ("train", "compile_cache"),
            ("data", "hf"),
            ("data", "truncation"),
            ("data", "source_transforms"),
            ("data", "target_transforms"),
            ("data", "preprocess"),
            ("train", "grad_accum_steps"),
            ("train", "precision"),
            ("train", "adafactor"),
            ("train", "label_smoothing"),
            ("train", "sharding"),
            ("train", "early_stopping"),
            ("model", "gradient_checkpointing"),
            ("model", "freeze"),
            ("model", "prompt_tuning"),
            ("eval", "generate_examples"),
        }
    ),
    metrics=frozenset({"exact_match", "token_accuracy", "loss", "bleu", "rouge_l"}),
    why_not={
        "data.label_field": "the PyTorch/XLA trainer fine-tunes text-to-text models, where a label is "
        "the target text (data.target_field or data.target_template: '{label}'); an "
        "encoder's classification head is the keras backend's backend.task: "
        "classification",
        "data.labels": "the PyTorch/XLA trainer fine-tunes text-to-text models, where a label is the "
        "target text as it is written; label names for a classification head are the keras "
        "backend's backend.task: classification",
        "accuracy": "accuracy is a classification head's metric; on text-to-text labels it is exact_match",
    },
)
"""Text-to-text only (no data.label_field/labels); BLEU and ROUGE-L from greedy decodes made on the host."""

SECTION = TorchXlaBackend
