"""What the Keras trainer and the Keras prediction engine (``tpuft predict``) set up the same way: the
``tf.distribute`` strategy for this process's place in the run, the precision policy, and the Hugging Face TF
model (from a checkpoint or pretrained weights, or a random init from the recipe). One definition, so that
``predict`` runs a trained model under the strategy and with the model classes the run trained it with.
TensorFlow is passed in: this module imports without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.worker.keras import devices as keras_devices

if TYPE_CHECKING:
    from tpuft.backends.keras_schema import KerasBackend
    from tpuft.config import RecipeConfig
    from tpuft.worker.context import WorkerContext


def tpu_hosts() -> int:
    """The slice's hosts when this process drives a TPU (``TPUFT_TPU_HOSTS``, set by the launch plan), else
    0."""
    return int(os.environ.get("TPUFT_TPU_HOSTS", "0"))


def make_strategy(tf: Any, ctx: WorkerContext, hosts: int) -> Any:
    """TPU: ``TPUStrategy`` over every core of the slice from this one program. CPU pod:
    ``MultiWorkerMirrored`` over the workers (``TF_CONFIG`` from ``TPUFT_PEERS``), a worker's logical CPU
    devices each a replica."""
    if hosts:
        # One host: its own chips. A pod slice: the node by name; the other hosts serve the TPU runtime.
        name = "local" if hosts == 1 else os.environ.get("TPU_NAME") or os.environ["TPUFT_NODE"]
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if ctx.num_workers > 1:
        peers = os.environ.get("TPUFT_PEERS", "").split(",")
        if len(peers) != ctx.num_workers:
            raise RuntimeError(f"TPUFT_PEERS names {len(peers)} workers, the run has {ctx.num_workers}")
        os.environ["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": peers}, "task": {"type": "worker", "index": ctx.worker_id}}
        )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    devices = keras_devices.local_devices()
    if devices > 1:
        return keras_devices.cpu_strategy(tf, devices, ctx.num_workers, options)
    if ctx.num_workers > 1:
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def set_precision(tf: Any, backend: KerasBackend, hosts: int, train_precision: str = "float32") -> str:
    """The global Keras policy (:meth:`KerasBackend.policy`): ``train.precision: bf16`` is ``mixed_bfloat16``
    everywhere; else ``backend.precision``, whose ``auto`` is bfloat16 compute on a TPU, float32 on a CPU.
    Layers made after this compute in the policy's dtype and keep float32 weights."""
    precision = backend.policy(train_precision, tpu=bool(hosts))
    tf.keras.mixed_precision.set_global_policy(precision)
    return precision


def quiet_transformers() -> Any:
    """transformers without its progress bars and its "TF classes are deprecated" warning (once per
    process)."""
    import warnings

    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message="The initializer .* is unseeded")  # the trainer seeds globally
    return transformers


def build_hf_model(recipe: RecipeConfig, tokenizer: Any, source: Path | str | None) -> Any:
    """The HF TF model of the recipe (``TFT5ForConditionalGeneration``, or for ``backend.task:
    classification`` ``TFAutoModelForSequenceClassification`` with the recipe's labels): ``source``'s weights
    (a checkpoint of a Keras run, or pretrained weights), or a random init from ``model.config`` /
    ``backend.encoder``. Built in the caller's strategy scope."""
    import transformers

    backend = recipe.backend
    classify = getattr(backend, "task", "") == "classification"
    model_cfg = recipe.model
    overrides: dict[str, Any] = {}
    if model_cfg.dropout is not None:
        overrides["dropout_rate" if not classify else "hidden_dropout_prob"] = model_cfg.dropout
    if classify:
        labels = recipe.data.labels
        label_maps = {
            "num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)},
        }
        if source is not None:
            return transformers.TFAutoModelForSequenceClassification.from_pretrained(
                source, **label_maps, **overrides
            )
        settings = dict(getattr(backend, "encoder", None) or {})
        model_type = settings.pop("model_type")
        config = transformers.AutoConfig.for_model(
            model_type,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            **settings,
            **label_maps,
            **overrides,
        )
        return transformers.TFAutoModelForSequenceClassification.from_config(config)
    if source is not None:
        return transformers.TFT5ForConditionalGeneration.from_pretrained(source, **overrides)
    assert model_cfg.config is not None
    config = transformers.T5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **{**model_cfg.config.kwargs(), **overrides},
    )
    return transformers.TFT5ForConditionalGeneration(config)
