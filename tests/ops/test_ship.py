"""Which of a recipe's files travel to workers that cannot read this machine's disk, and how the recipe sent
with the run names the copies. The copying itself is the fleet's ``put`` (tested against the sshd pod in
tests/fleet); here a recording stand-in takes its place, because only the choice of files and the rewritten
recipe are under test."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tpuft.backends.base import ClusterShape
from tpuft.backends.t5x import BACKEND
from tpuft.config import load_recipe
from tpuft.ops.ship_data import ship_data, shipped_data

RECIPE = """\
name: ship
backend:
  kind: t5x
  task: span_corruption
  gin_files: [model.gin]
  vocabulary: sp.model
  extra_ids: 100
data:
  corpus: [corpus.txt, "gs://bucket/more/*.txt"]
train:
  steps: 10
"""


def test_data_gin_files_and_vocabulary_are_shipped_and_bucket_paths_stay(tmp_path: Path) -> None:
    for name in ("model.gin", "sp.model", "corpus.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "r.yaml").write_text(RECIPE)
    recipe = load_recipe(tmp_path / "r.yaml").value
    plan = BACKEND.plan(recipe, ClusterShape(2, 4, "tpu"))
    puts: list[tuple[Path, str]] = []
    fleet = SimpleNamespace(put=lambda local, remote, workers: puts.append((local, remote)))
    shipped = ship_data(SimpleNamespace(fleet=fleet), recipe, "run-1", plan)

    assert sorted(str(local.name) for local, _ in puts) == ["corpus.txt", "model.gin", "sp.model"]
    assert shipped.data.corpus == [".tpuft/data/run-1/corpus-0-corpus.txt", "gs://bucket/more/*.txt"]
    assert shipped.backend.gin_files == [".tpuft/data/run-1/backend-gin_files-0-model.gin"]
    assert shipped.backend.vocabulary == ".tpuft/data/run-1/backend-vocabulary-sp.model"
    assert dict(puts)[tmp_path / "sp.model"] == shipped.backend.vocabulary
    assert recipe.backend.vocabulary == str(tmp_path / "sp.model")  # the caller's recipe is left as it was
    record = shipped_data(recipe, plan)  # what run.json keeps, for a resume to ship again
    assert record["backend.vocabulary"] == str(tmp_path / "sp.model")
    assert record["corpus"] == [str(tmp_path / "corpus.txt"), "gs://bucket/more/*.txt"]
