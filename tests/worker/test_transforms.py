"""Named text transforms and the preprocess hook, as examples are built from records (controller and
workers)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from tpuft.config import TransformName, load_recipe
from tpuft.data import DataError, Fields, check_file, iter_shard
from tpuft.data.text_transforms import (
    TRANSFORMS,
    HookError,
    load_preprocess,
    strip_diacritics,
    text_transform,
)

QUICKSTART = Path(__file__).resolve().parents[2] / "tpuft" / "recipes" / "quickstart.yaml"


def test_strip_diacritics_handles_romanian_both_comma_and_cedilla_forms() -> None:
    assert strip_diacritics("ă â î ș ț ş ţ Ș Ț Ă Â Î") == "a a i s t s t S T A A I"
    assert (
        strip_diacritics("Știința și tehnologia, în fiecare zi.") == "Stiinta si tehnologia, in fiecare zi."
    )
    # Ø is a letter of its own, not a mark
    assert strip_diacritics("naïve café, Ørsted") == "naive cafe, Ørsted"


def test_every_transform_the_config_allows_exists_and_they_compose_in_order() -> None:
    assert set(typing.get_args(TransformName)) == set(TRANSFORMS)
    assert text_transform([]) is None
    both = text_transform(["collapse_whitespace", "lowercase"])
    assert both is not None and both("  Școala   ÎNCEPE \n") == "școala începe"
    assert TRANSFORMS["nfkc"]("ﬁ①") == "fi1" and TRANSFORMS["nfc"]("e\u0301") == "é"
    assert TRANSFORMS["strip"]("\t a  b \n") == "a  b" and TRANSFORMS["lowercase"]("ȘTIU ÎNCĂ") == "știu încă"
    assert TRANSFORMS["collapse_whitespace"]("a \t\n b") == "a b"


def test_seed_003_task_from_one_field(tmp_path: Path) -> None:
    """source_field = target_field, the input stripped of its diacritics; the prefix goes after the
    transform."""
    data = tmp_path / "ro.jsonl"
    data.write_text(json.dumps({"text": "Mâine mergem la munte."}, ensure_ascii=False) + "\n")
    recipe = load_recipe(
        QUICKSTART,
        [
            f"data.train={data}",
            "data.eval=null",
            "data.source_field=text",
            "data.target_field=text",
            "data.source_transforms=[strip_diacritics]",
            'data.prefix="RO: "',
        ],
    ).value
    (example,) = iter_shard(data, 0, 1, Fields.of(recipe.data))
    assert (example.source, example.target) == ("RO: Maine mergem la munte.", "Mâine mergem la munte.")


HOOK = """
def keep_long(record):
    if len(record["words"].split()) < 3:
        return None
    record["words"] = record["words"].upper()
    return record

def broken(record):
    return record["nope"]

def wrong(record):
    return [record]

not_a_function = 3
"""


@pytest.fixture()
def hooked(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "hooks.py").write_text(HOOK)
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"words": w, "digits": "1"}) + "\n" for w in ("one", "one two three", "a b c d"))
    )
    return tmp_path / "hooks.py", data


def test_a_preprocess_hook_from_a_file_rewrites_and_drops_records(hooked: tuple[Path, Path]) -> None:
    hooks, data = hooked
    recipe = load_recipe(QUICKSTART, [f"data.train={data}", f"data.preprocess={hooks}:keep_long"]).value
    fields = Fields.of(recipe.data)
    assert [e.source for e in iter_shard(data, 0, 1, fields)] == ["ONE TWO THREE", "A B C D"]
    check = check_file(data, fields)
    assert (check.examples, check.dropped, check.problems) == (2, 1, [])


def test_a_hook_relative_to_the_recipe_and_a_module_hook(
    tmp_path: Path, hooked: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks, data = hooked
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        QUICKSTART.read_text().replace("data/numbers/", str(QUICKSTART.parent / "data/numbers") + "/")
    )
    loaded = load_recipe(recipe, ["data.preprocess=hooks.py:keep_long"]).value
    assert loaded.data.preprocess == f"{hooks}:keep_long"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_preprocess("hooks:keep_long")({"words": "x"}) is None


def test_hook_failures_are_located_at_the_data_line(hooked: tuple[Path, Path]) -> None:
    hooks, data = hooked
    for name, message in (
        ("broken", "failed: KeyError: 'nope'"),
        ("wrong", "returned a list; expected a record"),
    ):
        fields = Fields.of(
            load_recipe(QUICKSTART, [f"data.train={data}", f"data.preprocess={hooks}:{name}"]).value.data
        )
        with pytest.raises(DataError) as caught:
            list(iter_shard(data, 0, 1, fields))
        assert caught.value.where == f"{data}:1" and message in caught.value.message
    for spec, message in (
        (f"{hooks}:missing", "has no 'missing'"),
        (f"{hooks}:not_a_function", "is not a function"),
        ("no_such_module_here:f", "importing no_such_module_here failed"),
    ):
        with pytest.raises(HookError, match=message):
            load_preprocess(spec)


def test_a_hook_that_does_not_load_is_a_recipe_error_before_launch(
    cli,
    cluster_file: Path,  # type: ignore[no-untyped-def]
    hooked: tuple[Path, Path],
) -> None:
    hooks, data = hooked
    result = cli(
        "recipes",
        "validate",
        str(QUICKSTART),
        "-c",
        str(cluster_file),
        "--set",
        f"data.train={data}",
        "--set",
        f"data.preprocess={hooks}:missing",
    )
    assert result.code == 2 and "data.preprocess" in result.err and "has no 'missing'" in result.err
