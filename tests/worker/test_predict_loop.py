"""The shared shard loop of ``tpuft predict`` (worker/predict/loop.py) and its input reader
(worker/predict_input.py).

The engine here is a fake on purpose: these tests are about the loop (shards, parts, resume, lock-step call
counts, join order, scores), and a fake that answers from the input makes every expected row computable. The
real engines are tested against a tiny model in test_predict_engines.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tpuft.config import recipe_from_text
from tpuft.core.errors import UsageError
from tpuft.data import DataError, Fields, predict_input
from tpuft.run import predict_parts
from tpuft.run.predict_job import PredictJob
from tpuft.scoring import predictions
from tpuft.worker.predict import loop as predict_loop

ROOT = Path(__file__).resolve().parents[2]
RECIPE = (ROOT / "tpuft" / "recipes" / "quickstart.yaml").read_text()  # words -> digits
CLASSIFIER = (
    ROOT / "tpuft" / "recipes" / "keras_classification_quickstart.yaml"
).read_text()  # text -> label


class Echo:
    """Predicts the digit count of its input's words ("one two" -> "2"), so half the rows match a target of
    ``str(i % 3)``; records every call's size."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.calls: list[int] = []
        self.stop_after = stop_after

    def predict(self, sources: list[str]) -> list[str]:
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise KeyboardInterrupt("killed")
        self.calls.append(len(sources))
        return [str(len(source.split())) for source in sources]

    def close(self) -> None:
        pass


def _input(path: Path, lines: int, targets: bool = True) -> Path:
    with path.open("w") as handle:
        for i in range(lines):
            item = {"words": " ".join(["w"] * (1 + i % 5))}
            if targets:
                item["digits"] = str(1 + i % 3)
            handle.write(json.dumps(item) + "\n")
            if i % 7 == 3:
                handle.write("\n")  # blank lines are no records
    return path


def _job(tmp_path: Path, source: Path, **overrides: object) -> PredictJob:
    settings: dict = dict(
        input=str(source),
        shards=str(tmp_path / "shards"),
        output=str(tmp_path / "out.jsonl"),
        backend="fake",
        model="-",
        recipe=RECIPE,
        batch_size=4,
        shard_lines=10,
    )
    settings.update(overrides)
    return PredictJob(**settings)  # type: ignore[arg-type]


def _expected(lines: int) -> list[dict]:
    return [
        predictions.row(i, " ".join(["w"] * (1 + i % 5)), str(1 + i % 5), str(1 + i % 3))
        for i in range(lines)
    ]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_process_predicts_every_shard_and_joins_in_input_order(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 25))
    engine = Echo()
    lines: list[str] = []
    summary = predict_loop.run(job, engine, say=lines.append)
    assert summary == {"shards": 3, "records": 25, "predicted": 3, "skipped": 0, "processes": 1}
    assert engine.calls == [4, 4, 2, 4, 4, 2, 4, 1]  # 10, 10, 5 records in batches of 4
    assert lines[0].startswith("[tpuft] predict shard 0: 10 examples, ")
    result = predict_parts.join(job, timeout_s=5)
    assert _read(tmp_path / "out.jsonl") == _expected(25)
    expected = _expected(25)
    truth = predictions.score([r["prediction"] for r in expected], [r["target"] for r in expected])
    assert result["rows"] == 25 and result["shards"] == 3 and result["scores"] == truth


def test_processes_call_the_engine_in_lock_step_and_share_every_shard(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 22), batch_size=2)
    engines = [Echo() for _ in range(3)]
    for process, engine in enumerate(engines):
        predict_loop.run(job, engine, process=process, processes=3, say=lambda _: None)
    assert len({len(engine.calls) for engine in engines}) == 1  # the same number of calls on every process
    # a shard of 10: parts of 4, 3, 3
    assert engines[0].calls[:2] == [2, 2] and engines[2].calls[:2] == [
        2,
        1,
    ]
    # the last shard (2 records): process 2 has none, and still calls
    assert engines[2].calls[-3:] == [
        2,
        1,
        0,
    ]
    for k in range(3):
        ids = [
            row["id"] for p in range(3) for row in _read(tmp_path / "shards" / predict_parts.part_path(k, p))
        ]
        assert sorted(ids) == list(range(10 * k, min(10 * k + 10, 22)))
    predict_parts.join(job, timeout_s=5)
    assert _read(tmp_path / "out.jsonl") == _expected(22)


def test_a_killed_job_resumes_from_its_finished_shards(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 35))
    with pytest.raises(KeyboardInterrupt):  # killed in shard 1 (calls 4-6)
        predict_loop.run(job, Echo(stop_after=4), say=lambda _: None)
    assert (tmp_path / "shards" / predict_parts.part_path(0, 0)).is_file()
    assert not (tmp_path / "shards" / predict_parts.part_path(1, 0)).exists()
    again = Echo()
    summary = predict_loop.run(job, again, say=lambda _: None)
    assert summary["skipped"] == 1 and summary["predicted"] == 3
    assert sum(again.calls) == 25  # shard 0's ten are not predicted again
    predict_parts.join(job, timeout_s=5)
    assert _read(tmp_path / "out.jsonl") == _expected(35)  # no row missing, none twice


def test_a_resume_on_other_processes_is_refused(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 5))
    predict_loop.run(job, Echo(), say=lambda _: None)
    with pytest.raises(UsageError, match="written by 1 processes, this job has 2"):
        predict_loop.run(job, Echo(), process=1, processes=2, say=lambda _: None)


def test_worker_zero_joins_once_the_others_are_done(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 12, targets=False))
    predict_loop.run(job, Echo(), process=0, processes=2, say=lambda _: None)
    late = threading.Timer(
        0.3, lambda: predict_loop.run(job, Echo(), process=1, processes=2, say=lambda _: None)
    )
    late.start()
    result = predict_parts.join(job, timeout_s=10, poll_s=0.05)
    late.join()
    rows = _read(tmp_path / "out.jsonl")
    assert [row["id"] for row in rows] == list(range(12)) and "target" not in rows[0]
    assert result["scores"] is None


def test_serve_joins_on_process_zero_and_leaves_the_summary_for_a_detached_controller(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 12))
    lines: list[str] = []
    assert predict_parts.joined(job) is None
    assert predict_loop.serve(job, Echo(), process=0, processes=1, recipe=None, say=lines.append) == 0
    summary = predict_parts.joined(job)
    assert summary is not None and summary["rows"] == 12 and summary["output"] == job.output
    assert lines[-1] == predict_loop.RESULT_PREFIX + json.dumps(summary, sort_keys=True)
    assert [row["id"] for row in _read(tmp_path / "out.jsonl")] == list(range(12))


def test_join_gives_up_on_a_missing_process(tmp_path: Path) -> None:
    job = _job(tmp_path, _input(tmp_path / "in.jsonl", 4))
    predict_loop.run(job, Echo(), process=0, processes=2, say=lambda _: None)
    with pytest.raises(Exception, match=r"processes \[1\] did not finish"):
        predict_parts.join(job, timeout_s=0.1, poll_s=0.05)


def test_classification_targets_may_be_label_indices(tmp_path: Path) -> None:
    recipe = recipe_from_text(CLASSIFIER, "c.yaml", check_files=False)
    source = tmp_path / "in.csv"
    source.write_text('text,label\ngreat film,1\n"bad, bad",negative\nmeh,positive\n')
    got = list(predict_input.records(str(source), predict_input.fields_for(recipe.data), recipe.data.labels))
    assert [(r.index, r.line, r.source, r.target) for r in got] == [
        (0, 2, "great film", "positive"),
        (1, 3, "bad, bad", "negative"),
        (2, 4, "meh", "positive"),
    ]


def test_input_formats_the_field_override_and_missing_targets(tmp_path: Path) -> None:
    fields = Fields(source_field="words", target_field="digits", prefix="n: ")
    (tmp_path / "a.tsv").write_text("words\tdigits\tother\none\t1\tx\ntwo\t2\ty\n")
    assert [(r.source, r.target) for r in predict_input.records(str(tmp_path / "a.tsv"), fields)] == [
        ("n: one", "1"),
        ("n: two", "2"),
    ]
    other = predict_input.records(str(tmp_path / "a.tsv"), Fields(source_field="words", target_field="nope"))
    assert [(r.source, r.target) for r in other] == [("one", None), ("two", None)]
    recipe = recipe_from_text(RECIPE, "q.yaml", check_files=False)
    by_field = predict_input.fields_for(recipe.data, "other")
    assert [r.source for r in predict_input.records(str(tmp_path / "a.tsv"), by_field)] == ["x", "y"]


def test_bad_lines_are_located_and_the_check_lists_them_all(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"words": "one", "digits": "1"}\nnot json\n{"digits": "3"}\n{"words": "four"}\n')
    fields = Fields(source_field="words", target_field="digits")
    with pytest.raises(DataError, match=r"in.jsonl:2: not valid JSON"):
        list(predict_input.records(str(source), fields))
    check = predict_input.check(str(source), fields)
    assert [str(p).split(": ", 1)[0][-10:] for p in check.problems] == ["in.jsonl:2", "in.jsonl:3"]
    assert "no field 'words'" in str(check.problems[1])
    assert (check.records, check.examples, check.targets) == (4, 2, 1)
    assert "unknown data format '.txt'" in str(
        predict_input.check(str(tmp_path / "in.txt"), fields).problems[0]
    )


def test_input_shards_and_output_in_a_bucket(
    gcs: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path of the job a ``gs://`` URL (the emulator): the input downloaded once and streamed, the parts
    uploaded whole, a shard finished in the bucket skipped on resume, the join uploaded once."""
    from tpuft.storage import GcsStorage

    monkeypatch.setenv("TPUFT_PREDICT_CACHE", str(tmp_path / "cache"))
    bucket = GcsStorage.from_url("gs://predict-bucket")
    bucket.ensure_bucket("us-central2")
    bucket.upload_file(_input(tmp_path / "in.jsonl", 15), "data/in.jsonl")
    job = _job(
        tmp_path,
        tmp_path,
        input="gs://predict-bucket/data/in.jsonl",
        shards="gs://predict-bucket/job/shards",
        output="gs://predict-bucket/job/out.jsonl",
    )
    checked = predict_input.check(job.input, Fields(source_field="words", target_field="digits"))
    assert (checked.records, checked.targets, checked.problems) == (15, 15, [])
    for process in range(2):
        predict_loop.run(job, Echo(), process=process, processes=2, say=lambda _: None)
    again = Echo()
    assert predict_loop.run(job, again, process=0, processes=2, say=lambda _: None)["skipped"] == 2
    assert again.calls == []
    result = predict_parts.join(job, timeout_s=5, poll_s=0.05)
    assert result["rows"] == 15 and result["scores"]["examples"] == 15
    rows = [json.loads(line) for line in (bucket.read_text("job/out.jsonl") or "").splitlines()]
    assert rows == _expected(15)
    missing = predict_input.check("gs://predict-bucket/data/nope.jsonl", Fields())
    assert "no such object" in str(missing.problems[0])
