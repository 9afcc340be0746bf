"""The learning-rate schedules every backend's recipe names (``train.schedule``), defined once in plain
Python: the PyTorch/XLA trainer uses it as its LambdaLR factor, and the Keras trainer's TF schedule is tested
against it."""

from __future__ import annotations

import math
from collections.abc import Callable


def lr_factor(steps: int, warmup: int, schedule: str) -> Callable[[int], float]:
    """Multiplier of the peak learning rate for LambdaLR: linear warm-up, then linear decay to 0, half a
    cosine to 0, or constant; or T5's inverse square root."""

    def factor(step: int) -> float:
        if schedule == "inverse_sqrt":  # T5's: the peak for the warm-up steps, then 1/sqrt(step) from there
            return (max(warmup, 1) / max(step, warmup, 1)) ** 0.5
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        if schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, steps - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        remaining = steps - step
        return max(0.0, remaining / max(1, steps - warmup))

    return factor
