"""Data files are read through on the controller before anything is created or launched: every problem located
at file:line with the recipe key, exit 2, in seconds and without holding the file in memory."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError
from tpuft.ops.preflight import preflight

RECIPE = """\
name: t
backend:
  kind: torch_xla
model:
  config: {d_model: 16}
data:
  train: train.jsonl
  eval: eval.jsonl
  source_field: q
  target_field: a
train:
  steps: 10
  batch_size: 4
"""

GOOD_LINE = '{"q": "one", "a": "1"}\n'


@pytest.fixture
def setup(tmp_path: Path, cluster_file: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "train.jsonl").write_text(GOOD_LINE * 4)
    (tmp_path / "eval.jsonl").write_text(GOOD_LINE * 2)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)

    def check(
        train: bytes | None = None, eval_: bytes | None = None, overrides: list[str] | None = None
    ) -> str:
        if train is not None:
            (tmp_path / "train.jsonl").write_bytes(train)
        if eval_ is not None:
            (tmp_path / "eval.jsonl").write_bytes(eval_)
        with pytest.raises(ConfigError) as info:
            preflight(load_cluster(cluster_file).value, load_recipe(recipe, overrides or []))
        return str(info.value)

    return tmp_path, recipe, check


# train.jsonl bytes -> problem at line
BAD_TRAIN = [
    (
        b'{"q": "x", "a": "1"}\n{"q": "y" "a": "2"}\n',
        2,
        "not valid JSON: Expecting ',' delimiter (column 11)",
    ),
    (b'{"q": "x", "a": "1"}\n{"q": "y"}\n', 2, "target: no field 'a' (fields: q)"),
    (b'{"q": "x", "a": "1"}\n{"Q": "y", "a": "2"}\n', 2, "source: no field 'q' (fields: Q, a)"),
    (b'{"q": "caf\xe9", "a": "1"}\n', 1, "not UTF-8: byte 0xe9 at column 11"),
    (b'\xef\xbb\xbf{"q": "x", "a": "1"}\n', 1, "the file starts with a byte-order mark (U+FEFF)"),
    (b'{"q": "x", "a": null}\n', 1, "target field 'a' is null"),
    (b'{"q": "x", "a": NaN}\n', 1, "target field 'a' is nan, not text"),
    (b'{"q": "x", "a": true}\n', 1, "target field 'a' is true, not text"),
    (b'{"q": ["x"], "a": "1"}\n', 1, "source field 'q' is a JSON list, not text"),
    (b'{"q": {"x": 1}, "a": "1"}\n', 1, "source field 'q' is a JSON object, not text"),
    (b'["q", "a"]\n', 1, "expected a JSON object, got a list"),
    (b'"just a string"\n', 1, "expected a JSON object, got a string"),
    (b"\x00\x01\x02\n", 1, "contains a NUL byte (is the file UTF-16?"),
    ('{"q": "x", "a": "1"}\n'.encode("utf-16-le"), 1, "contains a NUL byte"),
    (b"[" * 100_000 + b"\n", 1, "not valid JSON: nested too deeply"),
]


@pytest.mark.parametrize(("data", "line", "fragment"), BAD_TRAIN, ids=[b[2][:35] for b in BAD_TRAIN])
def test_bad_lines_are_located(setup, data: bytes, line: int, fragment: str) -> None:  # type: ignore[no-untyped-def]
    folder, _, check = setup
    text = check(train=data + GOOD_LINE.encode() * 4)
    assert f"{folder / 'train.jsonl'}:{line}: data.train: {fragment}" in text, text


def test_templates_are_checked_against_the_data(setup) -> None:  # type: ignore[no-untyped-def]
    folder, _, check = setup
    # no line has it: the recipe is wrong
    text = check(overrides=["data.source_template='question: {nosuchfield}'"])
    assert (
        f"--set data.source_template='question: {{nosuchfield}}': data.source_template: no line of "
        f"{folder / 'train.jsonl'} has a field 'nosuchfield' (they have: q, a)" in text
    )
    text = check(train=b'{"q": "x", "a": "1"}\n{"a": "2"}\n' * 2)  # some lines lack it: the data is wrong
    assert f"{folder / 'train.jsonl'}:2: data.train: source: no field 'q' (fields: a)" in text
    text = check(overrides=["data.source_template={q:>{a}}"], train=b'{"q": "x", "a": "wide"}\n' * 4)
    assert "source template: Invalid format specifier" in text


def test_numbers_are_text_but_null_is_not(setup) -> None:  # type: ignore[no-untyped-def]
    folder, recipe, check = setup
    (folder / "train.jsonl").write_text('{"q": "x", "a": 1}\n{"q": "y", "a": 2.5}\n' * 2)
    report = preflight(load_cluster(None).value, load_recipe(recipe))
    assert report.examples("train") == 4
    assert "source template: field 'a' is null" in check(
        overrides=["data.source_template={q} {a}"], train=b'{"q": "x", "a": null}\n' * 4
    )


def test_an_empty_eval_file_is_refused(setup) -> None:  # type: ignore[no-untyped-def]
    """It used to end with exit 0 and a perfect 0.0000 eval loss that `runs` showed as the best eval."""
    folder, recipe, check = setup
    text = check(eval_=b"\n  \n")
    assert f"{recipe}:8: data.eval: {folder / 'eval.jsonl'} has no examples" in text


def test_too_few_train_examples_for_the_workers(setup) -> None:  # type: ignore[no-untyped-def]
    folder, recipe, check = setup
    text = check(train=GOOD_LINE.encode())
    assert f"{recipe}:7: data.train: {folder / 'train.jsonl'} has 1 example(s) for 2 workers" in text


def test_a_systematic_problem_is_listed_ten_times_then_counted(setup) -> None:  # type: ignore[no-untyped-def]
    _, _, check = setup
    text = check(train=GOOD_LINE.encode() * 4 + b'{"q": "x"}\n' * 250)
    assert text.count("no field 'a'") == 10
    assert "... and 240 more problem(s) like these" in text


def test_every_problem_at_once_with_the_batch_split(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, recipe, _ = setup
    (tmp_path / "train.jsonl").write_text('{"q": "x"}\n' + GOOD_LINE * 3)
    (tmp_path / "eval.jsonl").write_text("")
    three = tmp_path / "three.yaml"
    three.write_text("local:\n  workers: 3\n")
    with pytest.raises(ConfigError) as info:
        preflight(load_cluster(three).value, load_recipe(recipe))
    assert len(info.value.problems) == 3  # batch 4 over 3 workers, the bad line, the empty eval file


def test_a_big_file_is_streamed(tmp_path: Path, cluster_file: Path) -> None:
    """~50 MB checked in seconds with memory for one line at a time (tracemalloc sees Python's
    allocations)."""
    line = json.dumps({"q": "four thousand two hundred seven " * 4, "a": "4207"}) + "\n"
    count = 50_000_000 // len(line)
    with (tmp_path / "train.jsonl").open("w") as handle:
        for _ in range(count // 1000):
            handle.write(line * 1000)
    (tmp_path / "eval.jsonl").write_text(line)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE)
    tracemalloc.start()
    started = time.monotonic()
    try:
        report = preflight(load_cluster(cluster_file).value, load_recipe(recipe))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.examples("train") == count // 1000 * 1000
    assert peak < 5 * 1024 * 1024
    assert time.monotonic() - started < 30


def test_validate_train_and_up_refuse_before_creating_anything(setup, cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    import os

    folder, recipe, _ = setup
    (folder / "train.jsonl").write_text('{"q": "x", "a": null}\n' * 4)
    home = Path(os.environ["TPUFT_HOME"])
    for verb in ("recipes validate", "train", "up"):
        result = (
            cli(*verb.split(), str(recipe), "--config", str(cluster_file), "--yes")
            if verb == "up"
            else cli(*verb.split(), str(recipe), "--config", str(cluster_file))
        )
        assert result.code == 2, (verb, result.err)
        assert f"{folder / 'train.jsonl'}:1: data.train: target field 'a' is null" in result.err
        assert "Traceback" not in result.err
        assert not (home / "local").exists()  # no cluster, no worker folders, no run dir
        assert not (home / "buckets").exists()
