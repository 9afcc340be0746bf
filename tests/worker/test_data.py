"""Sharding is disjoint and complete; fields, templates and prefixes; bad lines are located."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuft.data import DataError, Example, Fields, batches, iter_shard, load_shard


def write_jsonl(path: Path, rows: list[object], blank_every: int = 0) -> Path:
    with path.open("w") as handle:
        for i, row in enumerate(rows):
            handle.write(json.dumps(row) + "\n")
            if blank_every and i % blank_every == 0:
                handle.write("\n")
    return path


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7])
def test_shards_are_disjoint_and_cover_the_data(tmp_path: Path, workers: int) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"source": f"s{i}", "target": f"t{i}"} for i in range(101)], blank_every=10
    )
    shards = [list(iter_shard(path, w, workers)) for w in range(workers)]
    seen = [e.source for shard in shards for e in shard]
    assert sorted(seen) == sorted(f"s{i}" for i in range(101))  # complete, no duplicates
    assert len(set(seen)) == len(seen)
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # balanced


def test_fields_templates_and_prefix(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl", [{"translation": {"s": "hello", "t": "salut"}, "q": "why", "label": 1}]
    )
    nested = load_shard(
        path, 0, 1, Fields(source_field="translation.s", target_field="translation.t", prefix="en-fr: ")
    )
    assert (nested[0].source, nested[0].target) == ("en-fr: hello", "salut")
    templated = load_shard(
        path, 0, 1, Fields(source_template="question: {q} ({translation.s})", target_template="{label}")
    )
    assert (templated[0].source, templated[0].target) == ("question: why (hello)", "1")


def test_bad_lines_are_located(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"source": "a", "target": "b"}\n{"source": "a"\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: not valid JSON: Expecting ',' delimiter \(column 15\)"):
        load_shard(path, 0, 1)
    path.write_text('{"source": "a", "tgt": "b"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:1: target: no field 'target' \(fields: source, tgt\)"):
        load_shard(path, 0, 1)


def test_batches_cycle_through_every_example_each_epoch(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"source": str(i), "target": "x"} for i in range(10)])
    shard = load_shard(path, 0, 1)
    stream = batches(shard, 5, seed=1)
    epoch = [e.source for _ in range(2) for e in next(stream)]
    assert sorted(epoch) == sorted(str(i) for i in range(10))
    assert epoch != [str(i) for i in range(10)]  # shuffled


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_started_after_consumed_examples_continue_the_stream(shuffle: bool) -> None:
    """A resumed run starts its data stream at step x local batch: it must draw exactly what the uninterrupted
    stream draws from there, wherever that falls (mid-epoch, on an epoch boundary, in a batch that wraps
    one)."""
    shard = [Example(f"s{i}", f"t{i}", i + 1) for i in range(7)]
    stream = batches(shard, 3, seed=11, shuffle=shuffle)
    whole = [e for _ in range(20) for e in next(stream)]  # 60 examples: more than 8 epochs of 7
    for consumed in range(0, 31):
        resumed = batches(shard, 3, seed=11, shuffle=shuffle, consumed=consumed)
        drawn = [next(resumed) for _ in range(5)]
        assert [len(b) for b in drawn] == [3] * 5
        assert [e for b in drawn for e in b] == whole[consumed : consumed + 15], consumed
    epochs = [whole[i : i + 7] for i in range(0, 56, 7)]
    # each epoch: every example
    assert all(sorted(e.line for e in epoch) == list(range(1, 8)) for epoch in epochs)
    assert (
        len({tuple(epoch) for epoch in epochs}) > 1
    ) == shuffle  # reshuffled every epoch, or the same order


def test_the_worker_side_imports_nothing_from_the_cli_side() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tpuft.worker.__main__, tpuft.data, tpuft.worker.torch_xla.train, "
        "tpuft.worker.metrics\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('tpuft.cli', "
        "'tpuft.ops', 'tpuft.providers', 'tpuft.fleet', 'typer', 'rich')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_bad_text_values_are_located(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    for row, fragment in [
        ({"source": "a", "target": None}, "d.jsonl:1: target field 'target' is null"),
        ({"source": "a", "target": float("nan")}, "target field 'target' is nan, not text"),
        ({"source": True, "target": "b"}, "source field 'source' is true, not text"),
        ({"source": ["a"], "target": "b"}, "source field 'source' is a JSON list, not text"),
    ]:
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(DataError, match=fragment):
            load_shard(path, 0, 1)
    path.write_text(json.dumps({"source": "a", "target": 7}) + "\n")
    assert load_shard(path, 0, 1)[0].target == "7"
