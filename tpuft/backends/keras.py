"""TF Keras: Hugging Face's TensorFlow models trained with ``model.fit`` under a ``tf.distribute`` strategy.

Two model kinds, the two that ../shared/seeds/000 trains: T5 as text-to-text
(``TFT5ForConditionalGeneration``) and BERT-like encoders for sequence classification
(``TFAutoModelForSequenceClassification``).

Where the TF program runs:

* Local CPU pod: every worker runs the same trainer under ``MultiWorkerMirroredStrategy``; ``TF_CONFIG`` is
  built from the launched workers' addresses (``TPUFT_PEERS``), so the rehearsal is a real multi-worker Keras
  run with gradients all-reduced over gRPC. Each worker splits its CPU into ``local.devices_per_worker``
  logical devices (``TPUFT_LOCAL_DEVICES``), every one a replica, so the run has the slice's replica count and
  per-replica batch (``tpuft/worker/keras/devices.py``: MultiWorkerMirroredStrategy alone would take one CPU
  device per worker). What it does not rehearse: on a slice one program drives every host (one input pipeline
  per host, the data in the bucket); on the CPU pod every worker runs its own program on its own shard.
* TPU VM: TensorFlow drives every chip of a slice from one Python program. A single-host slice runs it on its
  host (``TPUClusterResolver(tpu="local")``); on a pod slice it runs on worker 0 and the other hosts serve the
  TPU runtime (started by the ``-pod`` runtime image), so those hosts need no venv and run no trainer:
  ``setup`` installs on worker 0 only, and ``monitor`` shows one trainer. Input pipelines and checkpoints are
  then executed on remote hosts, which cannot read worker 0's disk: a pod-slice run's data goes to the run's
  bucket as TFRecords (the trainer writes them there and says so) and the run dir must be ``gs://`` (a cluster
  with a ``bucket``).
* Several slices (``gcp.slices`` / ``local.slices`` > 1): refused in :meth:`Keras.check`. TensorFlow has no
  Multislice runtime (JAX and PyTorch/XLA join slices over the data-centre network; TF's TPU strategy spans
  one).

Pins (why these): TensorFlow 2.20 is the last release with a ``tensorflow-tpu`` wheel (2.21 has none), so the
CPU pod uses ``tensorflow-cpu`` of the same version and a recipe rehearsed on CPU runs the same TF on a TPU.
``tf-keras`` must have TensorFlow's minor version (Keras 2 as a package; Keras 3 cannot run transformers' TF
models), selected by ``TF_USE_LEGACY_KERAS=1``. transformers 5 removed TensorFlow, so it is the last 4.x
(4.57), and ``datasets`` the newest that installs beside it. The TPU runtime image to
create the node with is ``tpu-vm-tf-2.20.0-pjrt`` (``-pod-pjrt`` for a pod slice): libtpu must match
TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuft.backends.base import (
    ClusterShape,
    EnvSpec,
    KeyPath,
    LaunchPlan,
    Target,
    local_replicas,
    weight_digest_summary,
)
from tpuft.backends.keras_schema import CAPABILITIES, ENCODER_TYPES, LAYOUT, KerasBackend, Precision
from tpuft.backends.spec import LOCAL_DEVICES_ENV, RunOutcome

if TYPE_CHECKING:
    from tpuft.config.recipe import RecipeConfig

__all__ = ["BACKEND", "CAPABILITIES", "ENCODER_TYPES", "LAYOUT", "Keras", "KerasBackend", "Precision"]

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
    # data.hf (tpuft/worker/hf_data.py, streamed into the TFRecords): 5.0.1 is the newest datasets pip
    # resolves beside transformers 4.57 (huggingface-hub < 1.0)
    "datasets==5.0.1",
    "gcsfs>=2024.2",  # data.hf.data_files on gs://, read by datasets through fsspec
)


class Keras:
    kind = "keras"
    config_model = KerasBackend
    layout = LAYOUT
    capabilities = CAPABILITIES

    def env_spec(self, backend_config: object, target: Target, python: str) -> EnvSpec:
        assert isinstance(backend_config, KerasBackend)
        if target == "tpu":
            tensorflow, pip_args = f"tensorflow-tpu=={TF_VERSION}", ("-f", LIBTPU_INDEX)
        else:
            tensorflow, pip_args = f"tensorflow-cpu=={TF_VERSION}", ()
        requirements = (tensorflow, *_COMMON, *backend_config.extra_requirements)
        # tf-keras names ``tensorflow`` itself, which would install the full (GPU) wheel over
        # tensorflow-cpu/-tpu
        no_deps = (f"tf-keras=={TF_KERAS_VERSION}",)
        return EnvSpec(
            kind=self.kind, requirements=requirements, python=python, pip_args=pip_args, no_deps=no_deps
        )

    @staticmethod
    def replicas(shape: ClusterShape) -> int:
        """Data-parallel copies: every TPU device of the slice (one program drives them all: a v3-8 has 8),
        every logical CPU device of every worker on the CPU pod."""
        return (
            shape.chips * shape.devices_per_chip
            if shape.target == "tpu"
            else shape.hosts * shape.local_devices
        )

    def check(self, recipe: RecipeConfig, shape: ClusterShape) -> list[tuple[KeyPath, str]]:
        """Each replica's train batch splits into ``train.grad_accum_steps`` equal micro-batches (static
        shapes); one slice only (TensorFlow has no Multislice runtime)."""
        if shape.slices > 1:
            return [
                (
                    ("backend", "kind"),
                    f"keras cannot train on {shape.slices} slices: TensorFlow has no Multislice runtime "
                    "(nothing joins TPU slices over the data-centre network, as JAX and "
                    "PyTorch/XLA do); use one slice, or backend kind t5x or torch_xla",
                )
            ]
        replicas, accum = self.replicas(shape), recipe.train.grad_accum_steps
        what = f"{replicas} TPU cores" if shape.target == "tpu" else local_replicas(shape, replicas)
        found: list[tuple[KeyPath, str]] = []
        for section, key, unit in (
            ("train", "batch_size", replicas * accum),
            ("eval", "batch_size", replicas),
        ):
            batch = getattr(getattr(recipe, section), key)
            if batch % unit:
                split = f"{what} x {accum} accumulation steps" if unit != replicas else what
                found.append(
                    (
                        (section, key),
                        f"{batch} does not split evenly over {split} (use a multiple of "
                        f"{unit}, e.g. {max(unit, batch // unit * unit)})",
                    )
                )
        return found

    def plan(self, recipe: RecipeConfig, shape: ClusterShape) -> LaunchPlan:
        env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "TOKENIZERS_PARALLELISM": "false"}
        if shape.target == "tpu":
            env["TPUFT_TPU_HOSTS"] = str(shape.hosts)
            return LaunchPlan(workers=(0,), env=env)  # one program drives every host of the slice
        env[LOCAL_DEVICES_ENV] = str(shape.local_devices)  # logical CPU devices, each a replica
        return LaunchPlan(workers=tuple(range(shape.hosts)), env=env)

    def summarize(self, outcome: RunOutcome, launched: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        return weight_digest_summary(outcome, launched)


BACKEND = Keras()
