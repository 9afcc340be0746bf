"""What a verb's RECIPE argument finds (issue 25, item 7): a path; else ``./NAME.yaml`` / ``./NAME.yml`` in
the current folder, which wins over a shipped recipe of that name as a path would; else a shipped recipe. A
mistyped name is exit 2 with the closest shipped or local name, in every verb that loads a recipe (through the
CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE
from tpuft.config import resolve_recipe_path
from tpuft.core.errors import UsageError
from tpuft.core.paths import recipes_dir


def test_a_stem_finds_the_local_file_and_it_wins_over_a_shipped_recipe(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(recipe_dir)
    (recipe_dir / "mine.yml").write_text(MINIMAL_RECIPE)
    assert resolve_recipe_path(Path("mine")) == Path("mine.yml")
    (recipe_dir / "mine.yaml").write_text(MINIMAL_RECIPE)
    assert resolve_recipe_path(Path("mine")) == Path("mine.yaml")  # .yaml before .yml
    assert resolve_recipe_path(Path("quickstart")) == recipes_dir() / "quickstart.yaml"
    (recipe_dir / "quickstart.yaml").write_text(MINIMAL_RECIPE)
    # the local file shadows the shipped one
    assert resolve_recipe_path(Path("quickstart")) == Path("quickstart.yaml")


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("quickstrat", "'quickstart'"),
        ("t5x_quikstart", "'t5x_quickstart'"),
        ("mien", "'mine'"),
        ("quickstrat.yaml", "'quickstart'"),
    ],
)
def test_a_mistyped_name_suggests_the_closest(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, suggestion: str
) -> None:
    monkeypatch.chdir(recipe_dir)
    (recipe_dir / "mine.yaml").write_text(MINIMAL_RECIPE)
    with pytest.raises(UsageError, match=f"{name}: recipe not found; did you mean {suggestion}\\?") as info:
        resolve_recipe_path(Path(name))
    assert info.value.exit_code == 2


def test_a_missing_path_is_not_matched_against_shipped_names(tmp_path: Path) -> None:
    (tmp_path / "recipe-one.yaml").write_text(MINIMAL_RECIPE)
    with pytest.raises(UsageError, match=r"recipe not found; did you mean '.*recipe-one.yaml'\?"):
        resolve_recipe_path(tmp_path / "recipe-on.yaml")
    with pytest.raises(UsageError) as info:
        resolve_recipe_path(tmp_path / "quickstart.yaml")
    assert info.value.message == f"{tmp_path / 'quickstart.yaml'}: recipe not found"


@pytest.mark.parametrize(
    "verb", [["up"], ["train"], ["setup"], ["recipes", "validate"], ["recipes", "show"], ["recipes", "cp"]]
)
def test_every_verb_suggests_and_exits_2(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch, cli, cluster_file: Path, verb: list[str]
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(recipe_dir)
    rest = {"show": [], "cp": ["copy.yaml"]}.get(verb[-1], ["--config", str(cluster_file)])
    result = cli(*verb, "quickstrat", *rest)
    assert result.code == 2, (result.code, result.err)
    expected = (
        "unknown recipe 'quickstrat'; did you mean 'quickstart'?"
        if verb[-1] == "cp"
        else "quickstrat: recipe not found; did you mean 'quickstart'?"
    )
    assert expected in result.err and "Traceback" not in result.err
    assert not (recipe_dir / "copy.yaml").exists()


def test_recipes_validate_finds_mine_yaml_by_its_stem(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch, cli, cluster_file: Path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(recipe_dir)
    (recipe_dir / "mine.yaml").write_text(MINIMAL_RECIPE.replace("batch_size: 4", "batch_size: 3"))
    result = cli("recipes", "validate", "mine", "--config", str(cluster_file))
    assert result.code == 2, (result.code, result.err)  # found, read, and refused for what is in it:
    assert "mine.yaml:10: train.batch_size: 3 does not split evenly over 2 workers" in result.err
    assert f"(the workers: {cluster_file}:5: local.workers: 2)" in result.err  # the cluster file's line too
    (recipe_dir / "mine.yaml").write_text(MINIMAL_RECIPE.replace("steps: 10", "steps: 10\n  log_every: 1"))
    (recipe_dir / "train.jsonl").write_text('{"source": "a", "target": "b"}\n' * 2)
    result = cli("recipes", "validate", "mine", "--config", str(cluster_file))
    assert result.code == 0, result.err
