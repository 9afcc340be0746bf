"""Loss and eval curves of a run as one PNG (``tpuft monitor --plot``).

matplotlib is imported inside :func:`plot_curves` only, and through its object API (``Figure`` + the Agg
canvas), not ``pyplot``: no display is needed, no global backend is switched, no figure is left open in a
long-lived process.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.core.errors import UsageError
from tpuft.run.rundir import MetricsLog

WIDTH_IN, HEIGHT_IN, DPI = 12.0, 8.0, 100
"""1200 x 800 px."""
MAX_POINTS = 5000
"""Longer series are reduced to this many points (the min and max of each bucket, so spikes survive)."""
MARKERS_UP_TO = 200
"""Series this short get a marker on each point (evals are sparse); denser ones are plain lines (fast)."""
METRIC_WORDS = ("accuracy", "exact_match", "f1", "precision", "recall", "auc", "bleu", "rouge")
"""Eval columns with one of these in the name go to the metrics panel; losses go to the loss panel."""


@dataclass
class Series:
    label: str
    steps: list[float]
    values: list[float]


def plot_curves(log: MetricsLog, out: Path, *, title: str, goodput: Any = None) -> Path:
    """Draw training loss, eval loss (top) and eval metrics in [0, 1] (below) against step into the PNG
    ``out``, and with ``goodput`` (a :class:`tpuft.run.goodput.Goodput` with events) a stacked bar of where
    the run's wall time went.

    The file is written under a temporary name and renamed, so a reader (or a browser reloading it) never sees
    half a PNG. Raises :class:`UsageError` when the log has nothing to draw or ``out``'s folder does not
    exist."""
    out = Path(out)
    _check_target(out)
    losses = [
        s for s in (_series(log.rows, "loss", "train loss"), _series(log.rows, "eval_loss", "eval loss")) if s
    ]
    metrics = _metric_series(log.rows)
    if not losses and not metrics:
        raise UsageError(
            f"nothing to plot for {title}: no training loss, eval loss or eval metrics logged yet",
            hint="Plots need at least one logged step; try again once the run has logged (tpuft monitor "
            "shows it).",
        )
    figure = _draw(losses, metrics, title, goodput if goodput is not None and goodput.events else None)
    _save_atomic(figure, out)
    return out


# ---- data ------------------------------------------------------------------------------------------------


def _series(rows: list[dict[str, Any]], key: str, label: str) -> Series | None:
    steps, values = [], []
    for row in rows:
        value, step = row.get(key), row.get("step")
        if _finite(value) and _finite(step):
            steps.append(float(step))
            values.append(float(value))
    return Series(label, steps, values) if steps else None


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _metric_series(rows: list[dict[str, Any]]) -> list[Series]:
    """Eval accuracy-like columns. Ones logged in percent (seqio's are 0-100) are scaled to [0, 1] and say
    so."""
    keys = sorted({k for row in rows for k in row if k.startswith("eval_") and _is_metric(k)})
    found = []
    for key in keys:
        series = _series(rows, key, key.removeprefix("eval_"))
        if series is None or min(series.values) < 0:
            continue
        top = max(series.values)
        if top > 1.0 and top <= 100.0:
            series = Series(f"{series.label} (% / 100)", series.steps, [v / 100.0 for v in series.values])
        elif top > 100.0:
            continue
        found.append(series)
    return found


def _is_metric(key: str) -> bool:
    return any(word in key for word in METRIC_WORDS) and "loss" not in key


def downsample(
    steps: list[float], values: list[float], limit: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """At most ``limit`` points: the lowest and highest point of each of ``limit // 2`` buckets, in step
    order, so a loss spike or a dip still shows. Short series come back unchanged."""
    if len(steps) <= limit:
        return steps, values
    import numpy as np

    x, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    keep = []
    for bucket in np.array_split(np.arange(len(x)), max(1, limit // 2)):
        low, high = bucket[np.argmin(y[bucket])], bucket[np.argmax(y[bucket])]
        keep.extend(sorted({int(low), int(high)}))
    keep = sorted(set(keep) | {0, len(x) - 1})
    return x[keep].tolist(), y[keep].tolist()


# ---- drawing ---------------------------------------------------------------------------------------------


def _draw(losses: list[Series], metrics: list[Series], title: str, goodput: Any = None) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(
        figsize=(WIDTH_IN, HEIGHT_IN * (1.25 if goodput is not None else 1)), dpi=DPI, layout="constrained"
    )
    if goodput is not None:
        top, bottom, bar = figure.subplots(3, 1, height_ratios=[3, 3, 1])
        bottom.sharex(top)
        _stacked_bar(bar, goodput)
    else:
        top, bottom = figure.subplots(2, 1, sharex=True)
    figure.suptitle(title)
    for series in losses:
        _line(top, series)
    if losses and _wide_range([v for s in losses for v in s.values]):
        top.set_yscale("log")
        top.set_ylabel("loss (log scale)")
    else:
        top.set_ylabel("loss")
    top.set_title("losses")
    for series in metrics:
        _line(bottom, series)
    bottom.set_ylim(-0.02, 1.02)
    bottom.set_ylabel("eval metric")
    bottom.set_title("eval metrics")
    bottom.set_xlabel("step")
    for axes, have in ((top, losses), (bottom, metrics)):
        axes.grid(True, alpha=0.3)
        if have:
            axes.legend(loc="best")
        else:
            axes.text(
                0.5, 0.5, "nothing logged", transform=axes.transAxes, ha="center", va="center", color="gray"
            )
    return figure


def _stacked_bar(axes: Any, goodput: Any) -> None:
    """One horizontal bar, the wall time: goodput first, then each cause of badput, in minutes."""
    from tpuft.run.goodput import CAUSES, SHORT

    parts = [("goodput", goodput.good_s)] + [
        (SHORT.get(c, c), goodput.badput[c]) for c in CAUSES if goodput.badput.get(c, 0) > 0
    ]
    left = 0.0
    colours = [
        "tab:green",
        "tab:orange",
        "tab:red",
        "tab:purple",
        "tab:brown",
        "tab:pink",
        "tab:gray",
        "tab:olive",
        "tab:cyan",
        "tab:blue",
        "gold",
        "navy",
        "teal",
        "salmon",
        "black",
        "silver",
    ]
    for (label, seconds), colour in zip(parts, colours):
        axes.barh([0], [seconds / 60], left=[left], color=colour, label=f"{label} {seconds / 60:.1f} min")
        left += seconds / 60
    axes.set_yticks([])
    axes.set_xlabel("minutes of wall time")
    axes.set_title(f"goodput {goodput.goodput:.0%} of {goodput.wall_s / 60:.1f} min (badput by cause)")
    axes.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.6),
        ncol=min(len(parts), 5),
        fontsize="small",
        frameon=False,
    )


def _line(axes: Any, series: Series) -> None:
    steps, values = downsample(series.steps, series.values)
    marker = "o" if len(steps) <= MARKERS_UP_TO else None
    axes.plot(steps, values, label=series.label, linewidth=1.2, marker=marker, markersize=3)


def _wide_range(values: list[float]) -> bool:
    """Log scale when every value is positive and they span more than 20x (early T5 losses dwarf late
    ones)."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 20


# ---- output ----------------------------------------------------------------------------------------------


def _check_target(out: Path) -> None:
    if out.is_dir():
        raise UsageError(f"{out} is a folder; give a file name for the plot, e.g. {out / 'curves.png'}")
    if not out.parent.is_dir():
        raise UsageError(
            f"cannot write {out}: folder {out.parent} does not exist",
            hint=f"Create it: mkdir -p {out.parent}",
        )


def _save_atomic(figure: Any, out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with partial.open("wb") as handle:
            figure.savefig(handle, format="png", dpi=DPI)
        os.replace(partial, out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
