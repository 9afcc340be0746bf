"""The shared recipe keys as T5X does them: bindings of the run gin (:func:`tpuft.worker.t5x.gin.run_gin`), in
T5X's own terms, and the one gin-configurable piece T5X lacks (a parameter traversal by model part, for
freezing).

Each key becomes what a T5X user would write in their gin:

* ``train.precision: bf16``: the network's activation dtype (``T5Config.dtype = 'bfloat16'``); the parameters
  and Adafactor's state stay float32, as in T5X's own bf16 model gins.
* ``train.adafactor``: ``adafactor.Adafactor``'s arguments (epsilons, clipping, second-moment decay, momentum,
  parameter scaling); a relative step becomes T5X's ``rsqrt_decay`` schedule, which is the same function of
  the step.
* ``train.label_smoothing``: ``EncoderDecoderModel.label_smoothing``.
* ``train.grad_accum_steps``: ``Trainer.num_microbatches`` (T5X sums the microbatches' gradients: one update
  of the whole batch).
* ``model.freeze``: the optimizer is a ``MultiOptimizer`` whose one traversal covers the parameters that still
  train; the frozen ones get no update and no optimizer state, so they stay bit-identical.
* ``model.gradient_checkpointing``: ``T5Config.remat_policy = 'full'`` of the scalable T5 network (umT5's),
  the only t5x network with a remat policy.
* ``train.sharding: fsdp``: the parameters' ``embed`` axis laid over the ``data`` mesh axis
  (``standard_logical_axis_rules.parameter_partitioning_dims = 2``): every replica holds a slice of every
  matrix.
* ``train.early_stopping``: a T5X action after each inference eval (:class:`tpuft.worker.t5x.hooks.EarlyStop`)
  that asks the run's own judge; T5X then ends its loop, and checkpoints at every evaluation so the stop has
  one.

Pure functions of the recipe, with nothing of JAX or T5X imported at module level: the bindings are read and
tested without the T5X venv (flax is imported only when gin builds the traversal, on the worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpuft.config import RecipeConfig
from tpuft.config.recipe import AdafactorSettings

FREEZABLE = {
    "embeddings": ("token_embedder/", "decoder/logits_dense/"),
    "encoder": ("encoder/",),
    "decoder": ("decoder/",),
}
"""Model part -> path prefixes of its parameters in t5x's T5 networks. The embedding table is shared by the
encoder and the decoder (``token_embedder``), and the output projection (``decoder/logits_dense``, HF's
``lm_head``) goes with it, as in the PyTorch/XLA trainer; the first prefix that matches names the part."""

RELATIVE_STEP_WARMUP = 10_000
"""HF Adafactor's relative step is ``min(1e-2, 1/sqrt(t))`` (``min(1e-6 t, 1/sqrt(t))`` with warm-up init):
T5X's ``rsqrt_decay`` over ``max(step, 10000)`` (times ``linear_warmup`` over 10000 steps) at a base rate of
1."""


def part_of(path: str) -> str | None:
    """The model part a parameter belongs to, from its path (``/encoder/layers_0/attention/query/kernel``)."""
    inside = path.strip("/") + "/"
    for part, prefixes in FREEZABLE.items():
        if any(inside.startswith(prefix) for prefix in prefixes):
            return part
    return None


def trainable_params(frozen: Sequence[str] = ()) -> Any:
    """The traversal over the parameters outside the ``frozen`` parts (gin: ``@t5x_keys.trainable_params()``),
    for T5X's ``MultiOptimizer``: the parameters it does not reach are left exactly as they were."""
    from flax import traverse_util

    parts = frozenset(frozen)
    return traverse_util.ModelParamTraversal(lambda path, _: part_of(path) not in parts)


def network_dtype(recipe: RecipeConfig, cpu: bool) -> str:
    """The activation dtype: ``backend.dtype`` or ``train.precision: bf16`` (the recipe check refuses the two
    when they disagree); else T5X's habit, bfloat16 on TPU, float32 on the CPU."""
    backend = recipe.backend
    if backend.dtype is not None:
        return str(backend.dtype)
    if recipe.train.precision == "bf16":
        return "bfloat16"
    return "float32" if cpu else "bfloat16"


def relative_step_schedule(knobs: AdafactorSettings, initial: int) -> dict[str, Any] | None:
    """T5X's learning-rate factors for Adafactor's relative step, or None without one. HF counts its step from
    1 at the first update, T5X from the checkpoint's step: the offset is one less."""
    if not knobs.relative_step:
        return None
    return {
        "factors": "linear_warmup * rsqrt_decay" if knobs.warmup_init else "rsqrt_decay",
        "base_learning_rate": 1.0,
        "warmup_steps": RELATIVE_STEP_WARMUP,
        "step_offset": initial - 1,
    }


def key_bindings(recipe: RecipeConfig, *, initial_step: int, network: str | None) -> dict[str, Any]:
    """The run gin's bindings for the shared keys this recipe sets (nothing for the ones it leaves at their
    defaults: the model gin's own choices stand)."""
    train, model = recipe.train, recipe.model
    binds: dict[str, Any] = {}
    if train.adafactor != AdafactorSettings():
        knobs = train.adafactor
        binds.update(
            {
                "adafactor.Adafactor.epsilon1": knobs.eps[0],
                "adafactor.Adafactor.epsilon2": knobs.eps[1],
                "adafactor.Adafactor.clipping_threshold": knobs.clip_threshold,
                "adafactor.Adafactor.decay_rate": -knobs.decay_rate,  # HF: 1 - t^-0.8 written -0.8; T5X: 0.8
                "adafactor.Adafactor.step_offset": initial_step,  # a new optimizer's second moments, as HF's
                "adafactor.Adafactor.beta1": knobs.beta1,
                "adafactor.Adafactor.multiply_by_parameter_scale": knobs.scale_parameter,
            }
        )
    if train.label_smoothing:
        binds["models.EncoderDecoderModel.label_smoothing"] = train.label_smoothing
    if model.freeze:
        binds["OPTIMIZER"] = "@optimizers.MultiOptimizer()"
        binds["optimizers.MultiOptimizer.traversals_and_optimizers"] = [TRAVERSAL]
        binds["t5x_keys.trainable_params.frozen"] = sorted(model.freeze)
    if model.gradient_checkpointing and network is not None:  # the recipe check refuses t5x's T5 network
        binds["network.T5Config.remat_policy"] = "full"
    if train.sharding == "fsdp":
        binds["partitioning.standard_logical_axis_rules.parameter_partitioning_dims"] = 2
    if train.early_stopping is not None:
        binds["train_script.train.actions"] = {"INFER_EVAL": ["@t5x_hooks.EarlyStop()"]}
        binds["train_script.train.concurrent_metrics"] = (
            False  # T5X runs actions only on metrics it waited for
        )
        if train.checkpoint_every is None and recipe.eval.every:
            binds["utils.SaveCheckpointConfig.period"] = recipe.eval.every  # the stop's step has a checkpoint
    return binds


TRAVERSAL = ("@t5x_keys.trainable_params()", "@adafactor.Adafactor()")
"""``MultiOptimizer``'s one (traversal, optimizer) pair: the model gin's Adafactor bindings still apply to
it."""

GIN_IMPORTS = {"optimizers": "t5x.optimizers", "t5x_keys": "tpuft.worker.t5x.keys"}
"""Modules these bindings name, for the run gin's imports."""
