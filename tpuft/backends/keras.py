"""TF Keras: Hugging Face's TensorFlow models trained with ``model.fit`` under a ``tf.distribute`` strategy.

Two model kinds, the two that ../shared/seeds/000 trains: T5 as text-to-text (``TFT5ForConditionalGeneration``) and
BERT-like encoders for sequence classification (``TFAutoModelForSequenceClassification``).

Where the TF program runs:

* Local CPU pod: every worker runs the same trainer under ``MultiWorkerMirroredStrategy``; ``TF_CONFIG`` is built
  from the launched workers' addresses (``TPUFT_PEERS``), so the rehearsal is a real multi-worker Keras run with
  gradients all-reduced over gRPC.
* TPU VM: TensorFlow drives every chip of a slice from one Python program. A single-host slice runs it on its host
  (``TPUClusterResolver(tpu="local")``); on a pod slice it runs on worker 0 and the other hosts serve the TPU
  runtime (started by the ``-pod`` runtime image), so those hosts need no venv and run no trainer: ``setup``
  installs on worker 0 only, and ``monitor`` shows one trainer. Input pipelines and checkpoints are then executed on
  remote hosts, which cannot read worker 0's disk: a pod-slice run's data goes to the run's bucket as TFRecords
  (the trainer writes them there and says so) and the run dir must be ``gs://`` (a cluster with a ``bucket``).

Pins (why these): TensorFlow 2.20 is the last release with a ``tensorflow-tpu`` wheel (2.21 has none), so the CPU pod
uses ``tensorflow-cpu`` of the same version and a recipe rehearsed on CPU runs the same TF on a TPU. ``tf-keras`` must
have TensorFlow's minor version (Keras 2 as a package; Keras 3 cannot run transformers' TF models), selected by
``TF_USE_LEGACY_KERAS=1``. transformers 5 removed TensorFlow, so it is the last 4.x (4.57). The TPU runtime image to
create the node with is ``tpu-vm-tf-2.20.0-pjrt`` (``-pod-pjrt`` for a pod slice): libtpu must match TensorFlow.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

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
    weight_digest_summary,
)
from tpuft.config_types import Requirement, StrictModel

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.runs import RunSnapshot

TF_VERSION = "2.20.0"
TF_KERAS_VERSION = "2.20.1"
TRANSFORMERS_VERSION = "4.57.6"
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
"""Where ``tensorflow-tpu``'s ``libtpu`` wheels are published (not on PyPI)."""
TPU_RUNTIME = {False: f"tpu-vm-tf-{TF_VERSION}-pjrt", True: f"tpu-vm-tf-{TF_VERSION}-pod-pjrt"}
"""The TPU software version to create the node with, single-host / pod slice."""

_COMMON = (
    f"transformers=={TRANSFORMERS_VERSION}",
    "h5py>=3.10",
    "safetensors>=0.4",
    "sentencepiece>=0.2",
    "tensorboard>=2.15",
    "numpy>=1.26,<2.3",
    "pydantic>=2.6",
    "pyyaml>=6",
    "google-cloud-storage>=2.14",  # a run dir in a bucket is mirrored from the worker (tpuft/storage/sync.py)
)

ENCODER_TYPES = ("albert", "bert", "convbert", "deberta-v2", "distilbert", "electra", "roberta", "xlm-roberta")
"""Encoders with a ``TF...ForSequenceClassification`` in transformers 4 that a random-init classifier may be."""

Precision = Literal["auto", "float32", "mixed_bfloat16"]


class KerasBackend(StrictModel):
    """TF Keras: ``model.fit`` under MultiWorkerMirroredStrategy (CPU pod) or TPUStrategy (TPU)."""

    kind: Literal["keras"] = "keras"
    task: Literal["text2text", "classification"] = Field(
        "text2text",
        description="'text2text': a T5 model maps data's source to target text; 'classification': a BERT-like "
        "encoder predicts one of data.labels from data.label_field.",
    )
    steps_per_execution: Annotated[int, Field(ge=1, le=100_000)] | Literal["auto"] = Field(
        "auto",
        description="Steps Keras runs on the device per call from Python (a TPU must not come back every step); "
        "it must divide train.log_every, eval.every and train.checkpoint_every. auto: the largest that does, "
        "at most 100.",
    )
    precision: Precision = Field(
        "auto", description="'mixed_bfloat16' computes in bf16 with float32 weights; auto: it on TPU, float32 on CPU."
    )
    encoder: dict[str, str | int | float | bool] | None = Field(
        None,
        description="Classification from random init: the encoder's transformers config, its model_type first "
        "(e.g. {model_type: bert, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 2, "
        "intermediate_size: 256}); a pretrained encoder is model.name_or_path instead.",
    )
    extra_requirements: list[Requirement] = Field(
        default_factory=list, max_length=200, description="More pip requirements for the worker venv (pinned, please)."
    )

    def cross_problems(self) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        if self.encoder is not None:
            model_type = self.encoder.get("model_type")
            if not isinstance(model_type, str) or not model_type:
                found.append((("encoder", "model_type"), "required: the transformers model type, e.g. bert"))
            elif model_type not in ENCODER_TYPES:
                found.append((("encoder", "model_type"), f"{model_type!r} has no TF sequence classifier in "
                              f"transformers 4; one of {', '.join(ENCODER_TYPES)}"))
        return found

    def recipe_problems(self, recipe: RecipeConfig) -> list[tuple[KeyPath, str]]:
        found: list[tuple[KeyPath, str]] = []
        model, data = recipe.model, recipe.data
        if self.task == "classification":
            sources = [model.name_or_path is not None, self.encoder is not None]
            if model.config is not None:
                found.append((("model", "config"), "model.config describes a T5; a classifier from random init is "
                              "backend.encoder (its transformers config, with model_type)"))
            elif sum(sources) != 1:
                found.append((("model", "name_or_path"), "give exactly one of model.name_or_path (a pretrained "
                              "encoder) or backend.encoder (random init)"))
        elif self.encoder is not None:
            found.append((("backend", "encoder"), "for task: classification; a text2text T5 from random init is "
                          "model.config"))
        elif model.name_or_path is None and model.config is None:
            found.append((("model",), "give exactly one of model.name_or_path (pretrained) or model.config (random init)"))
        if data.train is None and data.hf is None:
            found.append((("data", "train"), "required key is missing: training examples, JSON lines"))
        found += unsupported(recipe, "keras", *PYTORCH_XLA_KEYS) + text_metric_problems(recipe, "keras")
        if recipe.eval.metric == "accuracy" and self.task == "text2text":
            found.append((("eval", "metric"), "accuracy is the classification metric; a text2text run has "
                          "exact_match, token_accuracy and loss"))
        if recipe.eval.metric in ("exact_match", "token_accuracy") and self.task == "classification":
            found.append((("eval", "metric"), f"{recipe.eval.metric} is a text2text metric; a classification run "
                          "has accuracy and loss"))
        if data.corpus:
            found.append((("data", "corpus"), "a pretraining corpus is for the t5x backend's span_corruption task; "
                          "the keras backend trains on data.train (JSON lines)"))
        if self.task == "classification":
            if data.label_field is None:
                found.append((("data", "label_field"), "required for backend.task: classification (the JSON field "
                              "holding each example's label)"))
            if not data.labels:
                found.append((("data", "labels"), "required for backend.task: classification: the label names, in "
                              "class-id order (an integer label in the data indexes this list)"))
            if data.target_template is not None:
                found.append((("data", "target_template"), "a classification target is data.label_field; "
                              "remove target_template"))
        elif data.label_field is not None or data.labels:
            key = "label_field" if data.label_field is not None else "labels"
            found.append((("data", key), "for backend.task: classification; a text2text target is data.target_field "
                          "(or target_template)"))
        every = [("train", "log_every", recipe.train.log_every)]
        if recipe.eval.every:
            every.append(("eval", "every", recipe.eval.every))
        if recipe.train.checkpoint_every:
            every.append(("train", "checkpoint_every", recipe.train.checkpoint_every))
        if isinstance(self.steps_per_execution, int):
            for section, key, value in every:
                if value % self.steps_per_execution:
                    found.append(((section, key), f"{value} is not a multiple of backend.steps_per_execution "
                                  f"({self.steps_per_execution}): Keras only comes back to Python between executions"))
        return found

    def steps_per_call(self, recipe: RecipeConfig) -> int:
        """``steps_per_execution`` as run: the user's, or the largest divisor (at most 100) of every interval at
        which the trainer must act between steps."""
        if isinstance(self.steps_per_execution, int):
            return self.steps_per_execution
        intervals = [recipe.train.log_every, recipe.eval.every or 0, recipe.train.checkpoint_every or 0]
        common = 0
        for value in intervals:
            common = math.gcd(common, value)
        return max(d for d in range(1, min(common, 100) + 1) if common % d == 0)


LAYOUT = RunLayout(manifest="manifest.json")
"""metrics.jsonl; ``checkpoints/step_N`` written by the chief through a temp dir: the HF model (``tf_model.h5``,
which tpuft's converter reads), the optimizer's variables and ``trainer_state.json``, then ``manifest.json``; the
best one by the eval metric is kept besides the last ``train.keep_checkpoints``; an HF (PyTorch) export at the end."""


class Keras:
    kind = "keras"
    config_model = KerasBackend
    layout = LAYOUT

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, KerasBackend)
        if target == "tpu":
            tensorflow, pip_args = f"tensorflow-tpu=={TF_VERSION}", ("-f", LIBTPU_INDEX)
        else:
            tensorflow, pip_args = f"tensorflow-cpu=={TF_VERSION}", ()
        requirements = (tensorflow, *_COMMON, *backend_config.extra_requirements)
        # tf-keras names ``tensorflow`` itself, which would install the full (GPU) wheel over tensorflow-cpu/-tpu
        no_deps = (f"tf-keras=={TF_KERAS_VERSION}",)
        return EnvSpec(kind=self.kind, requirements=requirements, python=python, pip_args=pip_args, no_deps=no_deps)

    @staticmethod
    def replicas(shape: ClusterShape) -> int:
        """Data-parallel copies: every TPU device of the slice (one program drives them all: a v3-8 has 8), one per
        worker on the CPU pod."""
        return shape.chips * shape.devices_per_chip if shape.target == "tpu" else shape.hosts

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        replicas = self.replicas(shape)
        found: list[tuple[KeyPath, str]] = []
        for section, key in (("train", "batch_size"), ("eval", "batch_size")):
            batch = getattr(getattr(recipe, section), key)
            if batch % replicas:
                what = f"{replicas} TPU cores" if shape.target == "tpu" else f"{replicas} workers"
                found.append(((section, key), f"{batch} does not split evenly over {what} (use a multiple of "
                              f"{replicas}, e.g. {max(replicas, batch // replicas * replicas)})"))
        return found

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false"}
        if shape.target == "tpu":
            env["TPUFT_TPU_HOSTS"] = str(shape.hosts)
            return LaunchPlan(workers=(0,), env=env)  # one program drives every host of the slice
        return LaunchPlan(workers=tuple(range(shape.hosts)), env=env)

    def summarize(self, snapshot: RunSnapshot, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        return weight_digest_summary(snapshot, launched)


BACKEND = Keras()
