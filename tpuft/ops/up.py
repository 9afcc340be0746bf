"""up: the whole path in one go. The recipe and its data are checked first (a typo must not cost a cluster and
a venv build), then a new cloud cluster's cost is confirmed, then create -> setup -> train. The CLI supplies
the prompts and the rendering through the callbacks; nothing here talks to a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpuft.config import ClusterConfig, Loaded, RecipeConfig
from tpuft.fleet.base import LineSink
from tpuft.ops.cluster import CostEstimate, CreateResult, cost_to_confirm, create
from tpuft.ops.compile_fit import require_fit
from tpuft.ops.preflight import preflight
from tpuft.ops.setup import SetupResult, setup
from tpuft.ops.train import TrainResult, train

STEPS = ("create", "setup", "train", "summary")


@dataclass
class UpResult:
    created: CreateResult
    setup: SetupResult
    train: TrainResult
    seconds: float


def up(
    config: ClusterConfig,
    recipe: Loaded[RecipeConfig],
    *,
    confirm: Callable[[CostEstimate], None],
    on_step: Callable[[int, str, Any], None] | None = None,
    on_line: LineSink | None = None,
    on_start: Any = None,
    on_notice: Callable[[str], None] | None = None,
    checked: bool = False,
    detach: bool = False,
    stop_on_interrupt: bool = False,
    check_fit: bool = False,
) -> UpResult:
    """``confirm(estimate)`` is called before a new cloud cluster is created and raises to stop. ``on_step(i,
    what, previous)`` announces step i of :data:`STEPS` with the result of the step before it (None for the
    first); the last step, the summary, is the caller's to render. ``checked``: the caller has run the
    preflight already; ``detach``, ``stop_on_interrupt`` and ``check_fit`` are :func:`tpuft.ops.train.train`'s
    (the fit is checked here, before the cluster is created)."""
    started = time.monotonic()
    step = on_step or (lambda index, what, previous: None)
    if not checked:
        preflight(config, recipe)
    if check_fit:
        fit = require_fit(config, recipe, notice=on_notice)
        if on_notice is not None:
            on_notice(f"check-fit on {fit.accelerator}: {fit.verdict()}")
    step(0, f"create {config.name}", None)
    estimate = cost_to_confirm(config)
    if estimate is not None:
        confirm(estimate)
    created = create(config)
    step(1, f"setup {recipe.value.backend.kind}", created)
    done = setup(config, recipe.value, on_line=on_line)
    step(2, f"train {recipe.value.name}", done)
    result = train(
        config,
        recipe,
        on_line=on_line,
        on_start=on_start,
        on_notice=on_notice,
        checked=True,
        detach=detach,
        stop_on_interrupt=stop_on_interrupt,
    )
    step(3, "summary and export", result)
    return UpResult(created=created, setup=done, train=result, seconds=time.monotonic() - started)
