"""Every data format (JSON lines, CSV, TSV, Parquet; gzipped text; local or gs://) read by the one reader
every backend uses: the same examples as the JSON-lines file of the same rows, the same located problems,
streamed."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.ops.test_preflight import RECIPE as PREFLIGHT_RECIPE
from tpuft import data as data_mod
from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError
from tpuft.data import DataError, Fields, check_file, iter_records, iter_shard, load_shard
from tpuft.data.text_transforms import text_transform
from tpuft.ops.preflight import preflight

ROWS: list[dict[str, Any]] = [
    {"title": "Why, oh why?", "body": 'a "quoted" word', "label": "1"},
    {"title": "Second", "body": "two  spaced   words", "label": "0"},
    {"title": "skip me", "body": "dropped by the hook", "label": "0"},
    {"title": "Café", "body": "naïve façade", "label": "1"},
    {"title": "It's", "body": "an apostrophe ' alone", "label": "0"},
    {"title": "Last", "body": "comma, and semicolon;", "label": "1"},
]
"""Quotes, commas, an apostrophe, accents, runs of spaces: what trips a delimited reader (no tab or newline
inside a value: TSV as GLUE writes it has neither)."""


def _hook(record: dict[str, Any]) -> dict[str, Any] | None:
    return None if record["title"] == "skip me" else {**record, "title": record["title"].upper()}


FIELDS = Fields(
    source_template="{title}: {body}",
    target_field="label",
    prefix="classify: ",
    source_transform=text_transform(["collapse_whitespace"]),
    preprocess=_hook,
    preprocess_name="t:_hook",
)


def write(path: Path, rows: list[dict[str, Any]], row_group_size: int | None = None) -> Path:
    """``rows`` in the format ``path``'s suffix names."""
    name = path.name.removesuffix(".gz")
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    elif name.endswith(".jsonl"):
        with opener(path, "wt", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    elif name.endswith(".tsv"):  # as GLUE writes it: values as they are, a tab between
        with opener(path, "wt", encoding="utf-8", newline="") as out:
            out.writelines(
                "\t".join(map(str, values)) + "\n" for values in [list(rows[0]), *map(dict.values, rows)]
            )
    else:
        with opener(path, "wt", encoding="utf-8", newline="") as out:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(list(rows[0]))
            writer.writerows([list(row.values()) for row in rows])
    return path


FORMATS = ["rows.csv", "rows.tsv", "rows.parquet", "rows.jsonl.gz", "rows.csv.gz", "rows.tsv.gz"]


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_gives_the_json_lines_examples(tmp_path: Path, name: str) -> None:
    expected = [(e.source, e.target) for e in load_shard(write(tmp_path / "rows.jsonl", ROWS), 0, 1, FIELDS)]
    assert expected[0] == ('classify: WHY, OH WHY?: a "quoted" word', "1") and len(expected) == 5
    path = write(tmp_path / name, ROWS)
    assert [(e.source, e.target) for e in load_shard(path, 0, 1, FIELDS)] == expected
    shards = [[(e.source, e.target) for e in iter_shard(path, w, 2, FIELDS)] for w in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(expected) and shards[0] and shards[1]
    first_line = 1 if ".parquet" in name or ".jsonl" in name else 2  # a CSV/TSV header is line 1
    assert [line for line, _ in iter_records(path)] == list(range(first_line, first_line + len(ROWS)))
    check = check_file(path, FIELDS)
    assert (check.examples, check.dropped, check.problems) == (5, 1, [])


def test_data_format_names_a_file_the_suffix_does_not(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.tsv", ROWS).rename(tmp_path / "rows.txt")
    with pytest.raises(DataError, match=r"rows.txt: unknown data format '.txt': .* or set data.format"):
        list(iter_records(path))
    fields = Fields(source_field="title", target_field="label", data_format="tsv")
    assert [e.source for e in load_shard(path, 0, 1, fields)][:2] == ["Why, oh why?", "Second"]


def test_tsv_is_glue_s_no_quoting_and_csv_is_rfc_4180(tmp_path: Path) -> None:
    tsv = tmp_path / "q.tsv"
    tsv.write_text('sentence\tlabel\n"quoted at the start\t1\na "" doubled\t0\n')
    assert [r["sentence"] for _, r in iter_records(tsv)] == ['"quoted at the start', 'a "" doubled']
    quoted = tmp_path / "q.csv"
    quoted.write_text('sentence,label\n"two\nlines, one value",1\n"a ""quote""",0\n')
    assert list(iter_records(quoted)) == [
        (2, {"sentence": "two\nlines, one value", "label": "1"}),
        (4, {"sentence": 'a "quote"', "label": "0"}),
    ]
    excel = tmp_path / "excel.csv"
    # a spreadsheet's byte-order mark
    excel.write_bytes("\ufeffsentence,label\r\nwindows lines,1\r\n".encode())
    assert list(iter_records(excel)) == [(2, {"sentence": "windows lines", "label": "1"})]


# (file name, content, line, problem)
BAD_ROW = [
    (
        "bad.jsonl",
        '{"title": "a", "label": "1"}\n{"title": "b" "label": "0"}\n',
        2,
        "not valid JSON: Expecting ',' delimiter (column 15)",
    ),
    (
        "bad.csv",
        "title,label\na,1\nb,0,extra\n",
        3,
        "has 3 column(s), the header 2 (an unquoted comma inside a value?)",
    ),
    ("bad.tsv", "title\tlabel\na\t1\nb\tc\t0\n", 3, "has 3 column(s), the header 2 (a tab inside a value?)"),
    (
        "bad.parquet",
        [{"title": "a", "label": "1"}, {"title": "b", "label": None}],
        2,
        "target field 'label' is null",
    ),
]


@pytest.mark.parametrize("name,content,line,problem", BAD_ROW, ids=[row[0] for row in BAD_ROW])
def test_a_bad_row_is_located_and_the_check_goes_on(
    tmp_path: Path, name: str, content: Any, line: int, problem: str
) -> None:
    path = tmp_path / name
    if isinstance(content, list):
        write(path, content)
    else:
        path.write_text(content)
    fields = Fields(source_field="title", target_field="label")
    with pytest.raises(DataError) as info:
        load_shard(path, 0, 1, fields)
    assert str(info.value) == f"{path}:{line}: {problem}"
    check = check_file(path, fields)
    assert check.examples == 1 and [str(p) for p in check.problems] == [f"{path}:{line}: {problem}"]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.csv", "rows.tsv", "rows.parquet"])
def test_a_missing_column_is_named_with_the_ones_there(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / name, ROWS)
    check = check_file(path, Fields(source_field="text", target_field="label"))
    first = 1 if name.endswith((".jsonl", ".parquet")) else 2
    assert check.examples == 0 and check.missing == {("source", "text")}
    assert str(check.problems[0]) == f"{path}:{first}: source: no field 'text' (fields: title, body, label)"


def test_whole_file_problems(tmp_path: Path) -> None:
    fields = Fields(source_field="title", target_field="label")
    cases = {
        "header.csv": ("title,title\na,b\n", "header.csv:1: the header names column 'title' twice"),
        "broken.csv": ('title,label\n"open,1\n', "broken.csv:2: not valid CSV: unexpected end of data"),
        "latin.tsv": (
            "title\tlabel\ncaf\xe9\t1\n".encode("latin-1"),
            "latin.tsv:2: not UTF-8: byte 0xe9 at column 4",
        ),
        "notparquet.parquet": ("title,label\n", "notparquet.parquet: not a Parquet file"),
        "x.parquet.gz": ("", "x.parquet.gz: a Parquet file compresses its own columns: do not gzip it"),
    }
    for name, (content, problem) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        (found,) = check_file(path, fields).problems
        assert str(found).startswith(str(tmp_path / problem)), (name, str(found))


def test_a_parquet_file_streams_a_row_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"title": f"t{i}", "label": str(i % 2)} for i in range(2500)]
    path = write(tmp_path / "big.parquet", rows, row_group_size=1000)
    assert pq.ParquetFile(path).num_row_groups == 3
    calls: list[tuple[list[int], int]] = []
    real = pq.ParquetFile.iter_batches

    def spy(
        self: pq.ParquetFile, batch_size: int = 65536, row_groups: list[int] | None = None, **kw: Any
    ) -> Any:
        calls.append((list(row_groups or []), batch_size))
        return real(self, batch_size=batch_size, row_groups=row_groups, **kw)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    fields = Fields(source_field="title", target_field="label")
    shards = [list(iter_shard(path, w, 3, fields)) for w in range(3)]
    assert calls == [([group], data_mod.PARQUET_BATCH) for group in range(3)] * 3
    assert sorted(e.line for shard in shards for e in shard) == list(range(1, 2501))
    assert [e.source for e in shards[1][:2]] == ["t1", "t4"]


RECIPE = PREFLIGHT_RECIPE.replace(
    "  train: train.jsonl\n  eval: eval.jsonl\n  source_field: q\n  target_field: a\n",
    "  train: train.csv\n  eval: eval.parquet\n  test: test.tsv\n  source_field: title\n  target_field: "
    "label\n",
)
assert "test.tsv" in RECIPE


def test_the_controller_checks_each_format_before_launch(tmp_path: Path, cluster_file: Path) -> None:
    write(tmp_path / "train.csv", ROWS)
    write(tmp_path / "eval.parquet", ROWS[:2])
    write(tmp_path / "test.tsv", ROWS[:3])
    (tmp_path / "r.yaml").write_text(RECIPE)
    cluster = load_cluster(cluster_file).value
    checked = preflight(cluster, load_recipe(tmp_path / "r.yaml"))
    assert [checked.examples(key) for key in ("train", "eval", "test")] == [6, 2, 3]

    def refused(overrides: list[str]) -> str:
        with pytest.raises(ConfigError) as info:
            preflight(cluster, load_recipe(tmp_path / "r.yaml", overrides))
        return str(info.value)

    (tmp_path / "test.tsv").write_text("title\tlabel\n")  # a header and no row
    write(tmp_path / "bad.csv", ROWS[:2]).write_text((tmp_path / "bad.csv").read_text() + "x,y,1,2\n")
    (tmp_path / "train.json5").write_text("{}")
    text = refused(["data.train=bad.csv"])
    assert f"{tmp_path / 'bad.csv'}:4: data.train: has 4 column(s), the header 3" in text
    assert f"{tmp_path / 'r.yaml'}:9: data.test: {tmp_path / 'test.tsv'} has no examples" in text
    assert "--set data.train=train.json5: data.train: unknown data format '.json5'" in refused(
        ["data.train=train.json5"]
    )
    (tmp_path / "r.yaml").write_text(RECIPE.replace("train.csv", "train.json5"))
    assert f"{tmp_path / 'r.yaml'}:7: data.train: unknown data format '.json5'" in refused([])


def test_gs_data_files_are_checked_and_read_through_the_storage_layer(
    gcs: object, tmp_path: Path, cluster_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuft.storage import GcsStorage

    monkeypatch.setenv("TPUFT_PREDICT_CACHE", str(tmp_path / "cache"))
    bucket = GcsStorage.from_url("gs://data-bucket")
    bucket.ensure_bucket("us-central2")
    bucket.upload_file(write(tmp_path / "up.tsv", ROWS), "glue/train.tsv")
    bucket.upload_file(write(tmp_path / "up.parquet", ROWS[:2]), "glue/eval.parquet")
    url = "gs://data-bucket/glue/train.tsv"
    fields = Fields(source_field="title", target_field="label")
    assert [(e.source, e.line) for e in iter_shard(url, 1, 2, fields)] == [
        ("Second", 3),
        ("Café", 5),
        ("Last", 7),
    ]
    (tmp_path / "r.yaml").write_text(
        RECIPE.replace("train.csv", url)
        .replace("eval.parquet", "gs://data-bucket/glue/eval.parquet")
        .replace("  test: test.tsv\n", "")
    )
    recipe = load_recipe(tmp_path / "r.yaml")
    assert recipe.value.data.train == url  # kept as the URL: nothing to ship, the workers read the bucket
    checked = preflight(load_cluster(cluster_file).value, recipe)
    assert (checked.examples("train"), checked.examples("eval")) == (6, 2)
    gone = check_file("gs://data-bucket/glue/dev.tsv", fields)
    assert [str(p) for p in gone.problems] == ["gs://data-bucket/glue/dev.tsv: no such object"]
    bad = load_recipe(tmp_path / "r.yaml", ["data.eval=gs://data-bucket/glue/dev.tsv"])
    with pytest.raises(ConfigError, match="gs://data-bucket/glue/dev.tsv: data.eval: no such object"):
        preflight(load_cluster(cluster_file).value, bad)


def test_a_gs_data_file_is_not_shipped_and_a_local_one_keeps_its_suffix(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from tpuft.backends.spec import LaunchPlan
    from tpuft.ops.ship_data import ship_data, shipped_data

    write(tmp_path / "train.tsv", ROWS)
    (tmp_path / "r.yaml").write_text(
        RECIPE.replace("eval.parquet", "gs://data-bucket/glue/eval.parquet")
        .replace("  test: test.tsv\n", "")
        .replace("train.csv", "train.tsv")
    )
    recipe = load_recipe(tmp_path / "r.yaml").value
    plan = LaunchPlan(workers=(0, 1))
    puts: list[tuple[Path, str]] = []
    fleet = SimpleNamespace(put=lambda local, remote, workers: puts.append((local, remote)))
    shipped = ship_data(SimpleNamespace(fleet=fleet), recipe, "run-1", plan)
    assert puts == [(tmp_path / "train.tsv", ".tpuft/data/run-1/train-train.tsv")]
    assert (str(shipped.data.train), shipped.data.eval) == (puts[0][1], "gs://data-bucket/glue/eval.parquet")
    assert shipped_data(recipe, plan) == {"train": str(tmp_path / "train.tsv")}
