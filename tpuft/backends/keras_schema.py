"""The TF Keras backend as the recipe and the run-dir readers know it: its ``backend:`` section, what it
supports of the shared recipe, and its run layout. Pydantic and the stdlib only (the planner is
:mod:`tpuft.backends.keras`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from tpuft.backends.spec import Capabilities, KeyPath, RunLayout
from tpuft.core.config_types import Requirement, StrictModel

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig

ENCODER_TYPES = (
    "albert",
    "bert",
    "convbert",
    "deberta-v2",
    "distilbert",
    "electra",
    "roberta",
    "xlm-roberta",
)
"""Encoders with a ``TF...ForSequenceClassification`` in transformers 4 that a random-init classifier may
be."""

Precision = Literal["auto", "float32", "mixed_bfloat16"]


class KerasBackend(StrictModel):
    """TF Keras: ``model.fit`` under MultiWorkerMirroredStrategy (CPU pod) or TPUStrategy (TPU)."""

    kind: Literal["keras"] = "keras"
    task: Literal["text2text", "classification"] = Field(
        "text2text",
        description="'text2text': a T5 model maps data's source to target text; 'classification': "
        "a BERT-like encoder predicts one of data.labels from data.label_field.",
    )
    steps_per_execution: Annotated[int, Field(ge=1, le=100_000)] | Literal["auto"] = Field(
        "auto",
        description="Steps Keras runs on the device per call from Python (a TPU must not come back "
        "every step); it must divide train.log_every, eval.every and train.checkpoint_every. "
        "auto: the largest that does, at most 100.",
    )
    precision: Precision = Field(
        "auto",
        description="'mixed_bfloat16' computes in bf16 with float32 weights; auto: it on TPU, float32 on "
        "CPU. "
        "train.precision: bf16 makes it mixed_bfloat16 everywhere (and cannot go with float32 here).",
    )
    encoder: dict[str, str | int | float | bool] | None = Field(
        None,
        description="Classification from random init: the encoder's transformers config, its model_type "
        "first "
        "(e.g. {model_type: bert, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 2, "
        "intermediate_size: 256}); a pretrained encoder is model.name_or_path instead.",
    )
    extra_requirements: list[Requirement] = Field(
        default_factory=list,
        max_length=200,
        description="More pip requirements for the worker venv (pinned, please).",
    )

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        if self.encoder is not None:
            model_type = self.encoder.get("model_type")
            if not isinstance(model_type, str) or not model_type:
                found.append((("encoder", "model_type"), "required: the transformers model type, e.g. bert"))
            elif model_type not in ENCODER_TYPES:
                found.append(
                    (
                        ("encoder", "model_type"),
                        f"{model_type!r} has no TF sequence classifier in "
                        f"transformers 4; one of {', '.join(ENCODER_TYPES)}",
                    )
                )
        return found

    def recipe_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        model, data = recipe.model, recipe.data
        if self.task == "classification":
            sources = [model.name_or_path is not None, self.encoder is not None]
            if model.config is not None:
                found.append(
                    (
                        ("model", "config"),
                        "model.config describes a T5; a classifier from random init is "
                        "backend.encoder (its transformers config, with model_type)",
                    )
                )
            elif sum(sources) != 1:
                found.append(
                    (
                        ("model", "name_or_path"),
                        "give exactly one of model.name_or_path (a pretrained "
                        "encoder) or backend.encoder (random init)",
                    )
                )
        elif self.encoder is not None:
            found.append(
                (
                    ("backend", "encoder"),
                    "for task: classification; a text2text T5 from random init is model.config",
                )
            )
        elif model.name_or_path is None and model.config is None:
            found.append(
                (
                    ("model",),
                    "give exactly one of model.name_or_path (pretrained) or model.config (random init)",
                )
            )
        if data.train is None and data.hf is None:
            found.append((("data", "train"), "required key is missing: training examples, JSON lines"))
        if recipe.eval.metric == "accuracy" and self.task == "text2text":
            found.append(
                (
                    ("eval", "metric"),
                    "accuracy is the classification metric; a text2text run has "
                    "exact_match, token_accuracy and loss",
                )
            )
        if (
            recipe.eval.metric in ("exact_match", "token_accuracy", "bleu", "rouge_l")
            and self.task == "classification"
        ):
            found.append(
                (
                    ("eval", "metric"),
                    f"{recipe.eval.metric} is a text2text metric; a classification run has accuracy and loss",
                )
            )
        elif recipe.eval.generate_examples and self.task == "classification":
            found.append(
                (
                    ("eval", "generate_examples"),
                    "greedy decodes are text2text's (for BLEU and ROUGE-L); a "
                    "classifier's eval has accuracy already",
                )
            )
        if model.prompt_tuning is not None and self.task == "classification":
            found.append(
                (
                    ("model", "prompt_tuning"),
                    "a soft prompt goes before a T5 encoder's input (task: "
                    "text2text); a classifier trains its head and encoder",
                )
            )
        if data.corpus:
            found.append(
                (
                    ("data", "corpus"),
                    "a pretraining corpus is for the t5x backend's span_corruption task; "
                    "the keras backend trains on data.train (JSON lines)",
                )
            )
        if self.task == "classification":
            if data.label_field is None:
                found.append(
                    (
                        ("data", "label_field"),
                        "required for backend.task: classification (the JSON field "
                        "holding each example's label)",
                    )
                )
            if not data.labels:
                found.append(
                    (
                        ("data", "labels"),
                        "required for backend.task: classification: the label names, in "
                        "class-id order (an integer label in the data indexes this list)",
                    )
                )
            if data.target_template is not None:
                found.append(
                    (
                        ("data", "target_template"),
                        "a classification target is data.label_field; remove target_template",
                    )
                )
        elif data.label_field is not None or data.labels:
            key = "label_field" if data.label_field is not None else "labels"
            found.append(
                (
                    ("data", key),
                    "for backend.task: classification; a text2text target is data.target_field "
                    "(or target_template)",
                )
            )
        found += self._train_key_problems(recipe)
        every = [("train", "log_every", recipe.train.log_every)]
        if recipe.eval.every:
            every.append(("eval", "every", recipe.eval.every))
        if recipe.train.checkpoint_every:
            every.append(("train", "checkpoint_every", recipe.train.checkpoint_every))
        if isinstance(self.steps_per_execution, int):
            for section, key, value in every:
                if value % self.steps_per_execution:
                    found.append(
                        (
                            (section, key),
                            f"{value} is not a multiple of backend.steps_per_execution "
                            f"({self.steps_per_execution}): Keras only comes back to Python between "
                            "executions",
                        )
                    )
        return found

    def _train_key_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        """The shared training keys as the Keras engine does them (``tpuft/worker/keras/layers.py``)."""
        found: list[tuple[KeyPath, str]] = []
        if recipe.train.precision == "bf16" and self.precision == "float32":
            found.append(
                (
                    ("backend", "precision"),
                    "float32 contradicts train.precision: bf16; remove one (bf16 is "
                    "the mixed_bfloat16 policy: bfloat16 compute, float32 weights)",
                )
            )
        if self.task == "classification":
            if "decoder" in recipe.model.freeze:
                found.append(
                    (
                        ("model", "freeze"),
                        "a classifier is an encoder: it has embeddings and encoder, no decoder",
                    )
                )
            if recipe.model.gradient_checkpointing:
                found.append(
                    (
                        ("model", "gradient_checkpointing"),
                        "the keras backend recomputes T5 blocks; a "
                        "classifier's encoder layers are not wrapped (task: text2text has it)",
                    )
                )
        return found

    def policy(self, train_precision: str, *, tpu: bool) -> str:
        """The Keras mixed-precision policy: the shared ``train.precision: bf16`` is ``mixed_bfloat16`` on
        every device (the CPU pod too, to rehearse it); its default (float32) leaves this section's
        ``precision`` in charge, whose ``auto`` is Keras's TPU habit, bf16 compute on a TPU. The one
        contradiction, bf16 with ``float32`` here, is refused by :meth:`recipe_problems`."""
        if train_precision == "bf16":
            return "mixed_bfloat16"
        if self.precision == "auto":
            return "mixed_bfloat16" if tpu else "float32"
        return self.precision

    def steps_per_call(self, recipe: RecipeConfig) -> int:
        """``steps_per_execution`` as run: the user's, or the largest divisor (at most 100) of every interval
        at which the trainer must act between steps."""
        if isinstance(self.steps_per_execution, int):
            return self.steps_per_execution
        intervals = [recipe.train.log_every, recipe.eval.every or 0, recipe.train.checkpoint_every or 0]
        common = 0
        for value in intervals:
            common = math.gcd(common, value)
        return max(d for d in range(1, min(common, 100) + 1) if common % d == 0)


LAYOUT = RunLayout(manifest="manifest.json", not_weights=("optimizer.npz", "trainer_state.json"))
"""metrics.jsonl; ``checkpoints/step_N`` written by the chief through a temp dir: the HF model
(``tf_model.h5``, which tpuft's converter reads), the optimizer's variables and ``trainer_state.json``, then
``manifest.json``; the best one by the eval metric is kept besides the last ``train.keep_checkpoints``; an HF
(PyTorch) export at the end."""


CAPABILITIES = Capabilities(
    unsupported_generations={
        "tpu7x": 'TensorFlow has no TPU7x support (docs.cloud.google.com/tpu/docs/tpu7x: "You can use the '
        'JAX and PyTorch frameworks on TPU7x. TensorFlow is not supported.")',
    },
    keys=frozenset(
        {
            ("data", "truncation"),
            ("data", "source_transforms"),
            ("data", "target_transforms"),
            ("data", "preprocess"),
            ("data", "label_field"),
            ("data", "labels"),
            ("train", "early_stopping"),
            ("train", "grad_accum_steps"),
            ("data", "hf"),
            ("eval", "generate_examples"),
            ("model", "prompt_tuning"),
            ("train", "precision"),
            ("train", "label_smoothing"),
            ("train", "adafactor"),
            ("model", "freeze"),
            ("model", "gradient_checkpointing"),
        }
    ),
    metrics=frozenset({"exact_match", "token_accuracy", "loss", "accuracy", "bleu", "rouge_l"}),
    why_not={
        "train.compile_cache": "TensorFlow keeps a TPUStrategy's compiled programs in the process only (no "
        "persistent cache across trainer processes, as JAX's and torch_xla's are), so there is nothing to "
        "turn on or off",
        "train.sharding": "fsdp shards parameters over the chips, and TF Keras's TPUStrategy and "
        "MultiWorkerMirroredStrategy only replicate them (data parallelism is what the keras backend does)",
    },
)
"""Text-to-text and classification (data.label_field/labels); BLEU and ROUGE-L from greedy decodes made on the
device (text to text)."""

SECTION = KerasBackend
