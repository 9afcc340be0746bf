"""Generated malformed recipes and cluster files of the classes validation used to miss (issue 25, item 10):
every shipped recipe that loads from a copy, and a GCP and a local cluster file, mutated line by line into a
null where a ``model.config`` value goes, a version pip cannot pin, YAML 1.1 booleans (``no``, ``on``, ``y``),
a tag, an undefined alias or bad nesting on a key's line, values out of range (tpuft's words, never
pydantic's), a backend kind typo, a value of megabytes, an empty or comment-only file, and a batch that does
not split over the cluster's workers.

Each one goes through the real CLI entry point (``recipes validate``, in-process) and must be refused with
exit code 2 at ``file:line: key.path``, without a traceback, in well under a second. The expected line is
found by plain PyYAML in the written text, independently of tpuft's reader.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tpuft.core.paths import recipes_dir

GCP_CLUSTER = """\
name: t5-v4
provider: gcp
accelerator: v4-32
bucket: gs://my-bucket
gcp:
  project: my-project
  zone: us-central2-b
  spot: false
  queued: false
  internal_ip: false
  slices: 1
ssh:
  port: 22
  os_login: false
"""
LOCAL_CLUSTER = "name: test-pod\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n"
THREE_WORKERS = "name: test-pod\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 3\n"

WORDS = ["no", "yes", "off", "on", "n", "y"]
"""YAML 1.1's booleans that YAML 1.2 (tpuft) reads as text."""
BAD_VERSIONS = ["latest", "2.9.x", "2.9.0-beta", ">=2.9", "2.9.*", "v2.9.0", "2.9.0 "]
BOOL_KEYS = [
    ("export", "hf"),
    ("data", "shuffle"),
    ("model", "gradient_checkpointing"),
    ("train", "keep_best"),
]


@dataclass
class Case:
    label: str
    target: str  # "recipe" or "cluster": which file the text replaces
    text: str
    line: int
    key: str
    fragment: str
    cluster_text: str = LOCAL_CLUSTER
    also: str = ""
    """A second located fragment (the cluster file's line for a batch that does not split)."""


def key_lines(text: str) -> dict[tuple[str, ...], tuple[int, bool]]:
    """Every key path of block mappings -> (its 1-based line, whether its value is a plain scalar), by
    PyYAML."""
    found: dict[tuple[str, ...], tuple[int, bool]] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = (*path, str(key_node.value))
                scalar = isinstance(value_node, yaml.ScalarNode) and value_node.style is None
                found[child] = (
                    key_node.start_mark.line + 1,
                    scalar and key_node.start_mark.line == value_node.start_mark.line,
                )
                walk(value_node, child)

    walk(yaml.compose(text), ())
    return found


def with_value(text: str, line: int, value: str) -> str:
    """``key: old  # comment`` on ``line`` -> ``key: value``."""
    lines = text.splitlines()
    key = re.match(r"^(\s*[^:#]+:)", lines[line - 1])
    assert key is not None, lines[line - 1]
    lines[line - 1] = f"{key.group(1)} {value}".rstrip()
    return "\n".join(lines) + "\n"


def with_line_after(text: str, line: int, inserted: str) -> str:
    lines = text.splitlines()
    return "\n".join([*lines[:line], inserted, *lines[line:]]) + "\n"


def indent_of(text: str, line: int) -> str:
    raw = text.splitlines()[line - 1]
    return raw[: len(raw) - len(raw.lstrip())]


def recipe_cases(name: str, text: str, turn: int) -> list[Case]:
    keys = key_lines(text)
    tree = yaml.safe_load(text)
    out: list[Case] = []

    def add(label: str, new_text: str, line: int, key: str, fragment: str) -> None:
        out.append(Case(f"[{name}] {label}", "recipe", new_text, line, key, fragment))

    config = [
        (p, line)
        for p, (line, scalar) in keys.items()
        if p[:2] == ("model", "config") and len(p) == 3 and scalar
    ]
    for index, (path, line) in enumerate(config[:4]):  # a null where a model.config number or string goes
        null = ("null", "", "~")[index % 3]
        add(
            f"{path[2]}: {null or '(nothing)'}", with_value(text, line, null), line, ".".join(path), "is null"
        )
    kind = tree["backend"]["kind"]
    kind_line = keys[("backend", "kind")][0]
    if kind == "torch_xla":  # a version pip cannot pin
        for bad in BAD_VERSIONS[turn % 3 :: 3]:
            inserted = with_line_after(text, kind_line, f"{indent_of(text, kind_line)}torch_version: '{bad}'")
            add(
                f"torch_version {bad!r}",
                inserted,
                kind_line + 1,
                "backend.torch_version",
                "is not a version number",
            )
    for index, path in enumerate(BOOL_KEYS):  # YAML 1.1 booleans where a boolean goes
        if path in keys and keys[path][1]:
            word = WORDS[(turn + index) % len(WORDS)]
            add(
                f"{'.'.join(path)}: {word}",
                with_value(text, keys[path][0], word),
                keys[path][0],
                ".".join(path),
                "tpuft reads YAML 1.2",
            )
    for section in (
        ("backend", "gin_overrides"),
        ("backend", "encoder"),
    ):  # ... and where a boolean or text goes
        entries = [
            (p, v)
            for p, v in keys.items()
            if p[:2] == section and len(p) == 3 and v[1] and p[2] != "model_type"
        ]
        if entries:
            (path, (line, _)) = entries[0]
            word = WORDS[turn % len(WORDS)]
            add(
                f"{'.'.join(path)}: {word}",
                with_value(text, line, word),
                line,
                ".".join(path),
                "is ambiguous here",
            )
    steps_line = keys[("train", "steps")][0]  # YAML errors on a key's line
    add(
        "a tag on train.steps",
        with_value(text, steps_line, "!custom 10"),
        steps_line,
        "train.steps",
        "the tag !custom",
    )
    add(
        "an undefined alias",
        with_value(text, steps_line, "*nowhere"),
        steps_line,
        "train.steps",
        "undefined alias",
    )
    nested = with_line_after(text, steps_line, indent_of(text, steps_line) + "    oops: 1")
    add("bad nesting under train.steps", nested, steps_line + 1, "train.steps", "not valid YAML")
    add("steps: 0", with_value(text, steps_line, "0"), steps_line, "train.steps", "must be >= 1, got 0")
    batch_line = keys[("train", "batch_size")][0]
    add(
        "batch_size: -4",
        with_value(text, batch_line, "-4"),
        batch_line,
        "train.batch_size",
        "must be >= 1, got -4",
    )
    if ("train", "learning_rate") in keys:
        line = keys[("train", "learning_rate")][0]
        add(
            "learning_rate: 100",
            with_value(text, line, "100"),
            line,
            "train.learning_rate",
            "must be <= 10, got 100",
        )
    typo = {"torch_xla": "torchxla", "keras": "kerass", "t5x": "t5"}[kind]
    add(
        f"kind: {typo}",
        with_value(text, kind_line, typo),
        kind_line,
        "backend.kind",
        "must be one of keras, t5x, torch_xla",
    )
    if ("description",) in keys and turn % 3 == 0:  # a value of megabytes
        line = keys[("description",)][0]
        add(
            "a description of megabytes",
            with_value(text, line, "x" * (1 << 20)),
            line,
            "description",
            "over the limit",
        )
    if tree["train"]["batch_size"] % 3:
        out.append(
            Case(
                f"[{name}] batch over 3 workers",
                "recipe",
                text,
                batch_line,
                "train.batch_size",
                "does not split evenly",
                THREE_WORKERS,
                also="tpuft.yaml:5: local.workers: 3",
            )
        )
    return out


def cluster_cases() -> list[Case]:
    out: list[Case] = []
    keys = key_lines(GCP_CLUSTER)
    for index, path in enumerate(
        [("gcp", "spot"), ("gcp", "queued"), ("gcp", "internal_ip"), ("ssh", "os_login")]
    ):
        for word in (WORDS[index], WORDS[index + 2]):
            line = keys[path][0]
            out.append(
                Case(
                    f"[gcp] {'.'.join(path)}: {word}",
                    "cluster",
                    with_value(GCP_CLUSTER, line, word),
                    line,
                    ".".join(path),
                    "tpuft reads YAML 1.2",
                )
            )
    for path, value, fragment in [
        (("ssh", "port"), "0", "must be >= 1, got 0"),
        (("ssh", "port"), "70000", "must be <= 65535, got 70000"),
        (("gcp", "slices"), "0", "must be >= 1, got 0"),
        (("gcp", "zone"), "!zone us-central2-b", "the tag !zone"),
        (("gcp", "project"), "*project", "undefined alias"),
        (("provider",), "gpc", "must be one of local, gcp"),
    ]:
        line = keys[path][0]
        out.append(
            Case(
                f"[gcp] {'.'.join(path)}: {value}",
                "cluster",
                with_value(GCP_CLUSTER, line, value),
                line,
                ".".join(path),
                fragment,
            )
        )
    local_keys = key_lines(LOCAL_CLUSTER)
    for value, fragment in (
        ("0", "must be >= 1, got 0"),
        ("65", "must be <= 64, got 65"),
        ("no", "expected a whole number"),
    ):
        line = local_keys[("local", "workers")][0]
        out.append(
            Case(
                f"[local] workers: {value}",
                "cluster",
                with_value(LOCAL_CLUSTER, line, value),
                line,
                "local.workers",
                fragment,
            )
        )
    return out


def empty_cases() -> list[Case]:
    out = []
    for target in ("recipe", "cluster"):
        what = "recipe" if target == "recipe" else "cluster file"
        out.append(Case(f"empty {what}", target, "", 1, "", f"the {what} is empty"))
        out.append(
            Case(f"{what} of comments", target, "# one\n\n  # two\n", 1, "", f"the {what} has only comments")
        )
    return out


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The shipped recipes that load from a copy next to a link to the shipped data (the others' data is not
    shipped: their schema is covered by tests/test_recipes.py)."""
    from tpuft.config import load_recipe
    from tpuft.core.errors import TpuftError

    folder = tmp_path_factory.mktemp("bases")
    (folder / "data").symlink_to(recipes_dir() / "data")
    found = {}
    for path in sorted(recipes_dir().glob("*.yaml")):
        copy = folder / path.name
        copy.write_text(path.read_text())
        try:
            load_recipe(copy)
        except TpuftError:
            continue
        found[path.stem] = path.read_text()
    assert len(found) >= 8, sorted(found)
    return found


def test_malformed_files_are_refused_at_file_line_key(bases: dict[str, str], tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "data").symlink_to(recipes_dir() / "data")
    cases = [
        case for turn, (name, text) in enumerate(bases.items()) for case in recipe_cases(name, text, turn)
    ]
    cases += cluster_cases() + empty_cases()
    assert len(cases) >= 100, len(cases)
    classes = {re.sub(r"\[.*?\] ", "", c.label).split(":")[0].split(" ")[0] for c in cases}
    failures: list[str] = []
    timings: list[tuple[float, str]] = []
    base_recipe = bases["quickstart"]
    for case in cases:
        recipe, cluster = tmp_path / "r.yaml", tmp_path / "tpuft.yaml"
        recipe.write_text(case.text if case.target == "recipe" else base_recipe)
        cluster.write_text(case.text if case.target == "cluster" else case.cluster_text)
        started = time.monotonic()
        result = cli("recipes", "validate", str(recipe), "--config", str(cluster))
        seconds = time.monotonic() - started
        timings.append((seconds, case.label))
        file = recipe if case.target == "recipe" else cluster
        located = f"{file}:{case.line}: {case.key}".rstrip()
        problems = [
            result.code != 2 and f"exit {result.code}",
            "Traceback" in result.err + result.out and "a traceback",
            located not in result.err and f"not at {located}",
            case.fragment not in result.err and f"no {case.fragment!r}",
            "Input should" in result.err and "pydantic's wording",
            case.also and case.also not in result.err and f"no {case.also!r}",
            seconds > 1.0 and f"{seconds:.2f} s",
        ]
        if any(problems):
            failures.append(f"{case.label}: {', '.join(p for p in problems if p)}\n{result.err[-600:]}")
    timings.sort(reverse=True)
    print(
        f"\n{len(cases)} malformed files, {len(classes)} kinds of mutation, {sum(t for t, _ in timings):.1f} "
        "s in all, "
        f"slowest {timings[0][0]:.2f} s ({timings[0][1]}), median {timings[len(timings) // 2][0]:.3f} s"
    )
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("word", WORDS)
def test_a_yaml11_word_where_text_goes_is_the_text(recipe_dir: Path, word: str) -> None:
    """``name: no`` means the name "no" (YAML 1.2); only where a boolean could go too is the word
    ambiguous."""
    from tests.conftest import MINIMAL_RECIPE
    from tpuft.config import load_recipe

    path = recipe_dir / "r.yaml"
    path.write_text(
        MINIMAL_RECIPE.replace("name: t", f"name: {word}").replace("  steps: 10", "  steps: 10\n  seed: 1\n")
    )
    loaded = load_recipe(path, ["description=" + word])
    assert loaded.value.name == word and loaded.value.description == word
