"""Before ``recipes show --compile`` (and ``--check-fit``) compiles: is the paper estimate already
decisive, and if not, how long and how much memory will the compile take?

A compile of a large model on a small controller takes many minutes and tens of GB of RAM (T5 v1.1 base for
a v4-32: 10 minutes and 17.6 GB on the 2-core development machine; an 11B model ran over 20 minutes without a
verdict). When the paper estimate (:mod:`tpuft.model.summary`) is far over the chip's HBM, the compile can
only confirm it: the answer is given at once, with what would fit, and ``--force-compile`` compiles anyway.

Why the estimate can be decisive, and why at :data:`DECISIVE_RATIO`: the estimate counts the float32 weights,
their gradients and the optimizer state exactly from the model's shapes (a model split over devices is
counted like FSDP over that many, an approximation); its activations are a rough guess; and it leaves out
what only a compile knows, XLA's temporaries and buffers, which add to the total, never take away. What can
make a compile come in *under* the estimate is the activations guess (rematerialization, fusion) and the
split model's approximation. So the estimate is called decisive only when both hold: the exactly counted
part alone (weights, gradients, optimizer state) is over the HBM, so no guess about activations makes it
fit; and the whole estimate is at least 1.5 times the HBM, so that even a third less than the estimate would
not fit. The one measured comparison (docs/benchmarks.md: T5 v1.1 base on a v4-32) had the compile at 0.82
of the estimate (10.4 against 12.6 GiB): 1.5 leaves about twice that gap.
"""

from __future__ import annotations

import contextlib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuft.core.accelerators import GENERATIONS, AcceleratorType, lookup

if TYPE_CHECKING:
    from tpuft.config import RecipeConfig
    from tpuft.model.summary import Summary

DECISIVE_RATIO = 1.5
"""The paper estimate over the device's HBM at which it is decisive (the module docstring says why)."""
FIRM_ROWS = ("weights", "gradients", "optimizer")
"""The rows of the paper estimate counted exactly from the model's shapes."""
HEADROOM = 0.93
"""A suggestion must leave 7% of HBM free (as :data:`tpuft.ops.compile_fit.HEADROOM`)."""


def firm_bytes(paper: Summary) -> int:
    return sum(row.bytes for row in paper.memory if row.what in FIRM_ROWS)


def decisive(paper: Summary) -> bool:
    """Whether the paper estimate alone says the step does not fit (see the module docstring)."""
    return paper.total_bytes >= DECISIVE_RATIO * paper.hbm_bytes and firm_bytes(paper) > paper.hbm_bytes


def decisive_label(paper: Summary) -> str:
    """What the report says of its source when the estimate decided (the verdict's parenthesis)."""
    ratio = paper.total_bytes / paper.hbm_bytes
    return (
        f"paper estimate, {ratio:.1f}x the HBM: not compiled (decisive from {DECISIVE_RATIO}x, with the "
        "weights, gradients and optimizer state alone over it; --force-compile compiles anyway)"
    )


# -- what would fit, on paper ------------------------------------------------------------------------------
def paper_suggestions(
    recipe: RecipeConfig, accelerator: AcceleratorType, slices: int = 1, recipe_dir: Path | None = None
) -> list[str]:
    """Settings whose paper estimate fits with 7% of HBM to spare, each summarized as it would be set: more
    model parallelism or microbatches on this slice, else a larger slice of the same generation (as it is, or
    with the model split over it); the same chips of a generation with more HBM; a smaller model size of the
    same family. Settings are read by name from the backend's section (``num_partitions``,
    ``num_microbatches``, ``size``), so no backend is named here; a backend without them gets the slices
    only. Each is a paper estimate: compile the one you pick to be sure."""
    found: list[str] = []
    split = _partitioned(recipe, accelerator, slices, recipe_dir)
    if split is not None:
        found.append(split)
    for size in accelerator.generation.sizes if split is None else ():
        bigger = lookup(f"{accelerator.generation.name}-{size}")
        if bigger.chips <= accelerator.chips:
            continue
        as_is = (
            _fits(recipe, bigger, slices, recipe_dir)
            if _splits(recipe, bigger, slices, _partitions(recipe))
            else None
        )
        if as_is is not None:
            found.append(f"a {bigger.name} ({as_is})")
            break
        split = _partitioned(recipe, bigger, slices, recipe_dir)
        if split is not None:
            found.append(f"a {bigger.name} with {split}")
            break
    for generation in sorted(GENERATIONS.values(), key=lambda g: g.hbm_bytes_per_device):
        if generation.hbm_bytes_per_device <= accelerator.generation.hbm_bytes_per_device:
            continue
        size = accelerator.chips * (2 if generation.size_counts_cores else 1)
        if size not in generation.sizes:
            continue
        other = lookup(f"{generation.name}-{size}")
        fitting = _fits(recipe, other, slices, recipe_dir)
        if fitting is not None:
            found.append(f"a {other.name} ({generation.hbm_gib_per_chip} GiB per chip; {fitting})")
            break
    smaller = _smaller_size(recipe, accelerator, slices, recipe_dir)
    if smaller is not None:
        found.append(smaller)
    return found


def _fits(
    recipe: RecipeConfig, accelerator: AcceleratorType, slices: int, recipe_dir: Path | None
) -> str | None:
    """``paper estimate X per chip`` when ``recipe`` fits ``accelerator`` on paper with 7% to spare, else
    None."""
    from tpuft.model.recipe_model import ModelUnknown
    from tpuft.model.summary import fmt_bytes, summarize

    try:
        found = summarize(recipe, accelerator, slices=slices, recipe_dir=recipe_dir)
    except ModelUnknown:
        return None
    if found.total_bytes > found.hbm_bytes * HEADROOM:
        return None
    return f"paper estimate {fmt_bytes(found.total_bytes)} per {found.device_word}"


def _partitions(recipe: RecipeConfig) -> int:
    return int(getattr(recipe.backend, "num_partitions", 1) or 1)


def _splits(recipe: RecipeConfig, accelerator: AcceleratorType, slices: int, partitions: int) -> bool:
    """Whether ``partitions`` divides one slice's devices and the batch splits over the replicas."""
    devices = accelerator.devices
    return devices % partitions == 0 and recipe.train.batch_size % (devices // partitions * slices) == 0


def _partitioned(
    recipe: RecipeConfig, accelerator: AcceleratorType, slices: int, recipe_dir: Path | None
) -> str | None:
    """The least model parallelism, then the fewest microbatches, that fit: ``backend.num_partitions`` a
    power of two from the recipe's up, dividing one slice's devices and leaving the batch split evenly over
    the replicas; ``backend.num_microbatches`` a power of two from the recipe's up, dividing each replica's
    batch. Settings the backend's section does not have are not tried."""
    backend = recipe.backend
    fields = type(backend).model_fields
    if "num_partitions" not in fields and "num_microbatches" not in fields:
        return None
    partitions = _partitions(recipe)
    micro = int(getattr(backend, "num_microbatches", None) or 1)
    candidate = partitions
    while candidate <= accelerator.devices:
        if _splits(recipe, accelerator, slices, candidate):
            per_replica = recipe.train.batch_size // (accelerator.devices // candidate * slices)
            steps = micro
            while steps <= per_replica and ("num_microbatches" in fields or steps == micro):
                if (candidate, steps) != (partitions, micro) and per_replica % steps == 0:
                    update: dict[str, int] = {}
                    if candidate != partitions:
                        update["num_partitions"] = candidate
                    if steps != micro:
                        update["num_microbatches"] = steps
                    variant = recipe.model_copy(update={"backend": backend.model_copy(update=update)})
                    fitting = _fits(variant, accelerator, slices, recipe_dir)
                    if fitting is not None:
                        said = " and ".join(f"backend.{key}: {value}" for key, value in update.items())
                        return f"{said} ({fitting})"
                steps *= 2
        if "num_partitions" not in fields:
            break
        candidate *= 2
    return None


def _smaller_size(
    recipe: RecipeConfig, accelerator: AcceleratorType, slices: int, recipe_dir: Path | None
) -> str | None:
    """The largest smaller ``backend.size`` (the section's own list of sizes) that fits as it is set."""
    backend = recipe.backend
    field = type(backend).model_fields.get("size")
    current = getattr(backend, "size", None)
    if field is None or current is None:
        return None
    sizes = [value for value in _literal_values(field.annotation) if isinstance(value, str)]
    if current not in sizes:
        return None
    for size in reversed(sizes[: sizes.index(current)]):
        variant = recipe.model_copy(update={"backend": backend.model_copy(update={"size": size})})
        fitting = _fits(variant, accelerator, slices, recipe_dir)
        if fitting is not None:
            return f"backend.size: {size} ({fitting})"
    return None


def _literal_values(annotation: object) -> list[object]:
    """The values of a ``Literal[...]``, also inside ``Optional``/``Union``, in the order written."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    values: list[object] = []
    for arg in typing.get_args(annotation):
        values += _literal_values(arg)
    return values


# -- how long, how much memory -----------------------------------------------------------------------------
MEASURED = ((0.9e6, 19.0), (296.7e6, 477.0))
"""(parameters, CPU seconds of the compile program) measured on the 2-core development machine
(docs/benchmarks.md, "Compile for the slice"): the T5X quickstart for a v4-16 (75 s wall under a load average
of 15-20, of which about a quarter was its own CPU) and T5 v1.1 base for a v4-32 (477 s of CPU, 10 min 12 s
wall)."""
PEAK_RSS_GB = ((0.9e6, 2.0), (296.7e6, 17.6))
"""(parameters, peak resident GB): T5 v1.1 base's 17.6 GB is measured (``/usr/bin/time -v``); the 2 GB for
the quickstart is an assumption, not a measurement (JAX, T5X, TensorFlow and libtpu loaded)."""


@dataclass(frozen=True)
class Forecast:
    seconds: float
    memory_gb: float
    available_gb: float | None

    def line(self, what: str) -> str:
        from tpuft.core.waiting import duration

        short = ""
        if self.available_gb is not None and self.memory_gb > self.available_gb:
            short = (
                f"; this machine has {self.available_gb:.1f} GB available: the compile may be killed for "
                "memory or swap for a long time"
            )
        return (
            f"expect the compile of {what} to take about {duration(self.seconds)} of CPU and "
            f"{self.memory_gb:.0f} GB of memory at its peak{short} (an estimate, scaled by parameter count "
            "from two compiles measured on a 2-core machine: 0.9M parameters in about 20 s, 297M in 8 min "
            "and 17.6 GB; a busy or slower machine takes longer)"
        )


def forecast(parameters: int) -> Forecast:
    """A power law through the two measured points, in parameters: time and peak memory grow with the program
    XLA compiles (layers, widths, devices), which parameters stand for here; beyond the measured range it is
    an extrapolation (an 11B model: about an hour of CPU and 70 GB)."""
    return Forecast(
        _power_law(MEASURED, parameters),
        _power_law(PEAK_RSS_GB, parameters),
        _available_gb(),
    )


def _power_law(points: tuple[tuple[float, float], ...], x: float) -> float:
    import math

    (x0, y0), (x1, y1) = points
    slope = math.log(y1 / y0) / math.log(x1 / x0)
    return y0 * (max(x, x0) / x0) ** slope  # below the smallest measured: its figure


def _available_gb() -> float | None:
    """MemAvailable from /proc/meminfo (Linux); None elsewhere."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    return None


def paper_summary(
    recipe: RecipeConfig, accelerator: AcceleratorType, slices: int, recipe_dir: Path | None
) -> Summary | None:
    """The paper estimate, or None for a model it cannot size (the user's own gin files may still compile)."""
    from tpuft.model.recipe_model import ModelUnknown
    from tpuft.model.summary import summarize

    try:
        return summarize(recipe, accelerator, slices=slices, recipe_dir=recipe_dir)
    except ModelUnknown:
        return None
