"""Every shipped recipe validates; ls / show / cp work like torchtune's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuft.config import load_recipe
from tpuft.paths import recipes_dir

SHIPPED = sorted(recipes_dir().glob("*.yaml"))


USER_DATA = {"sst2_bert_base_keras", "sst2_bert_large_keras", "sst2_t5_small_keras", "sst2_t5_base_keras",
             "question_quality_t5_base_keras"}
"""TPU recipes of the seeds whose data the user downloads (their header says how): their files are not checked."""


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_loads(path: Path) -> None:
    loaded = load_recipe(path, check_files=path.stem not in USER_DATA)
    if path.stem in USER_DATA:
        assert "Data:" in path.read_text().split("\nname:")[0]  # the header says where the data comes from
    assert loaded.value.name == path.stem
    assert path.read_text().startswith("# ")  # opens with what it is and how to run it


def test_ls_show_cp(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    listing = cli("recipes", "ls")
    assert listing.code == 0 and "quickstart" in listing.out and "torch_xla" in listing.out
    shown = cli("recipes", "show", "quickstart")
    assert shown.code == 0 and shown.out == (recipes_dir() / "quickstart.yaml").read_text()
    copied = cli("recipes", "cp", "quickstart", str(tmp_path / "mine.yaml"))
    assert copied.code == 0
    mine = load_recipe(tmp_path / "mine.yaml")  # data paths still resolve from the new place
    assert mine.value.data.train == recipes_dir() / "data" / "numbers" / "train.jsonl"
    again = cli("recipes", "cp", "quickstart", str(tmp_path / "mine.yaml"))
    assert again.code == 2 and "--overwrite" in again.err
    unknown = cli("recipes", "show", "quikstart")
    assert unknown.code == 2 and "shipped recipes: " in unknown.err and " quickstart," in unknown.err


def test_recipe_by_name(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "validate", "quickstart", "-c", str(cluster_file))
    assert result.code == 0 and "is valid" in result.out


def _rehearsal_settings(path: Path) -> list[str] | None:
    """The ``--set`` settings of the header's CPU rehearsal command line, if it has one."""
    import shlex

    lines = path.read_text().split("\nname:")[0].splitlines()
    for index, line in enumerate(lines):
        if line.startswith("# CPU rehearsal") and index + 1 < len(lines):
            words = shlex.split(lines[index + 1].lstrip("# "))
            assert words[:3] == ["tpuft", "up", path.stem], lines[index + 1]
            return [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    return None


REHEARSED = [p for p in SHIPPED if _rehearsal_settings(p) is not None]


@pytest.mark.parametrize("path", REHEARSED, ids=[p.stem for p in REHEARSED])
def test_the_cpu_rehearsal_line_in_the_header_validates(path: Path) -> None:
    """The rehearsal a header promises must load (random init, shipped or local data) and fit the local pod."""
    from tpuft.backends import get_backend
    from tpuft.config import ClusterConfig

    recipe = load_recipe(path, _rehearsal_settings(path), check_files=path.stem not in USER_DATA).value
    assert recipe.model.name_or_path is None  # nothing to download
    assert get_backend(recipe.backend.kind).check(recipe, ClusterConfig(local={"workers": 2}).shape()) == []
