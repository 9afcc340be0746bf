"""The classes of malformed files that validation used to accept or report without a line (issue 25, item 10),
one parametrized test each, on the 10-line minimal recipe: every one is refused at ``file:line: key.path`` in
tpuft's own words. (tests/config/test_malformed_generator.py runs the same classes over the shipped
recipes.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE
from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError
from tpuft.core.safe_yaml import key_path_at

T5X_RECIPE = """\
name: t
backend:
  kind: t5x
  family: byt5
  size: small
  gin_overrides:
    network.T5Config.emb_dim: 128
data:
  train: train.jsonl
train:
  steps: 10
  batch_size: 4
"""
KERAS_RECIPE = """\
name: t
backend:
  kind: keras
  task: classification
  encoder:
    model_type: bert
    hidden_size: 16
data:
  train: train.jsonl
  label_field: label
  labels: [a, b]
train:
  steps: 10
  batch_size: 4
"""


def refused(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides)
    assert info.value.exit_code == 2
    return str(info.value)


def write(folder: Path, text: str, name: str = "r.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("null", ["null", "~", ""])
@pytest.mark.parametrize("key", ["d_model", "feed_forward_proj", "dropout_rate", "tie_word_embeddings"])
def test_a_null_in_model_config_is_refused_at_its_key(recipe_dir: Path, key: str, null: str) -> None:
    text = MINIMAL_RECIPE.replace("  config: {d_model: 8}", f"  config:\n    num_heads: 2\n    {key}: {null}")
    path = write(recipe_dir, text)
    assert f"{path}:7: model.config.{key}: is null: leave the key out" in refused(path)


@pytest.mark.parametrize(
    "version", ["latest", "2.9.x", "2.9.0-beta", ">=2.9", "2.9.*", "v2.9.0", "2.9.0 ", "1!2.0", ""]
)
def test_a_torch_version_pip_cannot_pin_is_refused(recipe_dir: Path, version: str) -> None:
    path = write(
        recipe_dir,
        MINIMAL_RECIPE.replace("  kind: torch_xla", f"  kind: torch_xla\n  torch_version: '{version}'"),
    )
    assert (
        f"{path}:4: backend.torch_version: {version!r} is not a version number like 2.9.0 (PEP 440)"
        in refused(path)
    )


@pytest.mark.parametrize("version", ["2.9.0", "2.9.0rc1", "2.9.0+cpu", "2.10.0.post1"])
def test_a_pep440_version_is_accepted(recipe_dir: Path, version: str) -> None:
    path = write(
        recipe_dir,
        MINIMAL_RECIPE.replace("  kind: torch_xla", f"  kind: torch_xla\n  torch_version: '{version}'"),
    )
    assert load_recipe(path).value.backend.torch_version == version  # type: ignore[union-attr]


@pytest.mark.parametrize("word", ["no", "off", "yes", "on", "y", "n", "NO", "Off"])
def test_yaml11_words_where_a_boolean_goes_are_refused_with_the_hint(recipe_dir: Path, word: str) -> None:
    path = write(recipe_dir, MINIMAL_RECIPE + f"export:\n  hf: {word}\n")
    assert (
        f"{path}:12: export.hf: expected true or false, got the text {word!r}: tpuft reads YAML 1.2"
        in refused(path)
    )
    path.write_text(MINIMAL_RECIPE)
    assert f"--set export.hf={word}: export.hf: expected true or false, got the text {word!r}" in refused(
        path, [f"export.hf={word}"]
    )


@pytest.mark.parametrize(
    ("recipe", "old", "line", "key"),
    [
        (
            T5X_RECIPE,
            "    network.T5Config.emb_dim: 128",
            7,
            "backend.gin_overrides.network.T5Config.emb_dim",
        ),
        (KERAS_RECIPE, "    hidden_size: 16", 7, "backend.encoder.hidden_size"),
    ],
)
@pytest.mark.parametrize("word", ["no", "on"])
def test_yaml11_words_where_a_boolean_or_text_goes_are_ambiguous(
    recipe_dir: Path, recipe: str, old: str, line: int, key: str, word: str
) -> None:
    name = old.split(":")[0]
    path = write(recipe_dir, recipe.replace(old, f"{name}: {word}"))
    meant = "false" if word == "no" else "true"
    assert f"{path}:{line}: {key}: {word!r} is ambiguous here (YAML 1.1 reads it as {meant}" in refused(path)
    path.write_text(recipe.replace(old, f"{name}: '{word}'"))  # quoted: the text, as written
    backend = load_recipe(path).value.backend
    section = backend.gin_overrides if backend.kind == "t5x" else backend.encoder  # type: ignore[union-attr]
    assert section[name.strip()] == word


@pytest.mark.parametrize(
    ("value", "line", "key", "fragment"),
    [
        ("!custom 10", 9, "train.steps", "the tag !custom is not allowed here"),
        (
            "!!python/object:os.system 10",
            9,
            "train.steps",
            "the tag !!python/object:os.system is not allowed",
        ),
        ("*nowhere", 9, "train.steps", "not valid YAML: found undefined alias 'nowhere'"),
        ("10\n    more: 1", 10, "train.steps.more", "not valid YAML: mapping values are not allowed here"),
        ("[10", 10, "train", "not valid YAML"),
    ],
)
def test_a_yaml_error_on_a_keys_line_names_the_key(
    recipe_dir: Path, value: str, line: int, key: str, fragment: str
) -> None:
    path = write(recipe_dir, MINIMAL_RECIPE.replace("  steps: 10", f"  steps: {value}"))
    text = refused(path)
    assert f"{path}:{line}: {key}" in text and fragment in text, text


def test_key_path_at_reads_the_indentation() -> None:
    text = "# head\ntrain:\n  steps: 1\n  list:\n    - a: 1\n      b: *x\n'quoted key': 2\n  \n"
    assert [key_path_at(text, n) for n in range(1, 8)] == [
        None,
        ("train",),
        ("train", "steps"),
        ("train", "list"),
        ("train", "list", "a"),
        ("train", "list", "b"),
        ("quoted key",),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the recipe is empty"),
        ("\n\n   \n", "the recipe is empty"),
        ("# my recipe\n# to do\n", "the recipe has only comments: no key is set"),
        ("# a\n---\n# b\n", "the recipe has only comments: no key is set"),
        ("~\n", "the recipe has no keys (just '~'): give a mapping of keys"),
    ],
)
def test_an_empty_file_says_so_at_its_path(recipe_dir: Path, text: str, message: str) -> None:
    path = write(recipe_dir, text)
    problems = refused(path).splitlines()[1:]
    assert problems == [
        f"  {path}:1: {message} (start from a shipped one: tpuft recipes cp quickstart mine.yaml)"
    ]
    cluster = write(recipe_dir, text, "tpuft.yaml")
    with pytest.raises(
        ConfigError,
        match=f"{cluster}:1: {message.replace('recipe', 'cluster file')}".replace("(", r"\(").replace(
            ")", r"\)"
        ),
    ):
        load_cluster(cluster)


@pytest.mark.parametrize(
    "text", ["name: t\n", "{}\n", "backend:\n", "name: t\nbackend: {}\ntrain:\n  steps:\n"]
)
def test_every_problem_of_a_near_empty_recipe_has_a_line(recipe_dir: Path, text: str) -> None:
    path = write(recipe_dir, text)
    problems = refused(path).splitlines()[1:]
    assert problems and all(p.startswith(f"  {path}:") and p.split(":")[1].isdigit() for p in problems), (
        problems
    )
    assert not any("Input should" in p or "Unable to extract" in p for p in problems)


@pytest.mark.parametrize(
    ("old", "new", "line", "expected"),
    [
        ("  steps: 10", "  steps: 0", 9, "train.steps: must be >= 1, got 0"),
        ("  batch_size: 4", "  batch_size: 2000000", 10, "train.batch_size: must be <= 1048576, got 2000000"),
        (
            "  batch_size: 4",
            "  batch_size: 4\n  learning_rate: 0",
            11,
            "train.learning_rate: must be > 0, got 0",
        ),
        (
            "  batch_size: 4",
            "  batch_size: 4\n  label_smoothing: 1",
            11,
            "train.label_smoothing: must be < 1, got 1",
        ),
        (
            "  batch_size: 4",
            "  batch_size: 4\n  optimizer: sgd",
            11,
            "train.optimizer: must be one of adafactor, adamw (got 'sgd')",
        ),
        (
            "  kind: torch_xla",
            "  kind: pytorch",
            3,
            "backend.kind: must be one of keras, t5x, torch_xla; did you mean 'torch_xla'? (got 'pytorch')",
        ),
        ("  kind: torch_xla", "  knd: torch_xla", 3, "backend.knd: unknown key; did you mean 'kind'?"),
        (
            "  config: {d_model: 8}",
            "  config: {d_model: 8}\n  freeze: [encoder, decoder, embeddings, encoder]",
            6,
            "model.freeze: must have at most 3 item(s), got 4",
        ),
    ],
)
def test_messages_are_in_tpufts_words_at_the_right_line(
    recipe_dir: Path, old: str, new: str, line: int, expected: str
) -> None:
    path = write(recipe_dir, MINIMAL_RECIPE.replace(old, new))
    text = refused(path)
    assert f"{path}:{line}: {expected}" in text, text
    assert "Input should" not in text and "Value error" not in text


def test_a_value_of_megabytes_is_located_where_the_file_passes_the_limit(recipe_dir: Path) -> None:
    block = "".join(f"  line {i} " + "x" * 100 + "\n" for i in range(12_000))
    path = write(recipe_dir, MINIMAL_RECIPE + "description: |\n" + block)
    text = refused(path)
    assert (
        f"{path}:9300: description: recipe is 1,357,032 bytes" in text
        and "over the limit of 1,048,576" in text
    ), text


def test_a_batch_that_does_not_split_names_the_accelerator_line_too(recipe_dir: Path, cli) -> None:  # type: ignore[no-untyped-def]
    recipe = write(recipe_dir, MINIMAL_RECIPE.replace("batch_size: 4", "batch_size: 3"))
    cluster = write(
        recipe_dir,
        "name: pod\nprovider: local\naccelerator: v4-16\nlocal:\n  devices_per_worker: 1\n",
        "tpuft.yaml",
    )
    result = cli("recipes", "validate", str(recipe), "--config", str(cluster))
    assert result.code == 2
    assert f"{recipe}:10: train.batch_size: 3 does not split evenly over 2 workers" in result.err
    assert f"(the workers: {cluster}:3: accelerator: v4-16 (2 workers))" in result.err
    result = cli("recipes", "validate", str(recipe), "--config", str(cluster), "--set", "train.batch_size=5")
    assert "--set train.batch_size=5: train.batch_size: 5 does not split" in result.err


def test_a_quoted_yaml11_word_survives_the_resolved_recipe(recipe_dir: Path) -> None:
    """The workers and ``resume`` load the resolved recipe again: a quoted ``'no'`` must not come back
    unquoted (and ambiguous)."""
    from tpuft.config import dump_recipe, recipe_from_text

    path = write(
        recipe_dir, T5X_RECIPE.replace("network.T5Config.emb_dim: 128", "network.T5Config.name: 'no'")
    )
    resolved = dump_recipe(load_recipe(path).value)
    assert "'no'" in resolved
    assert recipe_from_text(resolved, "run.yaml").backend.gin_overrides == {"network.T5Config.name": "no"}  # type: ignore[union-attr]
