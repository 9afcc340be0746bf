"""Adafactor for the Keras trainer with the update rule of transformers' ``Adafactor`` (what the PyTorch/XLA
trainer and seed 003 use) and every knob of ``train.adafactor``. TensorFlow is passed in: this module imports
without it.

Why not tf-keras's own ``tf.keras.optimizers.Adafactor``: its rule differs where a recipe would notice.
* It always multiplies the step by the parameter's RMS (``scale_parameter`` cannot be turned off; the recipe's
  default, T5 fine-tuning's, is off), so the same ``learning_rate`` trains a 0.05-RMS weight about 20 times
  slower.
* It always caps the rate at 1/sqrt(step), even under a schedule, and has no ``warmup_init``.
* It has no first moment (``beta1``).
Everything else (factored second moments of a matrix's rows and columns, ``decay_rate``, ``eps``, the update
clipped to an RMS of ``clip_threshold``) is the same, so this class keeps tf-keras's optimizer machinery
(distribution, ``exclude_from_weight_decay``, variables by position for ``optimizer.npz``) and replaces only
the update step. Tested against transformers' torch implementation on the same numbers
(``tests/worker/test_keras_train_keys.py``).
"""

from __future__ import annotations

from typing import Any


def make_optimizer(tf: Any, train: Any, schedule: Any) -> Any:
    """The recipe's optimizer: Adafactor with ``train.adafactor``, or AdamW; the learning rate follows
    ``schedule`` (Adafactor's ``relative_step`` replaces it with its own). Biases and norms get no weight
    decay."""
    if train.optimizer == "adafactor":
        knobs = train.adafactor
        optimizer = adafactor_class(tf)(
            learning_rate=schedule,
            eps=tuple(knobs.eps),
            clip_threshold=knobs.clip_threshold,
            decay_rate=knobs.decay_rate,
            beta1=knobs.beta1,
            scale_parameter=knobs.scale_parameter,
            relative_step=knobs.relative_step,
            warmup_init=knobs.warmup_init,
            decay=train.weight_decay,
        )
    else:
        optimizer = tf.keras.optimizers.AdamW(learning_rate=schedule, weight_decay=train.weight_decay)
    optimizer.exclude_from_weight_decay(var_names=["layer_norm", "LayerNorm", "bias"])
    return optimizer


def adafactor_class(tf: Any) -> Any:
    """The optimizer class (made here so that this module imports without TensorFlow)."""

    class Adafactor(tf.keras.optimizers.Optimizer):  # type: ignore[misc, name-defined]
        def __init__(
            self,
            learning_rate: Any = 1e-3,
            eps: tuple[float, float] = (1e-30, 1e-3),
            clip_threshold: float = 1.0,
            decay_rate: float = -0.8,
            beta1: float | None = None,
            scale_parameter: bool = False,
            relative_step: bool = False,
            warmup_init: bool = False,
            decay: float = 0.0,
            name: str = "Adafactor",
            **kwargs: Any,
        ) -> None:
            super().__init__(name=name, weight_decay=None, **kwargs)  # decay is ours: at Adafactor's own rate
            self._learning_rate = self._build_learning_rate(learning_rate)
            self.eps1, self.eps2 = eps
            self.clip_threshold = clip_threshold
            self.decay_rate = decay_rate
            self.beta1 = beta1
            self.scale_parameter = scale_parameter
            self.relative_step = relative_step
            self.warmup_init = warmup_init
            self.decay = decay

        def build(self, var_list: list[Any]) -> None:
            super().build(var_list)
            if getattr(self, "_built", False):
                return
            self._built = True
            self._slots: list[dict[str, Any]] = []
            for var in var_list:
                slots: dict[str, Any] = {}
                if len(var.shape) >= 2:  # a matrix's second moment is factored: one row and one column vector
                    slots["row"] = self.add_variable(
                        var.shape[:-1], var.dtype, name=f"row/{var._shared_name}"
                    )
                    slots["col"] = self.add_variable(
                        var.shape[:-2] + var.shape[-1:], var.dtype, name=f"col/{var._shared_name}"
                    )
                else:
                    slots["sq"] = self.add_variable_from_reference(var, "sq")
                if self.beta1 is not None:
                    slots["avg"] = self.add_variable_from_reference(var, "avg")
                self._slots.append(slots)

        def _step_size(self, variable: Any, step: Any) -> Any:
            """transformers' ``_get_lr``: the schedule's rate, or the relative step; times the weight's RMS
            when ``scale_parameter``."""
            if self.relative_step:
                least = 1e-6 * step if self.warmup_init else tf.constant(1e-2, variable.dtype)
                rate = tf.minimum(least, tf.math.rsqrt(step))
            else:
                rate = tf.cast(self.learning_rate, variable.dtype)
            if self.scale_parameter:
                rate = rate * tf.maximum(tf.cast(self.eps2, variable.dtype), rms(tf, variable))
            return rate

        def update_step(self, gradient: Any, variable: Any) -> None:
            gradient = tf.convert_to_tensor(gradient)  # an embedding's sparse gradient, densified
            slots = self._slots[self._index_dict[self._var_key(variable)]]
            step = tf.cast(self.iterations + 1, variable.dtype)
            rate = self._step_size(variable, step)
            beta2 = 1.0 - tf.pow(step, self.decay_rate)
            squared = tf.square(gradient) + self.eps1
            if "row" in slots:
                row, col = slots["row"], slots["col"]
                row.assign(beta2 * row + (1.0 - beta2) * tf.reduce_mean(squared, axis=-1))
                col.assign(beta2 * col + (1.0 - beta2) * tf.reduce_mean(squared, axis=-2))
                row_factor = tf.math.rsqrt(row / tf.reduce_mean(row, axis=-1, keepdims=True))
                update = row_factor[..., None] * tf.math.rsqrt(col)[..., None, :] * gradient
            else:
                sq = slots["sq"]
                sq.assign(beta2 * sq + (1.0 - beta2) * squared)
                update = tf.math.rsqrt(sq) * gradient
            update /= tf.maximum(1.0, rms(tf, update) / self.clip_threshold)
            update *= rate
            if "avg" in slots:
                avg = slots["avg"]
                avg.assign(self.beta1 * avg + (1.0 - self.beta1) * update)
                update = avg
            if self.decay and self._use_weight_decay(variable):
                variable.assign_sub(variable * (self.decay * rate))
            variable.assign_sub(update)

        def get_config(self) -> dict[str, Any]:
            config = super().get_config()
            config.update(
                {
                    "learning_rate": self._serialize_hyperparameter(self._learning_rate),
                    "eps": (self.eps1, self.eps2),
                    "clip_threshold": self.clip_threshold,
                    "decay_rate": self.decay_rate,
                    "beta1": self.beta1,
                    "scale_parameter": self.scale_parameter,
                    "relative_step": self.relative_step,
                    "warmup_init": self.warmup_init,
                    "decay": self.decay,
                }
            )
            return config

    return Adafactor


def rms(tf: Any, tensor: Any) -> Any:
    return tf.sqrt(tf.reduce_mean(tf.square(tensor)))
