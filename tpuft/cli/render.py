"""How results look in a terminal: worker lines behind coloured ``[wN]`` prefixes, numbers as people read
them, the monitor view, the train summary, byte progress bars. Rich is imported only when something is
drawn."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpuft.run.rundir import TEST_SCORES, tracking_lines

if TYPE_CHECKING:
    from rich.console import Console


WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def out_console() -> Console:
    from rich.console import Console

    class OutConsole(Console):
        def on_broken_pipe(self) -> None:
            """Rich's own answer exits 1 from wherever it prints; the entry point's is the quiet exit every
            verb shares (:func:`tpuft.commands.silence_stdout`), so the error goes there."""
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away")

    return OutConsole(highlight=False)


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def line_printer(console: Console):  # type: ignore[no-untyped-def]
    """Worker output, one line at a time, behind a coloured ``[wN]`` prefix (called from reader threads)."""
    from rich.markup import escape

    from tpuft.commands import closed_pipe_in_thread, stdout_closed

    def on_line(index: int, line: str) -> None:
        if stdout_closed():
            return
        colour = WORKER_COLOURS[index % len(WORKER_COLOURS)]
        try:
            console.print(f"[{colour}]\\[w{index}][/{colour}] {escape(line)}", soft_wrap=True)
        except (
            BrokenPipeError
        ):  # `tpuft exec -- ... | head`: stop the workers, as Ctrl-C would, and end quietly
            closed_pipe_in_thread()

    return on_line


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_metric(key: str, value: Any) -> str:
    """Throughput as people read it (248.3 ex/s, 9,731 tok/s), the learning rate in scientific notation."""
    if not isinstance(value, (int, float)):
        return fmt(value)
    if key == "lr":
        return f"{value:.2e}"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if key in {"examples_per_s", "elapsed_s"}:
        return f"{value:,.1f}"
    return fmt(value)


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.{digits}f}"
    return str(value)


def cluster_json(cluster: Any) -> dict[str, Any]:
    """``status --json`` (and ``create --json``): every worker with its slice, host and ``--worker`` ref, and
    one entry per slice (its node and state where the provider reports them)."""
    layout = cluster.layout
    return {
        "name": cluster.name,
        "provider": cluster.provider,
        "state": cluster.state,
        "accelerator": cluster.accelerator,
        "bucket": cluster.bucket,
        "hosts_per_slice": layout.hosts if cluster.workers else None,
        "slices": cluster_slices(cluster),
        "workers": [
            {
                "index": w.index,
                "slice": w.slice,
                "host": layout.host_of(w.index),
                "ref": layout.ref(w.index),
                "address": w.address,
                "internal_address": w.internal_address or None,
                "home": str(w.home) if w.home else None,
            }
            for w in cluster.workers
        ],
        "details": cluster.details,
    }


def cluster_slices(cluster: Any) -> list[dict[str, Any]]:
    """Per slice: its node and state (the provider's ``details["slice S"]`` = ``"NODE STATE"`` where it has
    one node per slice; otherwise the cluster's state) and its workers' refs."""
    layout = cluster.layout
    slices = []
    for slice_id in sorted({w.slice for w in cluster.workers}):
        node, _, state = str(cluster.details.get(f"slice {slice_id}", "")).rpartition(" ")
        slices.append(
            {
                "slice": slice_id,
                "node": node or None,
                "state": state or str(cluster.state),
                "workers": [layout.ref(w.index) for w in cluster.workers if w.slice == slice_id],
            }
        )
    return slices


def print_train_summary(console: Console, result: Any, json_out: bool) -> None:
    if result.detached:
        if json_out:
            print(
                json.dumps(
                    {
                        "run_id": result.run_id,
                        "run_dir": str(result.run_dir),
                        "detached": True,
                        "attempt": result.attempt,
                    },
                    indent=2,
                )
            )
            return
        console.print(
            f"[yellow]detached[/yellow] from run [bold]{result.run_id}[/bold]: it goes on training on "
            f"{result.workers} worker(s), without this terminal."
        )
        console.print(
            f"  re-attach: tpuft attach {result.run_id}\n  watch:     tpuft monitor {result.run_id}\n"
            f"  stop it:   tpuft stop {result.run_id}"
        )
        return
    if json_out:
        payload = {
            "run_id": result.run_id,
            "run_dir": str(result.run_dir),
            "seconds": round(result.seconds, 1),
            "last_train": result.last_train,
            "last_eval": result.last_eval,
            "test": getattr(result, "test", {}),
            "export_dir": str(result.export_dir) if result.export_dir else None,
            "attempt": result.attempt,
            "recoveries": getattr(result, "recoveries", []),
            **accounts_json(getattr(result, "goodput", None), getattr(result, "cost", None)),
            **result.extras,  # the backend's own (PyTorch/XLA: weight_digests per worker)
        }
        print(json.dumps(payload, indent=2))
        return
    from tpuft.cli.tables import Col, FitTable

    # the values wrap, a path folds whole (to be copied) when it is longer than the line
    table = FitTable(Col("", copy=True), Col(""), title=f"run {result.run_id}", show_header=False, more=None)
    table.add_row("wall time", fmt_seconds(result.seconds))
    table.add_row("workers", str(result.workers))
    table.add_row("final train loss", fmt(result.last_train.get("loss")))
    for key, value in result.last_eval.items():
        if key.startswith("eval_") and key not in {"eval_examples", "eval_seconds"}:
            table.add_row(key.replace("_", " "), fmt(value))
    for label, value in test_rows(getattr(result, "test", {})):
        table.add_row(label, value)
    for label, value in result.rows:
        table.add_row(label, value)
    for done in getattr(result, "recoveries", []):
        table.add_row(
            f"recovery (attempt {done.get('attempt')})",
            f"{done.get('cause')} at step {done.get('last_step')}; {done.get('steps_lost', 0)} steps redone "
            "from "
            f"step {done.get('checkpoint_step')}; training again after {fmt_seconds(done.get('back_s'))}",
        )
    for label, value in account_rows(getattr(result, "goodput", None), getattr(result, "cost", None)):
        table.add_row(label, value)
    table.add_row("run dir", str(result.run_dir))
    if result.export_dir:
        table.add_row("HF export", str(result.export_dir))
    console.print(table)


def accounts(storage: Any, info: dict[str, Any]) -> tuple[Any, Any]:
    """Where a run's time went and what it has cost so far (``tpuft.run.goodput``, ``tpuft.run.cost``):
    computed from its events and run.json at each reading, never stored."""
    from tpuft.run.cost import run_cost
    from tpuft.run.goodput import breakdown

    return breakdown(storage, info), run_cost(info)


def accounts_json(goodput: Any, cost: Any) -> dict[str, Any]:
    """The ``goodput`` and ``cost`` fields of every ``--json`` that shows a run."""
    return {
        "goodput": goodput.as_dict() if goodput is not None else None,
        "cost": cost.as_dict() if cost is not None else None,
    }


def account_rows(goodput: Any, cost: Any) -> list[tuple[str, str]]:
    """The summary's and monitor's rows: ``goodput 87% of 2.1h (badput: startup 3m, ...)`` and the cost so
    far, per attempt when there were several."""
    rows = []
    if goodput is not None:
        rows.append(("goodput", goodput.summary().removeprefix("goodput ")))
    if cost is not None:
        attempts = cost.per_attempt
        each = (
            "; ".join(f"attempt {a['attempt']} {a['chip_hours']:.3f} chip-h {a['pricing']}" for a in attempts)
            if len(attempts) > 1
            else ""
        )
        rows.append(("cost so far", cost.label() + (f" ({each})" if each else "")))
    return rows


def goodput_cell(goodput: Any) -> str:
    """``runs``' goodput column: ``87%`` and the largest cause of badput, or ``-`` before any event."""
    if goodput is None or not goodput.events:
        return "-"
    top = max(goodput.badput.items(), key=lambda item: item[1], default=None)
    return f"{goodput.goodput:.0%}" + (f" ({top[0]} {fmt_seconds(top[1])})" if top else "")


def test_rows(test: dict[str, Any]) -> list[tuple[str, str]]:
    """The test evaluation's rows of a table: every score (``test exact match``, ...), then which checkpoint
    and how many examples (``step 1200, 500 examples``). None before the test, or without a test set."""
    rows = [(key.replace("_", " "), fmt(test[key])) for key in TEST_SCORES if key in test]
    if rows and "test_checkpoint_step" in test:
        rows.append(
            (
                "test checkpoint",
                f"step {test['test_checkpoint_step']}, {fmt(test.get('test_examples'))} examples",
            )
        )
    return rows


def test_cell(test: dict[str, Any]) -> str:
    """``runs``' test column: the first score, on which checkpoint (``exact_match 0.988 @1200``), or ``-``."""
    key = next((key for key in TEST_SCORES if key in test), None)
    if key is None:
        return "-"
    return f"{key[5:]} {fmt(test[key])} @{test.get('test_checkpoint_step', '?')}"


def worker_label(index: int, layout: Any) -> str:
    """``1:0 (w2)`` on a multislice run, as ``--worker`` and the slices' own logs name hosts; the flat index
    otherwise."""
    return f"{layout.ref(index)} (w{index})" if layout.slices > 1 else str(index)


def snapshot_json(snap: Any) -> dict[str, Any]:
    """``monitor --json``: the snapshot, each worker with its slice and host on a multislice run."""
    from tpuft.readers.monitor import run_layout

    data = snap.as_json()
    layout = run_layout(snap.info, len(snap.workers))
    if layout.slices > 1:
        for worker in data["workers"]:
            worker.update(
                slice=layout.slice_of(worker["index"]),
                host=layout.host_of(worker["index"]),
                ref=layout.ref(worker["index"]),
            )
    return data


def snapshot_view(snap: Any, account: tuple[Any, Any] | None = None) -> Any:
    from rich.console import Group
    from rich.text import Text

    from tpuft.cli.tables import Col, FitTable
    from tpuft.readers.monitor import run_layout

    info = snap.info
    colour = {
        "running": "green",
        "finished": "blue",
        "failed": "red",
        "stale": "yellow",
        "interrupted": "yellow",
        "stopped": "yellow",
    }.get(snap.status, "white")
    node = f"  node [bold]{snap.node_state}[/bold]" if snap.node_state else ""
    stale = f" (no heartbeat for {fmt_seconds(snap.stale_for_s)})" if snap.stale_for_s is not None else ""
    head = Text.from_markup(
        f"run [bold]{snap.run_id}[/bold]  recipe {info.get('recipe', '-')}  backend "
        f"{info.get('backend', '-')}  "
        f"status [bold {colour}]{snap.label}[/bold {colour}]{stale}{node}\n"
        f"step {snap.step}/{snap.total_steps or '?'}  elapsed {fmt_seconds(snap.elapsed_s)}  ETA "
        f"{fmt_seconds(snap.eta_s)}"
    )
    parts: list[Any] = [head]
    if snap.recovery_line:
        parts.append(Text(snap.recovery_line, style="yellow"))
    for line in tracking_lines(snap.tracking):
        parts.append(Text(f"tracked in {line}", style="cyan"))
    if snap.ended and info.get("cause"):
        lines = [f"cause: {info['cause']}"] + [f"  {line}" for line in (info.get("culprit_tail") or [])[-5:]]
        parts.append(Text("\n".join(lines), style=colour))
    if snap.total_steps:
        done = min(snap.step, snap.total_steps) / snap.total_steps
        parts.append(
            Text("█" * round(done * 50) + "░" * (50 - round(done * 50)) + f" {done:.0%}", style=colour)
        )
    table = FitTable(Col("metric", copy=True), Col("value"), title=f"latest (from {snap.metrics_source})")
    for key in ("loss", "lr", "examples_per_s", "tokens_per_s", "elapsed_s"):
        if key in snap.last_train:
            table.add_row(key, fmt_metric(key, snap.last_train[key]))
    for key, value in snap.last_eval.items():
        if key.startswith("eval_"):
            table.add_row(f"{key} (step {snap.last_eval.get('step')})", fmt(value))
    best = snap.best_metric
    if best:
        table.add_row(f"best {best[0]}", f"{fmt(best[1])} at step {best[2]}")
    for label, value in test_rows(snap.test):
        table.add_row(label, value)
    for label, value in account_rows(*(account or (None, None))):
        table.add_row(label, value)
    parts.append(table)
    workers = FitTable(
        Col("worker", copy=True),
        Col("status"),
        Col("step"),
        Col("loss", drop=5),
        Col("lr", drop=1),
        Col("ex/s", drop=2),
        Col("tok/s", drop=3),
        Col("heartbeat"),
        Col("last log line", drop=4),
        title="workers",
    )
    layout = run_layout(info, len(snap.workers))
    for w in snap.workers:
        age = (
            f"{fmt_seconds(w.age_s)} ago" + (" [red](stale)[/red]" if w.stale else "")
            if w.age_s is not None
            else "-"
        )
        line = (w.last_log_line or "")[-70:]
        workers.add_row(
            worker_label(w.index, layout),
            w.status,
            fmt(w.step),
            fmt_metric("loss", w.loss),
            fmt_metric("lr", w.lr),
            fmt_metric("examples_per_s", w.examples_per_s),
            fmt_metric("tokens_per_s", w.tokens_per_s),
            age,
            Text(line),
        )
    parts.append(workers)
    if snap.skipped_lines:
        parts.append(
            Text(
                f"skipped {len(snap.skipped_lines)} corrupt metrics line(s) (lines {snap.skipped_lines[:5]})",
                style="yellow",
            )
        )
    for note in snap.notes:
        parts.append(Text(note, style="yellow"))
    return Group(*parts)


@contextmanager
def byte_progress(
    console: Console, label: str, *, enabled: bool
) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar with bytes and rate for long copies; nothing when output is JSON."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
