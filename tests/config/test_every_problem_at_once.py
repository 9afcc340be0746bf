"""Every problem of both files in one pass (issue 39, item 7): an unknown key or a wrong value no longer
hides the checks that span keys (a model's own, the recipe against the cluster's workers), a problem in the
recipe no longer hides the cluster file's, and the command exits 2 once, each problem at its file, line and
key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE as GOOD
from tpuft.config import load_cluster
from tpuft.core.errors import ConfigError

TWO_WORKERS = "provider: local\nlocal:\n  workers: 2\n  devices_per_worker: 1\n"
"""A local pod of 2 workers, one device each: a batch of 33 does not split over it."""
THREE_WORKERS = "provider: local\nlocal:\n  workers: 3\n  devices_per_worker: 1\n"
"""A local pod of 3 workers: the default batch of 32 does not split over it."""

GCP_WITH_TWO_PROBLEMS = """\
name: c1
provider: gcp
accelerator: v4-8
gcp:
  project: my-project
  zone: us-central2-b
  spot: yes
local:
  workers: 3
"""
"""``spot: yes`` (text in YAML 1.2, where a boolean goes) and ``local.workers`` on a gcp cluster."""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def misspelt_and_unsplittable(recipe_dir: Path) -> Path:
    """A misspelt optional key (line 11) and a batch of 33 (line 10), which does not split over 2 workers."""
    text = GOOD.replace("  batch_size: 4", "  batch_size: 33\n  optimiser: adamw")
    return write(recipe_dir, "r.yaml", text)


VERBS = [
    ("recipes", "validate", "--no-data-check"),
    ("recipes", "validate"),
    ("train", "--dry-run"),
    ("up", "--dry-run"),
    ("train",),
    ("up", "--yes"),
]


@pytest.mark.parametrize("verb", VERBS, ids=[" ".join(v) for v in VERBS])
def test_a_misspelt_key_does_not_hide_a_batch_that_does_not_split(
    recipe_dir: Path,
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
    verb: tuple[str, ...],
) -> None:
    cluster = write(tmp_path, "two.yaml", TWO_WORKERS)
    path = misspelt_and_unsplittable(recipe_dir)
    result = cli(*verb, str(path), "--config", str(cluster))
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert result.err.count("error:") == 1
    assert f"{path}:11: train.optimiser: unknown key; did you mean 'optimizer'?" in result.err
    assert f"{path}:10: train.batch_size: 33 does not split evenly over 2 workers" in result.err
    assert f"2 problem(s) in {path}:" in result.err


def test_a_misspelt_required_key_does_not_hide_a_batch_that_does_not_split(
    recipe_dir: Path,
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    """``stpes`` for ``steps``: the required key is missing, and its section still gets the recipe-against-
    the-workers check (a whole number stands in for it, and no check reports about the stand-in)."""
    cluster = write(tmp_path, "two.yaml", TWO_WORKERS)
    text = GOOD.replace("  steps: 10\n  batch_size: 4", "  stpes: 10\n  batch_size: 33\n  warmup_steps: 5")
    path = write(recipe_dir, "r.yaml", text)
    result = cli("recipes", "validate", str(path), "--config", str(cluster), "--no-data-check")
    assert result.code == 2 and "Traceback" not in result.err, result.err
    assert f"{path}:8: train.steps: required key is missing" in result.err
    assert f"{path}:9: train.stpes: unknown key; did you mean 'steps'?" in result.err
    assert f"{path}:10: train.batch_size: 33 does not split evenly over 2 workers" in result.err
    assert f"3 problem(s) in {path}:" in result.err  # and nothing about warm-up against the stand-in's 1


@pytest.mark.parametrize("dry_run", [True, False], ids=["create --dry-run", "create"])
def test_spot_yes_does_not_hide_local_workers_on_a_gcp_cluster(
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
    dry_run: bool,
) -> None:
    cluster = write(tmp_path, "gcp.yaml", GCP_WITH_TWO_PROBLEMS)
    result = cli("create", "--config", str(cluster), *(["--dry-run"] if dry_run else []))
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert f"2 problem(s) in {cluster}:" in result.err
    assert f"{cluster}:7: gcp.spot: expected true or false, got the text 'yes'" in result.err
    assert f"{cluster}:9: local.workers: applies to provider local only" in result.err


@pytest.mark.parametrize(
    "args",
    [("recipes", "validate", "--no-data-check"), ("train", "--dry-run"), ("up",)],
    ids=["recipes validate", "train --dry-run", "up"],
)
def test_the_recipes_problems_and_the_cluster_files_come_together(
    recipe_dir: Path,
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
    args: tuple[str, ...],
) -> None:
    cluster = write(tmp_path, "gcp.yaml", GCP_WITH_TWO_PROBLEMS)
    path = misspelt_and_unsplittable(recipe_dir)
    result = cli(*args, str(path), "--config", str(cluster))
    assert result.code == 2, result.err
    assert result.err.count("error:") == 1
    assert f"4 problem(s) in {path} and {cluster}:" in result.err
    assert f"{path}:11: train.optimiser: unknown key" in result.err
    # the v4-8's one host drives 4 chips: 4 replicas; the cluster's problems are not at the keys of its shape
    assert f"{path}:10: train.batch_size: 33 does not split evenly over 4 replicas" in result.err
    assert f"{cluster}:7: gcp.spot: expected true or false" in result.err
    assert f"{cluster}:9: local.workers: applies to provider local only" in result.err


def test_a_missing_required_key_does_not_hide_another_sections_checks(
    recipe_dir: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    """``stpes``: train.steps is missing, so no recipe can be built; the model section is checked alone."""
    text = GOOD.replace("  steps: 10", "  stpes: 10").replace(
        "  config: {d_model: 8}", "  config: {d_model: 8, vocab_size: 100}"
    )
    path = write(recipe_dir, "r.yaml", text)
    result = cli("recipes", "validate", "--no-data-check", str(path))
    assert result.code == 2, result.err
    assert f"{path}:9: train.stpes: unknown key; did you mean 'steps'?" in result.err
    assert "train.steps: required key is missing" in result.err
    assert f"{path}:5: model.config.vocab_size: 100 is smaller than the byt5 tokenizer's" in result.err


def test_a_check_is_silent_about_a_key_that_has_a_problem_of_its_own(
    recipe_dir: Path,
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    """``batch_size: 0`` is refused; the batch check against the 3 workers, which would see the default of 32
    in its place, says nothing about it, while the model's check, on a valid key, still reports."""
    cluster = write(tmp_path, "three.yaml", THREE_WORKERS)
    text = GOOD.replace("  batch_size: 4", "  batch_size: 0").replace(
        "  config: {d_model: 8}", "  config: {d_model: 8, vocab_size: 100}"
    )
    path = write(recipe_dir, "r.yaml", text)
    result = cli("recipes", "validate", "--no-data-check", str(path), "--config", str(cluster))
    assert result.code == 2, result.err
    assert f"{path}:10: train.batch_size: must be >= 1, got 0" in result.err
    assert f"{path}:5: model.config.vocab_size: 100 is smaller" in result.err
    assert "does not split" not in result.err
    assert "2 problem(s)" in result.err


def test_no_batch_check_against_a_cluster_whose_shape_has_a_problem(
    recipe_dir: Path,
    tmp_path: Path,
    cli,  # type: ignore[no-untyped-def]
) -> None:
    """An unknown accelerator: the recipe is not checked against a default cluster in its place; the recipe's
    own problem is still reported with the cluster file's."""
    cluster = write(tmp_path, "bad.yaml", "accelerator: v4-30\nlocal:\n  workers: 3\n")
    path = misspelt_and_unsplittable(recipe_dir)
    result = cli("train", "--dry-run", str(path), "--config", str(cluster))
    assert result.code == 2, result.err
    assert f"{cluster}:1: accelerator: unknown accelerator type 'v4-30'" in result.err
    assert f"{path}:11: train.optimiser: unknown key" in result.err
    assert "does not split" not in result.err


def test_a_gcp_cluster_without_a_project_is_checked_all_the_same(tmp_path: Path) -> None:
    """``provider: gcp`` without gcp.project and gcp.zone is one problem among the others, not a stop."""
    path = write(
        tmp_path,
        "tpuft.yaml",
        "provider: gcp\naccelerator: v4-8\ngcp:\n  valid_until: soon\nlocal:\n  workers: 3\n",
    )
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    text = str(info.value)
    assert f"{path}:4: gcp.valid_until: expected a duration like 6h" in text
    assert f"{path}:3: gcp: provider gcp needs gcp.project and gcp.zone" in text
    assert f"{path}:6: local.workers: applies to provider local only" in text
    assert len(info.value.problems) == 3
