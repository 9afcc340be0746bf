"""Every shipped recipe validates; ls / show / cp work like torchtune's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuft.config import load_recipe
from tpuft.core.paths import recipes_dir

SHIPPED = sorted(recipes_dir().glob("*.yaml"))


USER_DATA = {
    "sst2_bert_base_keras": "glue/SST-2",
    "sst2_bert_large_keras": "glue/SST-2",
    "sst2_t5_small_keras": "glue/SST-2",
    "sst2_t5_base_keras": "glue/SST-2",
    "question_quality_t5_base_keras": "so_quality",
}
"""Recipes whose data the user fetches (it cannot be shipped) -> the folder under tpuft/recipes/data/ whose
fetch.py does."""


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_recipe_loads(path: Path) -> None:
    loaded = load_recipe(path, check_files=path.stem not in USER_DATA)
    header = path.read_text().split("\nname:")[0]
    if path.stem in USER_DATA:
        assert f"Fetch it: python data/{USER_DATA[path.stem]}/fetch.py from this file's folder" in header
    assert loaded.value.name == path.stem
    first = header.splitlines()[0]
    # a whole one-line summary
    assert first.startswith("# ") and first.endswith(".") and len(first) <= 140, first
    assert "../" not in header and "seeds/" not in header  # names nothing outside the repository
    # nor a path only a clone has: a wheel's recipe lives in site-packages/tpuft/recipes/ (issue 39, item 2)
    assert "recipes/" not in path.read_text(), path


def test_ls_shows_whole_first_lines(cli) -> None:  # type: ignore[no-untyped-def]
    import json

    listed = cli("recipes", "ls", "--json")
    assert listed.code == 0, listed.err
    summaries = {row["name"]: row["summary"] for row in json.loads(listed.out)}
    assert summaries == {p.stem: p.read_text().splitlines()[0][2:] for p in SHIPPED}


def test_validate_tells_missing_data_from_a_bad_recipe(
    cli, tmp_path: Path, cluster_file: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import json

    from tpuft.ops.recipes import DATA_MISSING_EXIT

    monkeypatch.chdir(tmp_path)  # the fetch command is shown relative to the current folder
    recipe = tmp_path / "sst2.yaml"
    (tmp_path / "glue").mkdir()
    (tmp_path / "glue" / "fetch.py").write_text("")
    text = (recipes_dir() / "sst2_bert_base_keras.yaml").read_text().replace("data/glue/SST-2/", "glue/")
    recipe.write_text(text)
    missing = cli("recipes", "validate", str(recipe), "-c", str(cluster_file))
    assert missing.code == DATA_MISSING_EXIT == 3, missing.err
    lines = [line.strip() for line in missing.err.splitlines() if "missing " in line]
    number = {
        key: 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith(f"  {key}:"))
        for key in ("train", "eval")
    }
    assert lines == [
        f"{recipe}:{number[key]}: data.{key}: missing {tmp_path / 'glue' / name}; fetch it: python "
        "glue/fetch.py"
        for key, name in (("train", "train.tsv"), ("eval", "dev.tsv"))
    ]
    as_json = cli("recipes", "validate", str(recipe), "-c", str(cluster_file), "--json")
    assert as_json.code == 3 and [line.strip() for line in json.loads(as_json.out)["problems"]] == lines
    skipped = cli("recipes", "validate", str(recipe), "-c", str(cluster_file), "--no-data-check")
    assert skipped.code == 0 and "data not checked" in skipped.out
    (tmp_path / "glue" / "fetch.py").unlink()
    unknown = cli("recipes", "validate", str(recipe), "-c", str(cluster_file))
    assert unknown.code == 3 and "the recipe's header says where it comes from" in unknown.err
    bad = cli("recipes", "validate", str(recipe), "-c", str(cluster_file), "--set", "train.steps=0")
    assert bad.code == 2  # a problem in the recipe is still exit 2, with or without the data
    assert cli("recipes", "validate", str(recipe), "--no-data-check", "--set", "train.steps=0").code == 2


def test_validate_says_what_only_the_workers_read_and_answers_json(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    """A streamed hub dataset or a corpus is not read here: said so, not a dangling count; ``--json`` has the
    same exit codes, a pass with what was checked, a refusal with its located problems."""
    import json

    streamed = cli("recipes", "validate", "ro_diacritics_mt5_base", "-c", str(cluster_file))
    assert streamed.code == 0, streamed.err
    said = " ".join(streamed.out.split())
    assert "examples read" not in said, said
    assert (
        "data.hf dumitrescustefan/diacritic, split train: streamed by the workers, not read or counted"
        in said
    )
    corpus = cli("recipes", "validate", "t5x_span_corruption", "-c", str(cluster_file))
    assert corpus.code == 0 and "data.corpus " in corpus.out and "examples read" not in corpus.out

    answer = cli("recipes", "validate", "ro_diacritics_mt5_base", "-c", str(cluster_file), "--json")
    assert answer.code == 0, answer.err
    found = json.loads(answer.out)
    assert found["valid"] is True and found["problems"] == [] and found["cluster"] == "test-pod"
    assert found["data"] == [
        {
            "key": "hf",
            "source": "dumitrescustefan/diacritic, split train",
            "examples": None,
            "dropped": 0,
            "counted": False,
            "how": "streamed by the workers",
        }
    ]
    counted = json.loads(cli("recipes", "validate", "t2t_translation", "-c", str(cluster_file), "--json").out)
    assert [(d["key"], d["examples"], d["counted"]) for d in counted["data"]] == [
        ("train", 9499, True),
        ("eval", 500, True),
    ]
    unchecked = json.loads(
        cli("recipes", "validate", "quickstart", "-c", str(cluster_file), "--json", "--no-data-check").out
    )
    assert unchecked["valid"] is True and unchecked["data_checked"] is False and unchecked["data"] is None
    bad = cli(
        "recipes", "validate", "quickstart", "-c", str(cluster_file), "--json", "--set", "train.steps=0"
    )
    refused = json.loads(bad.out)
    assert bad.code == 2 == refused["exit_code"] and len(refused["problems"]) == 1
    assert "train.steps" in refused["problems"][0]


def _fetch_module(folder: str):  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"fetch_{folder.replace('/', '_')}", recipes_dir() / "data" / folder / "fetch.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GLUE_SST2_TRAIN = (
    "sentence\tlabel\n"
    "hide new secretions from the parental units \t0\n"
    "contains no wit , only labored gags \t0\n"
    "that loves its characters and communicates something rather beautiful about human nature \t1\n"
    "remains utterly satisfied to remain the same throughout \t0\n"
    "on the worst revenge-of-the-nerds clich\u00e9s the filmmakers could dredge up \t0\n"
    "that 's far too tragic to merit such superficial treatment \t0\n"
    "demonstrates that the director of such hollywood blockbusters as patriot games can still turn out a "
    "small , "
    "personal film with an emotional wallop . \t1\n"
    "of saucy \t1\n"
    'a " quirky " film that never quite gels \t0\n'
    'the movie \'s "" funny "" moments \t1\n'
    '"a gorgeous , witty , seductive movie . \t1\n'
    "it 's a charming and often affecting journey . \t1\n"
)
"""GLUE's SST-2 train.tsv as it comes: the header, a tab, no quoting, quote characters unpaired, doubled and
at the start of a sentence (a CSV reader would swallow them or join lines), apostrophes split off as GLUE
tokenizes."""


def test_sst2_as_glue_ships_it_is_read_directly(cli, tmp_path: Path, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    """fetch.py unpacks GLUE's SST-2.zip unchanged (a zip in its layout; the download needs the network), and
    the shipped recipe validates on those files and reads every sentence, quotes and all, with its label."""
    import zipfile

    from tpuft.data import Fields, iter_shard

    fetch = _fetch_module("glue/SST-2")
    archive = tmp_path / "SST-2.zip"
    dev = "sentence\tlabel\nit 's a charming and often affecting journey . \t1\nunflinchingly bleak \t0\n"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("SST-2/train.tsv", GLUE_SST2_TRAIN)
        zipped.writestr("SST-2/dev.tsv", dev)
        zipped.writestr("SST-2/test.tsv", "index\tsentence\n0\tuneasy mishmash of styles and genres .\n")
        zipped.writestr("SST-2/original/README.txt", "the treebank")
    out = tmp_path / "data" / "glue" / "SST-2"
    assert fetch.main(["--zip", str(archive), "--out", str(out)]) == 0
    assert (out / "train.tsv").read_text() == GLUE_SST2_TRAIN and sorted(p.name for p in out.iterdir()) == [
        "dev.tsv",
        "test.tsv",
        "train.tsv",
    ]
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zipped:
        zipped.writestr("CoLA/train.tsv", "x")
    with pytest.raises(ValueError, match="not GLUE's SST-2.zip"):
        fetch.extract(tmp_path / "other.zip", tmp_path / "elsewhere")
    for name in ("sst2_t5_small_keras", "sst2_bert_base_keras"):
        (tmp_path / f"{name}.yaml").write_text((recipes_dir() / f"{name}.yaml").read_text())
        validated = cli("recipes", "validate", str(tmp_path / f"{name}.yaml"), "-c", str(cluster_file))
        assert validated.code == 0, validated.err
    recipe = load_recipe(tmp_path / "sst2_t5_small_keras.yaml").value
    examples = list(iter_shard(recipe.data.train, 0, 1, Fields.of(recipe.data)))
    rows = [line.split("\t") for line in GLUE_SST2_TRAIN.splitlines()[1:]]
    assert [(e.source, e.target, e.line) for e in examples] == [
        ("sst2 sentence: " + sentence, label, number)
        for number, (sentence, label) in enumerate(rows, start=2)
    ]
    assert examples[8].source == 'sst2 sentence: a " quirky " film that never quite gels '
    assert examples[10].source == 'sst2 sentence: "a gorgeous , witty , seductive movie . '


def test_the_question_quality_fetch_converts_kaggle_s_csv(tmp_path: Path) -> None:
    fetch = _fetch_module("so_quality")
    rows = (
        'Id,Title,Body,Tags,CreationDate,Y\n1,"Why, oh why?","<p>a '
        '""quoted""\nbody</p>",<python>,2016-01-01,HQ\n'
        "2,Closed,<p>x</p>,<c>,2016-01-02,LQ_CLOSE\n3,Edit me,<p>y</p>,<c>,2016-01-03,LQ_EDIT\n"
    )
    (tmp_path / "csv").mkdir()
    for name in fetch.FILES:
        (tmp_path / "csv" / name).write_text(rows)
    assert fetch.main(["--csv", str(tmp_path / "csv"), "--out", str(tmp_path)]) == 0
    import json

    written = [json.loads(line) for line in (tmp_path / "valid.jsonl").read_text().splitlines()]
    assert written[0] == {"Title": "Why, oh why?", "Body": '<p>a "quoted"\nbody</p>', "label": "high"}
    assert [row["label"] for row in written] == ["high", "none", "low"]
    recipe = (
        (recipes_dir() / "question_quality_t5_base_keras.yaml")
        .read_text()
        .replace("data/so_quality/", f"{tmp_path}/")
    )
    (tmp_path / "r.yaml").write_text(recipe)
    assert load_recipe(tmp_path / "r.yaml").value.data.train == tmp_path / "train.jsonl"


def test_ls_show_cp(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    listing = cli("recipes", "ls")
    assert listing.code == 0 and "quickstart" in listing.out and "torch_xla" in listing.out
    shown = cli("recipes", "show", "quickstart")
    assert shown.code == 0 and shown.out == (recipes_dir() / "quickstart.yaml").read_text()
    copied = cli("recipes", "cp", "quickstart", str(tmp_path / "mine.yaml"))
    assert copied.code == 0 and "its name is mine" in copied.out
    mine = load_recipe(tmp_path / "mine.yaml")  # data paths still resolve from the new place
    assert mine.value.data.train == recipes_dir() / "data" / "numbers" / "train.jsonl"
    # named after its file (a plan of mine.yaml says "recipe mine"), every comment and line kept
    assert mine.value.name == "mine"
    shipped = (recipes_dir() / "quickstart.yaml").read_text().splitlines()
    lines = (tmp_path / "mine.yaml").read_text().splitlines()
    assert len(lines) == len(shipped)
    changed = [(a, b) for a, b in zip(shipped, lines, strict=True) if a != b]
    assert ("name: quickstart", "name: mine") in changed
    assert all(a == b for a, b in zip(shipped, lines, strict=True) if a.lstrip().startswith("#"))
    odd = cli("recipes", "cp", "quickstart", str(tmp_path / "my copy.yaml"))
    assert odd.code == 0 and load_recipe(tmp_path / "my copy.yaml").value.name == "my-copy"
    kept = cli("recipes", "cp", "quickstart", str(tmp_path))  # a folder: the same file name, the same name
    assert kept.code == 0 and load_recipe(tmp_path / "quickstart.yaml").value.name == "quickstart"
    again = cli("recipes", "cp", "quickstart", str(tmp_path / "mine.yaml"))
    assert again.code == 2 and "--overwrite" in again.err
    unknown = cli("recipes", "show", "quikstart")
    assert unknown.code == 2 and "quickstart" in unknown.err
    # a file, as show --summary and every verb take
    mine = cli("recipes", "show", str(tmp_path / "mine.yaml"))
    assert mine.code == 0 and mine.out == (tmp_path / "mine.yaml").read_text()


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
    """The rehearsal a header promises must load (random init, shipped or local data) and fit the local
    pod."""
    from tpuft.backends.base import get_backend
    from tpuft.config import ClusterConfig
    from tpuft.ops.preflight import preflight

    # its data is here: shipped, or the rehearsal points at some
    loaded = load_recipe(path, _rehearsal_settings(path))
    recipe = loaded.value
    assert recipe.model.name_or_path is None  # nothing to download
    cluster = ClusterConfig(local={"workers": 2})
    assert get_backend(recipe.backend.kind).check(recipe, cluster.shape()) == []
    checked = preflight(cluster, loaded)  # the data read through as the workers will
    assert all(check.examples > 0 for check in checked.files.values())
