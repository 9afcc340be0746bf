"""``tpuft predict`` on the controller, without a model: the source a run resolves to, the input's located
errors and OUT's rules (refused unless --resume of the same job or --overwrite), all before anything is
launched; and the progress read from a shards folder. The predictions themselves:
tests/e2e/test_predict.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rundirs import write_run
from tpuft.backends.registry import layout
from tpuft.config import load_cluster, load_recipe
from tpuft.core.paths import recipes_dir
from tpuft.ops import predict as ops
from tpuft.ops import predict_shards as shards_ops
from tpuft.readers.runs import run_storage
from tpuft.run.predict_job import JOB_FILE

QUICKSTART = (recipes_dir() / "quickstart.yaml").read_text()
RUN_ID = "quickstart-20261126-010000-0001"


def make_run(
    cluster_file: Path,
    *,
    steps: tuple[int, ...] = (500, 1000),
    evals: dict[int, float] | None = None,
    keep_best: bool = False,
    export: bool = False,
) -> Path:
    """A finished PyTorch/XLA run with complete checkpoints at ``steps`` (and a half-written one after
    them)."""
    run = Path(run_storage(load_cluster(cluster_file).value).url) / "runs" / RUN_ID
    recipe = QUICKSTART.replace("train:\n", f"train:\n  keep_best: {str(keep_best).lower()}\n", 1)
    metrics = [{"step": step, "eval_exact_match": value} for step, value in (evals or {}).items()]
    # no manifest: incomplete
    files = {
        "recipe.yaml": recipe.encode(),
        "checkpoints/step_00009999/config.json": b"{}",
    }
    if export:
        files["export/hf/config.json"] = b"{}"
    write_run(
        run,
        info={"backend": "torch_xla", "status": "finished", "recipe": "quickstart"},
        metrics=metrics,
        files=files,
    )
    for step in steps:
        folder = run / "checkpoints" / f"step_{step:08d}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        layout("torch_xla").write_manifest(folder)
    return run


def flags(resume: bool = False, overwrite: bool = False) -> dict[str, bool]:
    return {"resume": resume, "overwrite": overwrite}


def options(tmp_path: Path, **changes: object) -> ops.PredictOptions:
    return ops.PredictOptions(input=str(tmp_path / "in.jsonl"), output=str(tmp_path / "out.jsonl"), **changes)  # type: ignore[arg-type]


def test_a_run_predicts_with_its_last_complete_checkpoint_or_its_best_under_keep_best(
    cluster_file: Path, tmp_path: Path
) -> None:
    config = load_cluster(cluster_file).value
    run = make_run(cluster_file, evals={500: 0.9, 1000: 0.8})
    last = ops.resolve_source(config, "quickstart", options(tmp_path))
    assert (last.kind, last.backend, last.step) == ("run", "torch_xla", 1000)
    assert last.model == f"{run}/checkpoints/step_00001000"  # not the half-written step 9999

    (run / "recipe.yaml").write_text(QUICKSTART.replace("train:\n", "train:\n  keep_best: true\n", 1))
    best = ops.resolve_source(config, RUN_ID[:12], options(tmp_path))
    assert best.step == 500 and "best eval: eval_exact_match = 0.9 at step 500" in best.notes

    # newer, not a model
    write_run(run.parent / "predict-quickstart-20261126-020000-0001", info={"job": "predict"})
    assert ops.resolve_source(config, "latest", options(tmp_path)).run.id == RUN_ID  # type: ignore[union-attr]
    folder = ops.resolve_source(config, str(run / "checkpoints" / "step_00000500"), options(tmp_path))
    assert (folder.kind, folder.backend, folder.step, folder.run.id) == (
        "checkpoint",
        "torch_xla",
        500,
        RUN_ID,
    )  # type: ignore[union-attr]


def test_refusals_before_anything_is_launched(cli, cluster_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    make_run(cluster_file, steps=())
    (tmp_path / "in.jsonl").write_text('{"words": "one", "digits": "1"}\n')
    base = [
        "predict",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out.jsonl"),
        "-c",
        str(cluster_file),
    ]

    result = cli(*base[:1], RUN_ID, *base[1:])
    assert result.code == 2 and f"run {RUN_ID} has no complete checkpoint" in result.err

    result = cli(*base[:1], str(tmp_path / "nowhere/step_1"), *base[1:])
    assert result.code == 2 and "no such folder" in result.err

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    result = cli(*base[:1], str(hf), *base[1:])
    assert result.code == 2 and "give the recipe" in result.err and "--recipe" in result.err

    result = cli(*base[:1], str(hf), *base[1:], "--local", "--detach")
    assert result.code == 2 and "give one" in result.err
    runs = Path(run_storage(load_cluster(cluster_file).value).url) / "runs"
    assert [p.name for p in runs.iterdir()] == [RUN_ID]  # no predict run was made


def test_every_bad_input_line_is_located_before_anything_starts(
    cli, cluster_file: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    make_run(cluster_file)
    bad = tmp_path / "in.jsonl"
    bad.write_text('{"words": "one", "digits": "1"}\nnot json\n{"digits": "3"}\n{"words": "four"}\n')
    result = cli(
        "predict",
        RUN_ID,
        "--input",
        str(bad),
        "--output",
        str(tmp_path / "out.jsonl"),
        "-c",
        str(cluster_file),
    )
    assert result.code == 2, result.err
    assert f"{bad}:2:" in result.err and f"{bad}:3:" in result.err and "words" in result.err
    assert f"{bad}:4" not in result.err  # a line without a target is predicted, not refused
    assert not (tmp_path / "out.jsonl.shards").exists()

    result = cli(
        "predict",
        RUN_ID,
        "--input",
        str(bad),
        "--output",
        str(tmp_path / "o.jsonl"),
        "--field",
        "digits",
        "-c",
        str(cluster_file),
        "--json",
    )
    # only the line that is no JSON
    assert result.code == 2 and f"{bad}:2:" in json.loads(result.out)["error"]


def test_an_existing_output_needs_resume_of_the_same_job_or_overwrite(
    cluster_file: Path, tmp_path: Path
) -> None:
    from tpuft.core.errors import UsageError

    config = load_cluster(cluster_file).value
    make_run(cluster_file)
    given = options(tmp_path)
    source = ops.resolve_source(config, RUN_ID, given)
    output = str(tmp_path / "out.jsonl")

    def job(**changes: object) -> object:
        settings = {
            "model": source.model,
            "backend": source.backend,
            "input_url": given.input,
            "shards": shards_ops.default_shards(output),
            "output": None,
            "total": 3,
        }
        return ops.make_job(source, ops.PredictOptions(**{**given.__dict__, **changes}), **settings)  # type: ignore[arg-type]

    first = job()
    assert shards_ops.claim_output(first, output, **flags()) == 0  # type: ignore[arg-type]
    assert json.loads((tmp_path / "out.jsonl.shards" / JOB_FILE).read_text())["model"] == source.model
    part = tmp_path / "out.jsonl.shards" / "shard-000000" / "predictions-00000.jsonl"
    part.parent.mkdir()
    part.write_text('{"id": 0}\n')
    (tmp_path / "out.jsonl.shards" / "processes.json").write_text('{"processes": 1}')

    with pytest.raises(UsageError, match="an unfinished job's shards.* exists"):
        shards_ops.claim_output(first, output, **flags())  # type: ignore[arg-type]
    assert shards_ops.claim_output(first, output, **flags(resume=True)) == 1  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"another job's shards \(num_beams, shard_lines differ\)"):
        shards_ops.claim_output(job(num_beams=4, shard_lines=7), output, **flags(resume=True))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="give one"):
        shards_ops.claim_output(first, output, **flags(resume=True, overwrite=True))  # type: ignore[arg-type]

    assert shards_ops.claim_output(job(num_beams=4), output, **flags(overwrite=True)) == 0  # type: ignore[arg-type]
    assert not part.exists()  # the earlier job's shards are gone

    Path(output).write_text("{}\n")
    (tmp_path / "out.jsonl.shards" / JOB_FILE).unlink()
    with pytest.raises(UsageError, match="out.jsonl exists"):
        shards_ops.claim_output(first, output, **flags())  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="no shards of the job that wrote it"):
        shards_ops.claim_output(first, output, **flags(resume=True))  # type: ignore[arg-type]


def test_progress_counts_the_examples_of_the_parts_written(tmp_path: Path) -> None:
    from tpuft.storage import open_storage

    shards = tmp_path / "s"
    for shard, parts in ((0, 2), (1, 1), (2, 0)):
        for process in range(parts):
            path = shards / f"shard-{shard:06d}" / f"predictions-{process:05d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    (shards / "shard-000001" / "predictions-00001.jsonl.tmp").write_text("")  # being written: not counted
    found = shards_ops.finished_shards(open_storage(str(shards)))
    assert found == {0: 2, 1: 1}
    recipe = load_recipe(recipes_dir() / "quickstart.yaml", check_files=False).value
    source = ops.Source("hf", ops.HF_ENGINE, "m", recipe, QUICKSTART)
    job = ops.make_job(
        source,
        ops.PredictOptions(input="i.jsonl", output="o.jsonl", shard_lines=10),
        model="m",
        backend="hf",
        input_url="i.jsonl",
        shards=str(shards),
        output=None,
        total=25,
    )
    assert shards_ops.examples_done(job, found) == 10 + 5
    assert shards_ops.examples_done(job, {0: 2, 1: 2, 2: 2}) == 25


def test_local_needs_a_hugging_face_model(cluster_file: Path, tmp_path: Path) -> None:
    from tpuft.core.errors import UsageError

    config = load_cluster(cluster_file).value
    run = make_run(cluster_file)
    source = ops.resolve_source(config, RUN_ID, options(tmp_path))
    with pytest.raises(UsageError, match=f"{RUN_ID} has none") as refused:
        ops.hf_model_for_local(source, None)
    assert f"tpuft convert --run {RUN_ID}" in str(refused.value.hint)
    (run / "export" / "hf").mkdir(parents=True)
    (run / "export" / "hf" / "config.json").write_text("{}")
    assert ops.hf_model_for_local(source, None) == f"{run}/export/hf"
    export = ops.resolve_source(config, f"{run}/export/hf", options(tmp_path))
    assert (export.kind, export.backend, export.run.id) == ("hf", ops.HF_ENGINE, RUN_ID)  # type: ignore[union-attr]


def test_runs_count_a_predict_jobs_examples_over_its_workers(tmp_path: Path) -> None:
    from tpuft.readers.runs import snapshot

    run = tmp_path / "predict-quickstart-20261126-010000-0002"
    write_run(
        run,
        info={"job": "predict", "workers": 2, "total_steps": 3000, "status": "running"},
        beats={
            0: {"step": 1100, "status": "running", "age": 1},
            1: {"step": 1000, "status": "running", "age": 1},
        },
    )
    snap = snapshot(run)
    assert (snap.step, snap.total_steps) == (2100, 3000)
