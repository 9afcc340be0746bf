"""Every table tpuft prints fits the terminal (80 and 200 columns) without cutting what a user copies: run
ids, recipe names, worker homes. Run through the real CLI on real run dirs and a real local cluster; the width
is forced with ``$COLUMNS``, which Rich and the fast help read.

Nothing here depends on the length of the temp paths (pytest-xdist and CI use longer ones): a worker home is
checked in its column with its folded pieces joined back, and only the lines' width is held to the limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

from tests.rundirs import write_run

WIDTHS = (80, 200)
T0 = 1_800_000_000.0
RUN_IDS = (
    "quickstart-20261128-101530",
    "translation-with-a-rather-long-recipe-name-20261128-101530-2",
)


def _lines_fit(out: str, width: int) -> None:
    too_long = [line for line in out.splitlines() if len(line) > width]
    assert not too_long, f"{len(too_long)} line(s) over {width} columns:\n" + "\n".join(too_long)
    assert "…" not in out, out  # nothing is cut with an ellipsis


def _column(out: str, header: str) -> list[str]:
    """The cells of ``header``'s column in the first table of ``out``, each whole again: the lines of a row
    (after its first, whose first cell is empty) are its cells' wrapped or folded continuations, joined."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("┃") and f" {header} " in line)
    index = [cell.strip() for cell in re.split("[┃]", lines[head])[1:-1]].index(header)
    rows: list[list[str]] = []
    for line in lines[head + 1 :]:
        if not line.startswith("│"):
            if rows and line.startswith("└"):
                break
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if rows and not cells[0]:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return [row[index] for row in rows]


@pytest.fixture
def bucket_cluster(tmp_path: Path) -> Path:
    """A local cluster file whose bucket holds two finished runs (one with a long id) with metrics, an eval,
    goodput events and a cost: every column of ``runs`` and ``goodput`` has something to show."""

    def ev(kind: str, t: float, s: float, **extra: object) -> dict[str, object]:
        return {"kind": kind, "t": T0 + t, "s": s, "attempt": 1, **extra}

    timeline = [ev("provision", 0, 60), ev("startup", 60, 30, step=0)]
    timeline += [ev("steps", 90 + i * 30, 30, from_step=i * 10, to_step=i * 10 + 10) for i in range(10)]
    timeline += [ev("checkpoint_save", 400, 12), ev("eval", 420, 9)]
    for run_id in RUN_IDS:
        write_run(
            tmp_path / "bucket" / "runs" / run_id,
            info={
                "recipe": run_id.rsplit("-2026", 1)[0],
                "backend": "torch_xla",
                "workers": 2,
                "total_steps": 150,
                "status": "finished",
                "started": T0 + 60,
                "ended": T0 + 460,
                "accelerator": "v5litepod-8",
                "pricing": "spot",
                "attempts": [{"attempt": 1, "started": T0 + 60, "ended": T0 + 460}],
            },
            metrics=[{"step": s, "loss": 1.0 / s, "lr": 1e-3} for s in range(10, 151, 10)]
            + [{"step": 150, "eval_loss": 1.0, "eval_exact_match": 0.9}],
            files={
                "events/worker-0-attempt-1.jsonl": "".join(
                    json.dumps(e) + "\n" for e in timeline[1:]
                ).encode(),
                f"events/controller/{int(T0 * 1000)}-provision.json": json.dumps(timeline[0]).encode(),
            },
        )
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"provider: local\nbucket: {tmp_path / 'bucket'}\n")
    return cluster


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("verb", ["runs", "goodput"])
def test_runs_and_goodput_show_every_run_id_whole_within_the_width(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch, bucket_cluster: Path, verb: str, width: int
) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    result = cli(verb, "-c", str(bucket_cluster))
    assert result.code == 0, result.err
    _lines_fit(result.out, width)
    for run_id in RUN_IDS:  # on one line, as monitor, resume, pull, convert and predict take it
        assert any(run_id in line for line in result.out.splitlines()), (run_id, result.out)
    assert _column(result.out, "run")[: len(RUN_IDS)] == list(RUN_IDS)
    if width == 80:  # what did not fit is named, not cut
        assert "not shown at 80 columns:" in result.out


@pytest.mark.parametrize("width", WIDTHS)
def test_status_shows_each_worker_home_whole_within_the_width(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch, cluster_file: Path, width: int
) -> None:
    assert cli("create", "-c", str(cluster_file)).code == 0
    homes = [w["home"] for w in json.loads(cli("status", "-c", str(cluster_file), "--json").out)["workers"]]
    assert len(homes) == 2 and homes[0] != homes[1]
    monkeypatch.setenv("COLUMNS", str(width))
    result = cli("status", "-c", str(cluster_file))
    assert result.code == 0, result.err
    _lines_fit(result.out, width)
    assert _column(result.out, "home") == homes  # whatever the temp path's length: folded at worst, never cut
    assert _column(result.out, "worker") == ["0", "1"]


@pytest.mark.parametrize("width", WIDTHS)
def test_recipes_ls_shows_every_recipe_name_whole_within_the_width(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    names = [r["name"] for r in json.loads(cli("recipes", "ls", "--json").out)]
    assert names
    monkeypatch.setenv("COLUMNS", str(width))
    result = cli("recipes", "ls")
    assert result.code == 0, result.err
    _lines_fit(result.out, width)
    assert _column(result.out, "recipe") == names
    lines = result.out.splitlines()
    assert all(any(f"│ {name} " in line for line in lines) for name in names)  # each on one line


@pytest.mark.parametrize("width", WIDTHS)
def test_help_fits_the_width(cli, monkeypatch: pytest.MonkeyPatch, width: int) -> None:  # type: ignore[no-untyped-def]
    """The top-level help (the fast launcher's, without Typer) and every verb's own (Typer's)."""
    from tpuft.commands import RECIPE_VERBS, VERBS

    fast = subprocess.run(
        [sys.executable, "-m", "tpuft", "--help"],
        env={**os.environ, "COLUMNS": str(width)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    _lines_fit(fast, width)
    assert all(re.search(rf"^  {v.name} +{re.escape(v.summary)}$", fast, re.M) for v in VERBS), fast
    assert "tpuft up quickstart" in fast
    monkeypatch.setenv("COLUMNS", str(width))
    for args in [[v.name] for v in VERBS] + [["recipes", v.name] for v in RECIPE_VERBS]:
        shown = cli(*args, "--help")
        assert shown.code == 0, (args, shown.err)
        _lines_fit(shown.out, width)


def test_a_copy_cell_longer_than_the_line_folds_whole_and_less_needed_columns_give_way() -> None:
    from rich.console import Console

    from tpuft.cli.tables import Col, FitTable

    path = "/" + "/".join(f"folder-{i:02d}" for i in range(12))  # 120 characters, no space to wrap at
    table = FitTable(Col("worker", copy=True), Col("home", copy=True), Col("cpus", drop=1), Col("note"))
    table.add_row("0", path, "0,1,2,3", "a note that wraps between its words")
    out = StringIO()
    Console(file=out, width=80, color_system=None).print(table)
    text = out.getvalue()
    _lines_fit(text, 80)
    assert _column(text, "home") == [path] and _column(text, "worker") == ["0"]
    assert "0,1,2,3" not in text and "not shown at 80 columns: cpus" in text
    assert _column(text, "note")[0].replace(" ", "") == "anotethatwrapsbetweenitswords"  # wrapped, not cut
