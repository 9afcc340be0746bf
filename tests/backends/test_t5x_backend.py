"""What the T5X backend tells shared code: its recipe section and the problems it locates in a recipe, the
venv it asks for (pinned PyPI set + t5x/airio/jestimator from git or a local source), its check and launch
plan for a cluster shape, and the gin text it writes. Fast: no network, no JAX."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.conftest import MINIMAL_RECIPE, REPO
from tests.venvs import tiny_wheel
from tpuft.backends.base import ClusterShape, get_backend
from tpuft.backends.t5x import (
    AIRIO_COMMIT,
    JAX_VERSION,
    JESTIMATOR_COMMIT,
    LAYOUT,
    MIN_PYTHON,
    T5X_COMMIT,
    T5x,
    T5xBackend,
    checkpoint_step,
    gin_value,
    model_gins,
    source_requirements,
)
from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError
from tpuft.ops.preflight import check_against_cluster
from tpuft.readers.runs import RunSnapshot

BACKEND = get_backend("t5x")
SHIPPED = ("t5x_quickstart", "t5x_span_corruption", "ro_t5x_base_pretrain", "ro_mt5x_base_pretrain")
TPU_RECIPES = ("ro_t5x_base_pretrain", "ro_mt5x_base_pretrain")

T5X_RECIPE = """\
name: t
backend:
  kind: t5x
  family: byt5
  size: tiny
data:
  train: train.jsonl
train:
  steps: 10
  batch_size: 4
"""
"""The smallest valid T5X recipe (10 lines; byt5 tiny fine-tuned on train.jsonl): tests change a line of
it."""

SPAN = T5X_RECIPE.replace("  size: tiny", "  size: tiny\n  task: span_corruption").replace(
    "  train: train.jsonl", "  corpus: [corpus.txt]"
)
"""Span corruption on corpus.txt (11 lines: task on line 6, data on 7, corpus on 8)."""


def write(folder: Path, text: str, name: str = "r.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def sentencepiece_model(pieces: list[str]) -> bytes:
    """A minimal SentencePiece ModelProto: field 1 repeated, each a SentencePiece with its piece (field 1) and
    a score (field 2, a float); what tpuft reads of a .model without sentencepiece."""
    out = b""
    for piece in pieces:
        text = piece.encode()
        inner = b"\x0a" + bytes([len(text)]) + text + b"\x15" + b"\x00\x00\x80\xbf"
        out += b"\x0a" + bytes([len(inner)]) + inner
    return out


@pytest.fixture
def t5x_dir(recipe_dir: Path) -> Path:
    """recipe_dir plus a plain-text corpus, a SentencePiece stand-in and a user model gin."""
    (recipe_dir / "corpus.txt").write_text("one document\nanother document\n")
    (recipe_dir / "sp.model").write_bytes(sentencepiece_model(["<unk>", "<s>", "</s>", "ab", "cd"]))
    (recipe_dir / "model.gin").write_text("MODEL = None\n")
    return recipe_dir


def refused(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides)
    assert isinstance(info.value, ConfigError) and info.value.exit_code == 2
    return str(info.value)


@pytest.fixture
def tpu_v4_32(tmp_path: Path) -> ClusterShape:
    path = tmp_path / "tpu.yaml"
    path.write_text("provider: gcp\naccelerator: v4-32\ngcp: {project: my-project, zone: us-central2-b}\n")
    shape = load_cluster(path).value.shape()
    assert (
        shape == ClusterShape(hosts=4, chips_per_host=4, target="tpu", generation="v4") and shape.chips == 16
    )
    return shape


@pytest.fixture
def cpu_pod(cluster_file: Path) -> ClusterShape:
    shape = load_cluster(cluster_file).value.shape()
    assert shape.hosts == 2 and shape.target == "cpu"
    return shape


# ----------------------------------------------------------------------------------------------------------
# Shipped recipes


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_t5x_recipe_loads_and_fits_its_cluster(
    name: str, tpu_v4_32: ClusterShape, cpu_pod: ClusterShape
) -> None:
    loaded = load_recipe(REPO / "tpuft" / "recipes" / f"{name}.yaml")
    recipe = loaded.value
    assert recipe.name == name and recipe.backend.kind == "t5x" and isinstance(recipe.backend, T5xBackend)
    shape = tpu_v4_32 if name in TPU_RECIPES else cpu_pod
    assert BACKEND.check(recipe, shape) == []
    check_against_cluster(loaded, shape)  # raises on a located problem
    assert BACKEND.plan(recipe, shape).workers == tuple(range(shape.hosts))
    assert model_gins(recipe.backend.family, recipe.backend.size)


def test_shipped_quickstarts_run_on_local_files() -> None:
    quick = load_recipe(REPO / "tpuft" / "recipes" / "t5x_quickstart.yaml").value
    assert quick.backend.task == "finetune" and quick.data.train is not None and quick.data.train.is_file()
    span = load_recipe(REPO / "tpuft" / "recipes" / "t5x_span_corruption.yaml").value
    assert span.backend.task == "span_corruption" and span.data.train is None
    assert span.data.corpus == [str(REPO / "tpuft" / "recipes" / "data" / "corpus" / "train.txt")]


def test_ro_t5x_keeps_the_sentinels_and_its_own_vocabulary() -> None:
    backend = load_recipe(REPO / "tpuft" / "recipes" / "ro_t5x_base_pretrain.yaml").value.backend
    assert (backend.family, backend.size, backend.task) == ("t5_1_1", "base", "span_corruption")
    assert backend.extra_ids == 100
    assert (
        backend.vocabulary is not None
        and backend.vocabulary.startswith("gs://")
        and backend.vocabulary.endswith(".model")
    )
    assert backend.gin_overrides["network.T5Config.vocab_size"] == 64128


def test_ro_mt5x_continues_from_the_public_checkpoint() -> None:
    recipe = load_recipe(REPO / "tpuft" / "recipes" / "ro_mt5x_base_pretrain.yaml").value
    backend = recipe.backend
    assert backend.family == "mt5" and backend.initial_checkpoint is not None
    assert backend.initial_checkpoint.rstrip("/").rsplit("/", 1)[-1] == "checkpoint_1000000"
    assert checkpoint_step(backend.initial_checkpoint) == 1_000_000 and backend.initial_step is None
    assert backend.extra_ids == 0 and backend.vocabulary is None  # mT5's own vocabulary has the sentinels


# ----------------------------------------------------------------------------------------------------------
# Located errors


def test_the_minimal_t5x_recipes_load(t5x_dir: Path) -> None:
    finetune = load_recipe(write(t5x_dir, T5X_RECIPE)).value
    assert finetune.backend.task == "finetune" and finetune.data.train == t5x_dir / "train.jsonl"
    span = load_recipe(write(t5x_dir, SPAN)).value
    assert span.backend.task == "span_corruption" and span.data.corpus == [str(t5x_dir / "corpus.txt")]


# (base recipe, replace this, with this) -> (line, message fragments); each one problem
BAD_T5X = [
    (
        "family-and-gin-files",
        T5X_RECIPE,
        "  size: tiny",
        "  size: tiny\n  gin_files: [model.gin]",
        6,
        ["backend.gin_files: give either family + size (a t5x example gin) or gin_files, not both"],
    ),
    (
        "neither-family-nor-gin-files",
        T5X_RECIPE,
        "  family: byt5\n  size: tiny\n",
        "",
        2,
        ["backend.family: required: a model by family and size", "or gin_files"],
    ),
    ("size-missing", T5X_RECIPE, "  size: tiny\n", "", 2, ["backend.size: required with backend.family"]),
    (
        "umt5-tiny",
        T5X_RECIPE,
        "  family: byt5",
        "  family: umt5",
        5,
        ["backend.size: t5x has no umt5 tiny gin (umt5 starts at small)"],
    ),
    (
        "sentencepiece-without-sentinels",
        SPAN,
        "  size: tiny",
        "  size: tiny\n  vocabulary: sp.model\n  extra_ids: 0",
        7,
        [
            "backend.extra_ids: span corruption needs sentinel ids",
            "is the ordinary piece 'cd'",
            "Set backend.extra_ids (T5 used 100",
        ],
    ),
    (
        "user-gins-without-sentinels",
        SPAN,
        "  family: byt5\n  size: tiny",
        "  gin_files: [model.gin]\n  extra_ids: 0",
        2,
        ["backend.vocabulary: required with backend.gin_files"],
    ),
    (
        "finetune-without-train",
        T5X_RECIPE,
        "  train: train.jsonl",
        "  max_source_length: 64",
        6,
        [
            "data.train: required for task finetune: training examples (a data file, or a Hugging "
            "Face dataset as data.hf)"
        ],
    ),
    (
        "finetune-with-corpus",
        T5X_RECIPE,
        "  train: train.jsonl",
        "  train: train.jsonl\n  corpus: [corpus.txt]",
        8,
        ["data.corpus: a corpus is for task span_corruption (backend.task)"],
    ),
    (
        "span-without-corpus",
        SPAN,
        "  corpus: [corpus.txt]",
        "  max_source_length: 64",
        7,
        ["data.corpus: required for task span_corruption: text files or globs"],
    ),
    (
        "span-with-train",
        SPAN,
        "  corpus: [corpus.txt]",
        "  corpus: [corpus.txt]\n  train: train.jsonl",
        9,
        ["data.train: task span_corruption reads data.corpus, not JSON lines"],
    ),
    (
        "span-with-eval",
        SPAN,
        "  corpus: [corpus.txt]",
        "  corpus: [corpus.txt]\n  eval: train.jsonl",
        9,
        ["data.eval: task span_corruption reads data.corpus, not JSON lines"],
    ),
    (
        "span-with-test",
        SPAN,
        "  corpus: [corpus.txt]",
        "  corpus: [corpus.txt]\n  test: train.jsonl",
        9,
        ["data.test: task span_corruption reads data.corpus, not JSON lines"],
    ),
    (
        "adamw",
        T5X_RECIPE,
        "  batch_size: 4",
        "  batch_size: 4\n  optimizer: adamw",
        11,
        ["train.optimizer: the t5x model gins train with T5X's Adafactor"],
    ),
    (
        "model-name-or-path",
        T5X_RECIPE,
        "data:",
        "model:\n  name_or_path: google/t5-v1_1-small\ndata:",
        7,
        [
            "model.name_or_path: the t5x backend takes its model from backend.family + backend.size",
            "remove model.name_or_path",
        ],
    ),
    (
        "model-config",
        T5X_RECIPE,
        "data:",
        "model:\n  config: {d_model: 8}\ndata:",
        7,
        ["model.config: the t5x backend takes its model from", "remove model.config"],
    ),
    (
        "model-tokenizer",
        T5X_RECIPE,
        "data:",
        "model:\n  tokenizer: google/t5-v1_1-small\ndata:",
        7,
        ["model.tokenizer: the t5x backend's vocabulary is backend.vocabulary"],
    ),
    (
        "checkpoint-without-step",
        T5X_RECIPE,
        "  size: tiny",
        "  size: tiny\n  initial_checkpoint: gs://b/pretrained/t5x_byt5_tiny",
        2,
        [
            "backend.initial_step: 'gs://b/pretrained/t5x_byt5_tiny' is not named checkpoint_<step>: give "
            "its step"
        ],
    ),
    (
        "bad-gin-binding-name",
        T5X_RECIPE,
        "  size: tiny",
        "  size: tiny\n  gin_overrides:\n    'network.T5Config emb_dim': 8",
        6,
        ["backend.gin_overrides: 'network.T5Config emb_dim' is not a gin binding name"],
    ),
    (
        "t5x-source-missing",
        T5X_RECIPE,
        "  size: tiny",
        "  size: tiny\n  t5x_source: wheels/nowhere",
        6,
        ["backend.t5x_source: not found:", "wheels/nowhere"],
    ),
    (
        "t5x-source-url",
        T5X_RECIPE,
        "  size: tiny",
        "  size: tiny\n  t5x_source: git+https://github.com/google-research/t5x",
        6,
        ["backend.t5x_source: give a local path"],
    ),
    (
        "gin-file-missing",
        T5X_RECIPE,
        "  family: byt5\n  size: tiny",
        "  gin_files: [nope.gin]",
        4,
        ["backend.gin_files", "gin file not found:", "nope.gin"],
    ),
    (
        "vocabulary-missing",
        SPAN,
        "  size: tiny",
        "  size: tiny\n  vocabulary: nope.model\n  extra_ids: 100",
        6,
        ["backend.vocabulary: SentencePiece model not found:", "nope.model"],
    ),
    (
        "eval-and-checkpoint-periods",
        T5X_RECIPE,
        "  train: train.jsonl\ntrain:\n  steps: 10\n  batch_size: 4\n",
        "  train: train.jsonl\n  eval: train.jsonl\ntrain:\n  steps: 1000\n  batch_size: 4\n  "
        "checkpoint_every: 300\n"
        "eval:\n  every: 200\n",
        14,
        [
            "eval.every: T5X needs the eval and checkpoint periods to be multiples of each other "
            "(train.checkpoint_every is 300)"
        ],
    ),
    (
        "corpus-glob-matches-nothing",
        SPAN,
        "  corpus: [corpus.txt]",
        "  corpus: ['texts/*.txt']",
        8,
        ["data.corpus", "'texts/*.txt' matches no file"],
    ),
    (
        "corpus-file-missing",
        SPAN,
        "  corpus: [corpus.txt]",
        "  corpus: [nope.txt]",
        8,
        ["data.corpus", "file not found:", "nope.txt"],
    ),
]


@pytest.mark.parametrize(
    ("base", "old", "new", "line", "fragments"), [b[1:] for b in BAD_T5X], ids=[b[0] for b in BAD_T5X]
)
def test_bad_t5x_recipe_is_located(
    t5x_dir: Path, base: str, old: str, new: str, line: int, fragments: list[str]
) -> None:
    assert old in base
    path = write(t5x_dir, base.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    text = str(info.value)
    assert len(info.value.problems) == 1, text
    assert info.value.problems[0].startswith(f"{path}:{line}: "), text
    for fragment in fragments:
        assert fragment in text


def test_the_cli_refuses_a_bad_t5x_recipe_with_exit_2(t5x_dir: Path, cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(t5x_dir, T5X_RECIPE.replace("  family: byt5", "  family: umt5"))
    result = cli("recipes", "validate", str(path), "--config", str(cluster_file))
    assert result.code == 2 and "Traceback" not in result.err
    assert f"{path}:5: backend.size: t5x has no umt5 tiny gin" in result.err


def test_span_corruption_sentinels(t5x_dir: Path) -> None:
    """ByT5 has its sentinels in the byte range, the SentencePiece families in their default vocabulary; a
    .model of one's own needs extra_ids."""
    byt5 = SPAN.replace("  size: tiny", "  size: tiny\n  extra_ids: 0")
    assert load_recipe(write(t5x_dir, byt5)).value.backend.extra_ids == 0
    as_bytes = SPAN.replace("  family: byt5", "  family: t5_1_1").replace(
        "  size: tiny", "  size: small\n  vocabulary: byt5"
    )
    assert load_recipe(write(t5x_dir, as_bytes)).value.backend.vocabulary == "byt5"
    t5 = SPAN.replace("  family: byt5", "  family: t5_1_1").replace("  size: tiny", "  size: small")
    assert load_recipe(write(t5x_dir, t5)).value.backend.vocabulary is None
    own = SPAN.replace("  size: tiny", "  size: tiny\n  vocabulary: sp.model\n  extra_ids: 100")
    assert load_recipe(write(t5x_dir, own)).value.backend.vocabulary == str(t5x_dir / "sp.model")
    # the same vocabulary without sentinels is fine for fine-tuning
    finetune = T5X_RECIPE.replace("  size: tiny", "  size: tiny\n  vocabulary: sp.model")
    assert load_recipe(write(t5x_dir, finetune)).value.backend.extra_ids == 0


def test_initial_step_names_an_unnamed_checkpoint(t5x_dir: Path) -> None:
    unnamed = "  size: tiny\n  initial_checkpoint: gs://b/pretrained/t5x_byt5_tiny"
    path = write(t5x_dir, T5X_RECIPE.replace("  size: tiny", f"{unnamed}\n  initial_step: 5000"))
    backend = load_recipe(path).value.backend
    assert backend.initial_step == 5000 and backend.initial_checkpoint == "gs://b/pretrained/t5x_byt5_tiny"
    named = "  size: tiny\n  initial_checkpoint: gs://b/x/checkpoint_250/"
    assert (
        load_recipe(write(t5x_dir, T5X_RECIPE.replace("  size: tiny", named))).value.backend.initial_step
        is None
    )
    # an override is located as the override
    # from an override: initial_step is in neither, so the problem points at the file's backend section
    path = write(t5x_dir, T5X_RECIPE)
    text = refused(path, ["backend.initial_checkpoint=gs://b/elsewhere"])
    assert f"{path}:2: backend.initial_step: 'gs://b/elsewhere' is not named checkpoint_<step>" in text
    assert (
        load_recipe(
            path, ["backend.initial_checkpoint=gs://b/elsewhere", "backend.initial_step=7"]
        ).value.backend.initial_step
        == 7
    )


def test_eval_and_checkpoint_periods(t5x_dir: Path) -> None:
    base = T5X_RECIPE.replace("  train: train.jsonl", "  train: train.jsonl\n  eval: train.jsonl").replace(
        "  steps: 10", "  steps: 1000\n  checkpoint_every: 500"
    )
    path = write(t5x_dir, base)
    assert load_recipe(path, ["eval.every=100"]).value.eval.every == 100  # 500 is a multiple of 100
    assert load_recipe(path, ["eval.every=1000"]).value.eval.every == 1000  # 1000 a multiple of 500
    assert load_recipe(path, ["eval.every=null"]).value.eval.every is None  # only at the end
    text = refused(path, ["eval.every=300"])
    assert "--set eval.every=300: eval.every: T5X needs the eval and checkpoint periods" in text
    no_eval = write(
        t5x_dir, T5X_RECIPE.replace("  steps: 10", "  steps: 1000\n  checkpoint_every: 500"), "n.yaml"
    )
    assert load_recipe(no_eval, ["eval.every=300"]).value.eval.every == 300  # no eval data: no eval to align


def test_gin_overrides_refuse_what_gin_cannot_write() -> None:
    ok = T5xBackend.model_validate(
        {"family": "byt5", "size": "tiny", "gin_overrides": {"a.b": [1, {"k": "v"}]}}
    )
    assert ok.gin_overrides == {"a.b": [1, {"k": "v"}]}
    for value in ({1, 2}, b"bytes", object()):
        with pytest.raises(ValidationError) as info:
            T5xBackend.model_validate({"family": "byt5", "size": "tiny", "gin_overrides": {"a.b": value}})
        assert "cannot be written as a gin value" in str(info.value)
    with pytest.raises(ValidationError, match="is not a gin binding name"):
        T5xBackend.model_validate({"family": "byt5", "size": "tiny", "gin_overrides": {"a.b = 3; c.d": 1}})
    scoped = {"train/utils.SaveCheckpointConfig.period": 10, "PjitPartitioner.num_partitions": 2}
    assert (
        T5xBackend.model_validate({"family": "byt5", "size": "tiny", "gin_overrides": scoped}).gin_overrides
        == scoped
    )


@pytest.mark.parametrize("value", [".inf", ".nan", "1e400"])
def test_non_finite_gin_override_is_refused_when_loading(t5x_dir: Path, value: str) -> None:
    path = write(
        t5x_dir, T5X_RECIPE.replace("  size: tiny", f"  size: tiny\n  gin_overrides:\n    a.b: {value}")
    )
    assert "backend.gin_overrides" in refused(path)


@pytest.mark.parametrize("name", ["network..T5Config", "network.T5Config."])
def test_a_binding_name_with_an_empty_part_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="is not a gin binding name"):
        T5xBackend.model_validate({"family": "byt5", "size": "tiny", "gin_overrides": {name: 1}})


def test_a_t5x_source_folder_without_wheels_is_refused(t5x_dir: Path) -> None:
    (t5x_dir / "wheels").mkdir()
    path = write(t5x_dir, T5X_RECIPE.replace("  size: tiny", "  size: tiny\n  t5x_source: wheels"))
    assert f"{path}:6: backend.t5x_source" in refused(path)


def test_a_corpus_glob_expands_sorted_to_files(t5x_dir: Path) -> None:
    texts = t5x_dir / "texts"
    texts.mkdir()
    for name in ("b.txt", "a.txt", "c.txt"):
        (texts / name).write_text(f"{name}\n")
    (texts / "notes.md").write_text("not a match\n")
    (texts / "folder.txt").mkdir()  # matches the glob, but is no file
    path = write(
        t5x_dir,
        SPAN.replace("  corpus: [corpus.txt]", "  corpus: ['texts/*.txt', corpus.txt, 'gs://b/c/*.txt']"),
    )
    corpus = load_recipe(path).value.data.corpus
    assert corpus == [
        str(texts / "a.txt"),
        str(texts / "b.txt"),
        str(texts / "c.txt"),
        str(t5x_dir / "corpus.txt"),
        "gs://b/c/*.txt",
    ]


# ----------------------------------------------------------------------------------------------------------
# torch_xla, now that recipes have data.corpus and models have T5X's own sources


TORCH_BAD = [
    (
        "corpus",
        "  train: train.jsonl",
        "  train: train.jsonl\n  corpus: [train.jsonl]",
        8,
        ["data.corpus: a pretraining corpus is for the t5x backend's span_corruption task"],
    ),
    (
        "no-train",
        "  train: train.jsonl",
        "  max_source_length: 64",
        6,
        ["data.train: required key is missing"],
    ),
    (
        "no-model",
        "  config: {d_model: 8}",
        "  dropout: 0.1",
        4,
        ["model: give exactly one of model.name_or_path (pretrained) or model.config (random init)"],
    ),
    (
        "both-models",
        "  config: {d_model: 8}",
        "  config: {d_model: 8}\n  name_or_path: t5-small",
        4,
        ["model: give exactly one of model.name_or_path"],
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "line", "fragments"), [b[1:] for b in TORCH_BAD], ids=[b[0] for b in TORCH_BAD]
)
def test_torch_xla_refuses_what_only_t5x_takes(
    recipe_dir: Path, old: str, new: str, line: int, fragments: list[str]
) -> None:
    path = write(recipe_dir, MINIMAL_RECIPE.replace(old, new, 1))
    text = refused(path)
    assert f"{path}:{line}: " in text
    for fragment in fragments:
        assert fragment in text


def test_torch_xla_with_no_model_section_is_located_in_the_file(recipe_dir: Path) -> None:
    path = write(recipe_dir, MINIMAL_RECIPE.replace("model:\n  config: {d_model: 8}\n", ""))
    text = refused(path)
    assert f"{path}" in text and "model: give exactly one of model.name_or_path" in text


# ----------------------------------------------------------------------------------------------------------
# The venv


def _spec(target: str = "cpu", **backend):  # type: ignore[no-untyped-def]
    return BACKEND.env_spec(
        T5xBackend.model_validate({"family": "byt5", "size": "tiny", **backend}), target, "python3"
    )


def test_env_spec_pins_jax_per_target_and_takes_t5x_from_git() -> None:
    cpu, tpu = _spec("cpu"), _spec("tpu")
    assert (
        cpu.requirements[:2] == (f"jax=={JAX_VERSION}", f"jaxlib=={JAX_VERSION}") and JAX_VERSION == "0.10.2"
    )
    assert tpu.requirements[:2] == ("jax[tpu]==0.10.2", "jaxlib==0.10.2")
    assert cpu.requirements[2:] == tpu.requirements[2:] and "tensorflow-cpu==2.21.0" in cpu.requirements
    assert cpu.key != tpu.key and cpu.kind == "t5x" and cpu.key.startswith("t5x-")
    assert cpu.no_deps == (
        f"t5x @ git+https://github.com/google-research/t5x@{T5X_COMMIT}",
        f"airio @ git+https://github.com/google/airio@{AIRIO_COMMIT}",
        f"jestimator @ git+https://github.com/google-research/jestimator@{JESTIMATOR_COMMIT}",
    )
    assert all(len(commit) == 40 for commit in (T5X_COMMIT, AIRIO_COMMIT, JESTIMATOR_COMMIT))
    assert cpu.local_sources == () and cpu.sources_digest == ""
    assert cpu.min_python == MIN_PYTHON == "3.11" and cpu.payload()["min_python"] == "3.11"
    assert cpu.payload()["no_deps"] == list(cpu.no_deps) and cpu.payload()["key"] == cpu.key
    extra = _spec("cpu", extra_requirements=["einops==0.8.0"])
    assert extra.requirements[-1] == "einops==0.8.0" and extra.key != cpu.key


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    """t5x, airio and jestimator wheels named as ../shared/wheels's: stand-ins (these tests read names and
    bytes, not code), so that they run in a clone of the repository alone."""
    for name, version in (("t5x", "0.0.0"), ("airio", "0.0.1"), ("jestimator", "0.3.3")):
        tiny_wheel(tmp_path / "wheelhouse", name, version=version)
    return tmp_path / "wheelhouse"


def test_env_spec_from_a_wheelhouse(wheelhouse: Path) -> None:
    spec = _spec(t5x_source=str(wheelhouse))
    wheels = {
        name.split("-")[0]: str(wheelhouse.resolve() / name)
        for name in (
            "t5x-0.0.0-py3-none-any.whl",
            "airio-0.0.1-py3-none-any.whl",
            "jestimator-0.3.3-py3-none-any.whl",
        )
    }
    assert spec.no_deps == (wheels["t5x"], wheels["airio"], wheels["jestimator"])
    assert spec.local_sources == spec.no_deps and all(Path(p).is_file() for p in spec.local_sources)
    assert len(spec.sources_digest) == 16 and spec.key != _spec().key
    assert source_requirements(str(wheelhouse.resolve())) == (spec.no_deps, spec.local_sources)


def test_env_spec_from_one_wheel_or_a_partial_wheelhouse(tmp_path: Path, wheelhouse: Path) -> None:
    wheel = wheelhouse.resolve() / "t5x-0.0.0-py3-none-any.whl"
    spec = _spec(t5x_source=str(wheel))
    assert spec.no_deps == (
        str(wheel),
        f"airio @ git+https://github.com/google/airio@{AIRIO_COMMIT}",
        f"jestimator @ git+https://github.com/google-research/jestimator@{JESTIMATOR_COMMIT}",
    )
    assert spec.local_sources == (str(wheel),)
    house = tmp_path / "house"
    house.mkdir()
    shutil.copy(wheelhouse / "airio-0.0.1-py3-none-any.whl", house)
    no_deps, local = source_requirements(str(house))
    assert no_deps[0].startswith("t5x @ git+") and no_deps[1] == str(house / "airio-0.0.1-py3-none-any.whl")
    assert no_deps[2].startswith("jestimator @ git+") and local == (
        str(house / "airio-0.0.1-py3-none-any.whl"),
    )


def test_env_spec_from_a_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "t5x"
    (checkout / "t5x").mkdir(parents=True)
    (checkout / "setup.py").write_text("from setuptools import setup\nsetup(name='t5x')\n")
    (checkout / "t5x" / "__init__.py").write_text("")
    (checkout / ".git").mkdir()
    (checkout / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    spec = _spec(t5x_source=str(checkout))
    assert spec.no_deps[0] == str(checkout) and spec.no_deps[1].startswith("airio @ git+")
    assert spec.local_sources == (str(checkout),)
    before = spec.key
    (checkout / ".git" / "HEAD").write_text("ref: refs/heads/other\n")  # git's own files do not count
    assert _spec(t5x_source=str(checkout)).key == before
    (checkout / "t5x" / "__init__.py").write_text("VERSION = 2\n")
    assert _spec(t5x_source=str(checkout)).key != before


def test_the_venv_key_follows_the_local_sources_bytes(tmp_path: Path, wheelhouse: Path) -> None:
    wheel = tmp_path / "t5x-0.0.0-py3-none-any.whl"
    shutil.copy(wheelhouse / wheel.name, wheel)
    first = _spec(t5x_source=str(wheel))
    again = _spec(t5x_source=str(wheel))
    assert again.key == first.key and again.sources_digest == first.sources_digest
    wheel.touch()  # a new mtime, the same bytes
    assert _spec(t5x_source=str(wheel)).key == first.key
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    changed = _spec(t5x_source=str(wheel))
    assert changed.sources_digest != first.sources_digest and changed.key != first.key
    assert changed.no_deps == first.no_deps and changed.requirements == first.requirements


def test_a_relative_t5x_source_is_from_the_recipe_folder(t5x_dir: Path, wheelhouse: Path) -> None:
    shutil.copy(wheelhouse / "t5x-0.0.0-py3-none-any.whl", t5x_dir)
    path = write(
        t5x_dir, T5X_RECIPE.replace("  size: tiny", "  size: tiny\n  t5x_source: t5x-0.0.0-py3-none-any.whl")
    )
    assert load_recipe(path).value.backend.t5x_source == str(t5x_dir / "t5x-0.0.0-py3-none-any.whl")


# ----------------------------------------------------------------------------------------------------------
# Check and plan against a cluster


@pytest.fixture
def loaded(t5x_dir: Path):  # type: ignore[no-untyped-def]
    return lambda *overrides: load_recipe(write(t5x_dir, T5X_RECIPE), list(overrides))


def test_batch_must_split_over_replicas_and_microbatches(
    loaded, cpu_pod: ClusterShape, tpu_v4_32: ClusterShape
) -> None:  # type: ignore[no-untyped-def]
    assert BACKEND.check(loaded().value, cpu_pod) == []  # 4 over 2 hosts
    ((path, message),) = BACKEND.check(loaded("train.batch_size=5").value, cpu_pod)
    assert (
        path == ("train", "batch_size")
        and message == "5 does not split evenly over 2 data-parallel replicas (use a multiple of 2)"
    )
    ((path, message),) = BACKEND.check(loaded("backend.num_microbatches=4").value, cpu_pod)
    assert (
        path == ("train", "batch_size")
        and "4 does not split evenly over 2 data-parallel replicas x 4 microbatches" in message
    )
    assert "use a multiple of 8" in message
    assert BACKEND.check(loaded("backend.num_microbatches=2").value, cpu_pod) == []
    # the shared key, the same
    ((path, message),) = BACKEND.check(loaded("train.grad_accum_steps=4").value, cpu_pod)
    assert path == ("train", "batch_size") and "x 4 microbatches (use a multiple of 8)" in message, message
    # a v4-32: 16 chips; 2 partitions leave 8 data-parallel replicas
    recipe = loaded("train.batch_size=256", "backend.num_partitions=2").value
    assert T5x.data_parallel(recipe, tpu_v4_32) == 8 and BACKEND.check(recipe, tpu_v4_32) == []
    ((path, message),) = BACKEND.check(
        loaded("train.batch_size=12", "backend.num_partitions=2").value, tpu_v4_32
    )
    assert path == ("train", "batch_size") and "over 8 data-parallel replicas" in message
    assert T5x.data_parallel(loaded("train.batch_size=256").value, tpu_v4_32) == 16


def test_partitions_must_divide_the_devices(loaded, cpu_pod: ClusterShape, tpu_v4_32: ClusterShape) -> None:  # type: ignore[no-untyped-def]
    ((path, message),) = BACKEND.check(
        loaded("train.batch_size=256", "backend.num_partitions=3").value, tpu_v4_32
    )
    assert path == ("backend", "num_partitions") and message == "3 does not divide the 16 devices"
    ((path, message),) = BACKEND.check(loaded("backend.num_partitions=4").value, cpu_pod)
    assert path == ("backend", "num_partitions") and "4 does not divide the 2 devices" in message


def test_multislice_splits_the_batch_over_every_slice_and_keeps_partitions_in_one(
    loaded, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "multislice.yaml"
    path.write_text(
        "provider: gcp\naccelerator: v4-8\ngcp: {project: my-project, zone: us-central2-b, slices: 2, "
        "queued: true}\n"
    )
    two_slices = load_cluster(path).value.shape()  # 2 slices x 1 host x 4 chips
    assert two_slices.slices == 2 and two_slices.hosts == 2 and T5x.devices(two_slices) == 8
    assert BACKEND.check(loaded("train.batch_size=8", "backend.num_partitions=2").value, two_slices) == []
    ((path_, message),) = BACKEND.check(
        loaded("train.batch_size=8", "backend.num_partitions=8").value, two_slices
    )
    assert path_ == ("backend", "num_partitions")  # 8 divides the 8 devices, not the 4 of one slice
    assert (
        message
        == "8 does not divide the 4 devices of one slice (2 slices): model parallelism stays within a slice"
    )
    ((path_, message),) = BACKEND.check(
        loaded("train.batch_size=6", "backend.num_partitions=2").value, two_slices
    )
    assert path_ == ("train", "batch_size")
    assert (
        message
        == "6 does not split evenly over 4 data-parallel replicas (2 slices x 2) (use a multiple of 4)"
    )
    # 2 slices x 1 worker x 2
    local = ClusterShape(hosts=2, chips_per_host=4, target="cpu", local_devices=2, slices=2)
    assert BACKEND.check(loaded("backend.num_partitions=2").value, local) == []
    ((path_, message),) = BACKEND.check(loaded("backend.num_partitions=4").value, local)
    assert message.startswith("4 does not divide the 2 devices of one slice (2 slices)")


def test_cluster_problems_are_located_in_the_recipe(t5x_dir: Path, cpu_pod: ClusterShape) -> None:
    path = write(t5x_dir, T5X_RECIPE.replace("  batch_size: 4", "  batch_size: 5"))
    with pytest.raises(ConfigError) as info:
        check_against_cluster(load_recipe(path), cpu_pod)
    assert str(path) in str(info.value)
    assert info.value.problems == [
        f"{path}:10: train.batch_size: 5 does not split evenly over 2 data-parallel replicas (use a multiple "
        "of 2)"
    ]
    path = write(t5x_dir, T5X_RECIPE.replace("  size: tiny", "  size: tiny\n  num_partitions: 3"))
    with pytest.raises(ConfigError) as info:
        check_against_cluster(load_recipe(path), cpu_pod)
    assert info.value.problems == [f"{path}:6: backend.num_partitions: 3 does not divide the 2 devices"]


def test_plan_launches_every_host(loaded, cpu_pod: ClusterShape, tpu_v4_32: ClusterShape) -> None:  # type: ignore[no-untyped-def]
    recipe = loaded().value
    cpu = BACKEND.plan(recipe, cpu_pod)
    assert cpu.workers == (0, 1) and cpu.env["JAX_PLATFORMS"] == "cpu" and cpu.argv == ("-m", "tpuft.worker")
    tpu = BACKEND.plan(recipe, tpu_v4_32)
    assert tpu.workers == (0, 1, 2, 3) and "JAX_PLATFORMS" not in tpu.env
    assert tpu.env["TF_CPP_MIN_LOG_LEVEL"] == cpu.env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert BACKEND.plan(recipe, ClusterShape(hosts=3, chips_per_host=4, target="cpu")).workers == (0, 1, 2)


# ----------------------------------------------------------------------------------------------------------
# Gin text, checkpoints, layout, summary


def test_gin_value_writes_literals_containers_and_references() -> None:
    assert [gin_value(v) for v in (3, 0.5, True, False, None, "text")] == [
        "3",
        "0.5",
        "True",
        "False",
        "None",
        "'text'",
    ]
    assert gin_value("it's") == '"it\'s"'
    assert gin_value([1, "a", [2.0, None]]) == "[1, 'a', [2.0, None]]"
    assert gin_value((1, 2)) == "[1, 2]"
    assert gin_value({"k": 1, 2: ["x"]}) == "{'k': 1, 2: ['x']}"
    assert gin_value("@adafactor.Adafactor") == "@adafactor.Adafactor"
    assert gin_value("@models.EncoderDecoderModel()") == "@models.EncoderDecoderModel()"
    assert gin_value("%TASK_FEATURE_LENGTHS") == "%TASK_FEATURE_LENGTHS"
    assert gin_value("%gin.REQUIRED") == "%gin.REQUIRED"
    assert gin_value("train/utils.SaveCheckpointConfig") == "'train/utils.SaveCheckpointConfig'"
    assert gin_value(["@a.b", {"m": "%M"}]) == "[@a.b, {'m': %M}]"
    # not references: quoted as text
    assert (
        gin_value("@ not a ref") == "'@ not a ref'"
        and gin_value("100%") == "'100%'"
        and gin_value("@") == "'@'"
    )
    with pytest.raises(ValueError, match="cannot be written as a gin value"):
        gin_value({1, 2})


def test_checkpoint_step() -> None:
    assert checkpoint_step("gs://b/x/checkpoint_1000000") == 1_000_000
    assert checkpoint_step("gs://b/x/checkpoint_1000000/") == 1_000_000
    assert checkpoint_step("/runs/r/checkpoints/checkpoint_0") == 0
    assert checkpoint_step("gs://b/x/checkpoint_100/state") is None
    assert checkpoint_step("gs://b/x/checkpoint_") is None and checkpoint_step("gs://b/x/ckpt_5") is None


def test_model_gins() -> None:
    assert model_gins("byt5", "tiny") == ("t5x/examples/t5/byt5/tiny.gin",)
    assert model_gins("t5_1_1", "base") == ("t5x/examples/t5/t5_1_1/base.gin",)
    assert model_gins("t5_1_0", "xl") == ("t5x/examples/t5/t5_1_0/3B.gin",)
    assert model_gins("t5_1_0", "xxl") == ("t5x/examples/t5/t5_1_0/11B.gin",)
    assert model_gins("umt5", "tiny") is None
    umt5 = model_gins("umt5", "small")
    assert umt5 is not None and umt5[0] == "t5x/examples/scalable_t5/mt5/small.gin" and len(umt5) == 4


def test_layout_names_t5x_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (1000, 2000, 3000):
        folder = LAYOUT.checkpoint_dir(run, step)
        folder.mkdir(parents=True)
        (folder / "state").write_bytes(b"x" * 10)
        if step != 3000:  # Orbax is still writing step 3000: no manifest yet
            LAYOUT.write_manifest(folder)
    assert LAYOUT.checkpoint_dir(run, 1000).name == "checkpoint_1000"
    assert [step for step, _ in LAYOUT.local_checkpoints(run / "checkpoints")] == [1000, 2000]
    assert (
        LAYOUT.step_of("checkpoint_1000000") == 1_000_000
        and LAYOUT.step_of("checkpoint_1000.tmp-123") is None
    )


def test_summary_names_the_best_checkpoint() -> None:
    snap = RunSnapshot(
        run_id="r",
        run_dir=Path("."),
        info={},
        status="finished",
        step=1500,
        total_steps=1500,
        best_eval={"step": 1000, "eval_exact_match": 0.875, "eval_loss": 0.1},
    )
    extras, rows = BACKEND.summarize(snap.outcome, launched=2)
    assert extras == {
        "best_checkpoint": {"name": "checkpoint_1000", "metric": "eval_exact_match", "value": 0.875}
    }
    assert rows == [("best checkpoint", "checkpoint_1000 (exact_match 0.8750)")]
    empty = RunSnapshot(run_id="r", run_dir=Path("."), info={}, status="finished", step=10, total_steps=10)
    assert BACKEND.summarize(empty.outcome, launched=2) == ({}, [])


def test_a_model_with_its_own_sentinels_and_a_family_vocabulary_with_extra_ids(t5x_dir: Path) -> None:
    """A .model whose top pieces are already <extra_id_N> needs no extra_ids; a family's default vocabulary
    has its sentinels built in, so extra_ids on top of it would outgrow the model's vocab_size."""
    (t5x_dir / "own.model").write_bytes(sentencepiece_model(["<unk>", "ab", "<extra_id_1>", "<extra_id_0>"]))
    own = SPAN.replace("  size: tiny", "  size: tiny\n  vocabulary: own.model")
    assert load_recipe(write(t5x_dir, own)).value.backend.extra_ids == 0
    doubled = T5X_RECIPE.replace("  family: byt5", "  family: t5_1_1").replace(
        "  size: tiny", "  size: tiny\n  extra_ids: 100"
    )
    text = refused(write(t5x_dir, doubled))
    assert "backend.extra_ids: the t5_1_1 vocabulary has its sentinel ids built in" in text
