"""A few hundred generated mutations of the shipped recipe and cluster files, as a careless or hostile user
would write them: every clearly invalid one exits 2 within a second through the real CLI entry point, naming
file:line and the key, with no traceback; a handful of harmless edits are still accepted.

Mutations are made on the parsed tree and written back as YAML, so the expected line of each key is read from
the written file (with plain PyYAML, independent of tpuft's reader).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tpuft.core.paths import recipes_dir

Path_ = tuple[str, ...]

FREE_KEYS = {("worker_env",), ("gcp", "labels"), ("gcp", "metadata")}
"""Mappings whose keys are the user's own names (mutated by adding bad entries, not by typos)."""
ENUM_LIKE = {
    "kind",
    "optimizer",
    "schedule",
    "provider",
    "dtype",
    "worker_device",
    "feed_forward_proj",
    "accelerator",
    "zone",
    "project",
    "name",
    "topology",
    "runtime_version",
    "bucket",
    "user",
    "python",
    "source_field",
    "target_field",
    "tokenizer",
    "valid_until",
}
"""String keys whose value is a name with a format: a sentence with spaces and punctuation is never valid
there."""
REQUIRED = {
    ("recipe", ("name",)),
    ("recipe", ("backend",)),
    ("recipe", ("model",)),
    ("recipe", ("data",)),
    ("recipe", ("train",)),
    ("recipe", ("data", "train")),
    ("recipe", ("train", "steps")),
}

GCP_CLUSTER = {
    "name": "t5-v4",
    "provider": "gcp",
    "accelerator": "v4-32",
    "bucket": "gs://my-runs/team-a",
    "worker_env": {"XLA_FLAGS": "--xla_dump_to=/tmp/dump"},
    "gcp": {
        "project": "my-project",
        "zone": "us-central2-b",
        "runtime_version": "tpu-ubuntu2204-base",
        "spot": False,
        "queued": True,
        "valid_until": "6h",
        "slices": 1,
        "labels": {"team": "ml"},
        "metadata": {"startup-script": "echo hi"},
        "internal_ip": False,
        "tpu_api_endpoint": "https://tpu.googleapis.com",
        "venv_cache": "~/.cache/tpuft/venvs",
        "python": "python3",
        "worker_device": "tpu",
    },
    "ssh": {"user": "ml", "port": 22, "os_login": False, "connect_attempts": 10, "retry_delay_s": 5.0},
}


@dataclass
class Mutation:
    kind: str  # "recipe" or "cluster"
    base: str
    description: str
    tree: Any
    path: Path_  # the key the error must name (or an ancestor of it)
    valid: bool = False


def _leaves(tree: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path, tree


def _mappings(tree: Any, path: Path_ = ()) -> Iterator[tuple[Path_, dict]]:
    if isinstance(tree, dict):
        yield path, tree
        for key, value in tree.items():
            yield from _mappings(value, (*path, key))


def _set(tree: Any, path: Path_, value: Any) -> Any:
    out = copy.deepcopy(tree)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _rename(tree: Any, path: Path_, new: str) -> Any:
    out = copy.deepcopy(tree)
    node = out
    for part in path[:-1]:
        node = node[part]
    node_items = list(node.items())
    node.clear()
    for key, value in node_items:
        node[new if key == path[-1] else key] = value
    return out


def _delete(tree: Any, path: Path_) -> Any:
    out = copy.deepcopy(tree)
    node = out
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return out


def _typos(key: str) -> list[str]:
    out = {key[:-1] + key[-1] * 2, key[1:] if len(key) > 3 else key + "x"}
    if len(key) > 3:
        out.add(key[:1] + key[2] + key[1] + key[3:])
    return sorted(k for k in out if k != key)


def _bad_values(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, bool):
        return [("text", "maybe"), ("number", 2), ("list", [True]), ("'yes'", "yes")]
    if isinstance(value, int):
        return [
            ("text", "abc"),
            ("bool", True),
            ("fraction", 1.5),
            ("list", [1]),
            ("mapping", {"a": 1}),
            ("huge", 10**30),
            ("negative", -5),
        ]
    if isinstance(value, float):
        return [
            ("text", "abc"),
            ("bool", True),
            ("list", [1.0]),
            ("nan", float("nan")),
            ("inf", float("inf")),
            ("very negative", -1e300),
        ]
    if isinstance(value, str):
        out = [("number", 12345), ("list", ["a"]), ("mapping", {"a": "b"}), ("NUL", "a\x00b")]
        if key in ENUM_LIKE:
            out.append(("sentence", "not a valid value; rm -rf ~"))
        return out
    return []


def mutations(kind: str, base: str, tree: dict) -> list[Mutation]:
    found: list[Mutation] = []
    for path, value in _leaves(tree):
        if any(path[: len(free)] == free for free in FREE_KEYS):
            continue
        for label, bad in _bad_values(str(path[-1]), value):
            if label == "NUL" and path[-1] in {"description", "prefix"}:
                continue  # free text: a NUL there is only odd
            found.append(Mutation(kind, base, f"{'.'.join(path)} = {label}", _set(tree, path, bad), path))
    for path, mapping in _mappings(tree):
        if path in FREE_KEYS:
            for bad_key in ("X=1 touch /tmp/owned; Y", "A B", "Bad!Key" if path != ("worker_env",) else "1X"):
                found.append(
                    Mutation(
                        kind,
                        base,
                        f"{'.'.join(path)}[{bad_key!r}]",
                        _set(tree, (*path, bad_key), "v"),
                        (*path, bad_key),
                    )
                )
            continue
        for key in mapping:
            for typo in _typos(key):
                if typo in mapping:
                    continue
                found.append(
                    Mutation(
                        kind,
                        base,
                        f"typo {'.'.join((*path, key))} -> {typo}",
                        _rename(tree, (*path, key), typo),
                        (*path, typo),
                    )
                )
        found.append(
            Mutation(
                kind,
                base,
                f"unknown key under {'.'.join(path) or 'top'}",
                _set(tree, (*path, "extra_setting"), 1),
                (*path, "extra_setting"),
            )
        )
        if path and path not in {("model", "config")}:
            found.append(Mutation(kind, base, f"{'.'.join(path)} as a list", _set(tree, path, [1, 2]), path))
            found.append(Mutation(kind, base, f"{'.'.join(path)} as text", _set(tree, path, "oops"), path))
    for required_kind, path in sorted(REQUIRED):
        if required_kind == kind and _has(tree, path):
            found.append(Mutation(kind, base, f"without {'.'.join(path)}", _delete(tree, path), path))
    return found


def _has(tree: Any, path: Path_) -> bool:
    node = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def valid_edits(kind: str, base: str, tree: dict) -> list[Mutation]:
    if kind == "recipe":
        edits = [
            (("train", "steps"), 2000),
            (("description",), "my run"),
            (("data", "prefix"), "read: "),
            (("train", "learning_rate"), 3e-4),
            (("model", "config", "d_model"), 64),
            (("eval", "every"), None),
        ]
    elif tree.get("provider") == "gcp":
        edits = [
            (("accelerator",), "v4-64"),  # a zone offers a generation: us-central2-b has every v4 size
            (("gcp", "skip_zone_check"), True),
            (("gcp", "labels", "owner"), "me"),
            (("ssh", "port"), 2222),
        ]
    else:
        edits = [(("local", "workers"), 1), (("accelerator",), "v5litepod-8")]
    return [
        Mutation(kind, base, f"valid: {'.'.join(p)} = {v!r}", _set(tree, p, v), p, valid=True)
        for p, v in edits
    ]


def all_mutations(data_dir: Path) -> list[Mutation]:
    recipe = yaml.safe_load((recipes_dir() / "quickstart.yaml").read_text())
    recipe["data"]["train"] = str(data_dir / "train.jsonl")
    recipe["data"]["eval"] = str(data_dir / "eval.jsonl")
    recipe["data"]["test"] = str(data_dir / "eval.jsonl")
    local_cluster = yaml.safe_load((REPO / "tpuft.yaml").read_text())
    out: list[Mutation] = []
    for kind, base, tree in (
        ("recipe", "quickstart", recipe),
        ("cluster", "tpuft.yaml", local_cluster),
        ("cluster", "gcp", GCP_CLUSTER),
    ):
        out += mutations(kind, base, tree) + valid_edits(kind, base, tree)
    return out


def line_of(text: str, path: Path_) -> int | None:
    node = yaml.compose(text)
    for part in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        for key_node, value_node in node.value:
            if key_node.value == part:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return None
    return line if path else 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Mutation]]:
    folder = tmp_path_factory.mktemp("mutations")
    rows = [json.dumps({"words": f"number {i}", "digits": str(i)}) for i in range(8)]
    (folder / "train.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "eval.jsonl").write_text("\n".join(rows[:2]) + "\n")
    return folder, all_mutations(folder)


def write_case(folder: Path, mutation: Mutation) -> tuple[Path, Path]:
    text = yaml.safe_dump(mutation.tree, sort_keys=False, allow_unicode=True)
    target = folder / ("r.yaml" if mutation.kind == "recipe" else "tpuft.yaml")
    target.write_text(text)
    recipe = target if mutation.kind == "recipe" else folder / "base-recipe.yaml"
    cluster = target if mutation.kind == "cluster" else folder / "base-cluster.yaml"
    return recipe, cluster


def test_the_corpus_is_a_few_hundred(corpus: tuple[Path, list[Mutation]]) -> None:
    _, found = corpus
    invalid = [m for m in found if not m.valid]
    assert len(invalid) >= 300, len(invalid)
    print(f"\n{len(invalid)} invalid mutations, {len(found) - len(invalid)} valid edits")


def test_every_mutation_is_refused_located_and_quick(
    corpus: tuple[Path, list[Mutation]], tmp_path: Path, cli
) -> None:  # type: ignore[no-untyped-def]
    data_dir, found = corpus
    base_recipe = yaml.safe_load((recipes_dir() / "quickstart.yaml").read_text())
    base_recipe["data"]["train"] = str(data_dir / "train.jsonl")
    base_recipe["data"]["eval"] = str(data_dir / "eval.jsonl")
    base_recipe["data"]["test"] = str(data_dir / "eval.jsonl")
    (tmp_path / "base-recipe.yaml").write_text(yaml.safe_dump(base_recipe, sort_keys=False))
    (tmp_path / "base-cluster.yaml").write_text("name: mutations\nprovider: local\nlocal:\n  workers: 2\n")
    failures: list[str] = []
    slowest = 0.0
    outcomes = {"refused": 0, "accepted": 0}
    for mutation in found:
        recipe, cluster = write_case(tmp_path, mutation)
        started = time.monotonic()
        result = cli("recipes", "validate", str(recipe), "--config", str(cluster))
        seconds = time.monotonic() - started
        slowest = max(slowest, seconds)
        label = f"[{mutation.base}] {mutation.description}"
        if "Traceback" in result.err or seconds > 1.0:
            failures.append(f"{label}: traceback or slow ({seconds:.2f} s)\n{result.err[-800:]}")
            continue
        if mutation.valid:
            outcomes["accepted"] += result.code == 0
            if result.code != 0:
                failures.append(f"{label}: a valid edit was refused:\n{result.err[-800:]}")
            continue
        if result.code != 2:
            failures.append(
                f"{label}: exit {result.code} (expected 2)\n{result.out[-300:]}{result.err[-500:]}"
            )
            continue
        outcomes["refused"] += 1
        target = recipe if mutation.kind == "recipe" else cluster
        text = target.read_text()
        located = False
        for depth in range(len(mutation.path), 0, -1):  # the key, or the section that owns it (a union's tag)
            prefix = mutation.path[:depth]
            line = line_of(text, prefix)
            if line is None and mutation.description.startswith(
                "without "
            ):  # a missing key: its section's line
                line = line_of(text, prefix[:-1])
            dotted = ".".join(prefix)
            if line is not None and f"{target}:{line}: {dotted}: " in result.err:
                located = True
                break
        if not located:
            failures.append(f"{label}: not located at {'.'.join(mutation.path)}:\n{result.err[-800:]}")
    print(f"\nslowest case {slowest:.3f} s; {outcomes}")
    assert not failures, f"{len(failures)} of {len(found)} mutations:\n\n" + "\n\n".join(failures[:40])


def test_a_sample_through_a_real_process(corpus: tuple[Path, list[Mutation]], tmp_path: Path) -> None:
    """The installed entry point, in a fresh interpreter: exit 2, no traceback, no hang."""
    data_dir, found = corpus
    (tmp_path / "base-recipe.yaml").write_text(
        (recipes_dir() / "quickstart.yaml")
        .read_text()
        .replace("data/numbers/", str(recipes_dir() / "data/numbers") + "/")
    )
    (tmp_path / "base-cluster.yaml").write_text("name: mutations\nprovider: local\n")
    sample = [m for m in found if not m.valid][:: max(1, len(found) // 12)][:12]
    for mutation in sample:
        recipe, cluster = write_case(tmp_path, mutation)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "tpuft", "recipes", "validate", str(recipe), "--config", str(cluster)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 2, (mutation.description, result.stderr)
        assert (
            "Traceback" not in result.stderr
            and str(recipe if mutation.kind == "recipe" else cluster) + ":" in result.stderr
        )
        assert time.monotonic() - started < 10
