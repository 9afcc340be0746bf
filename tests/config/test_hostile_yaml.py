"""YAML that attacks the parser: refused at file:line with exit 2, in bounded time and memory, never a
traceback."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE as GOOD
from tpuft.config import load_cluster, load_recipe
from tpuft.core import safe_yaml
from tpuft.core.errors import ConfigError


def bomb(levels: int = 9, fan: int = 9) -> str:
    """The 'billion laughs': each level repeats the previous one `fan` times (9**9 = 387 M strings, ~1 KB of
    text)."""
    lines = ['a0: &a0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * fan)}]")
    return "\n".join(lines) + "\n"


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels + "\n"


# (text, message fragment, line)
HOSTILE = [
    (GOOD + bomb(), "expands to more than 100,000 values", 17),
    (GOOD + "description: &r [*r]\n", "an alias refers to the node that contains it (a cycle)", 11),
    (GOOD + "description: &m {a: *m}\n", "a cycle", 11),
    (GOOD + "description: " + deep(1000), "nested more than 32 levels deep", 11),
    (GOOD + "description: {" * 40 + "}" * 40 + "\n", "nested more than 32 levels deep", 11),
    (GOOD + "? [a, b]\n: 1\n", "a key must be a plain name, not a list or a mapping", 11),
    (GOOD + "? {a: 1}\n: 1\n", "a key must be a plain name", 11),
    (
        GOOD + "description: !!python/object/apply:os.system ['touch /tmp/owned']\n",
        "the tag !!python/object/apply:os.system is not allowed",
        11,
    ),
    (GOOD + "description: !!python/name:os.system\n", "is not allowed", 11),
    (GOOD + "description: !!binary aGVsbG8=\n", "the tag !!binary is not allowed", 11),
    (GOOD + "description: !custom x\n", "the tag !custom is not allowed", 11),
    (GOOD + "description: !!set {a, b}\n", "the tag !!set is not allowed", 11),
    (GOOD + "---\nname: u\n", "more than one YAML document", 11),
    (GOOD + "description: [\n", "not valid YAML", 12),
    (GOOD + "description:\tx\n", "not valid YAML", 11),
    (GOOD + "description: 'a\x00b'\n", "not valid YAML: character #x0000 is not allowed", 11),
    (
        GOOD.replace("  steps: 10", "  steps: 10\n  steps: 20"),
        "train.steps: duplicate key (first set on line 9)",
        10,
    ),
    ("- name: t\n- kind: x\n", "expected a mapping of keys at the top level", 1),
    ("just text\n", "expected a mapping of keys at the top level", 1),
]


@pytest.mark.parametrize(
    ("text", "fragment", "line"), HOSTILE, ids=[f"{i}:{h[1][:30]}" for i, h in enumerate(HOSTILE)]
)
def test_hostile_yaml_is_refused_quickly_and_located(
    recipe_dir: Path, text: str, fragment: str, line: int
) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert time.monotonic() - started < 1.0
    tracemalloc.start()  # memory in a second pass: tracing slows Python down several times
    try:
        with pytest.raises(ConfigError):
            load_recipe(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024
    assert f"{path}:{line}: " in str(info.value) and fragment in str(info.value), str(info.value)


def test_anchors_and_merges_used_sensibly_still_work(recipe_dir: Path) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(GOOD.replace("  batch_size: 4", "  batch_size: &b 4") + "eval:\n  batch_size: *b\n")
    assert load_recipe(path).value.eval.batch_size == 4
    cluster = recipe_dir / "tpuft.yaml"
    cluster.write_text("local: &l\n  workers: 2\nname: tpuft-local\n")
    assert load_cluster(cluster).value.num_workers == 2
    merged, _ = safe_yaml.load("base: &b {x: 1, y: 2}\nmine:\n  <<: *b\n  y: 3\n")
    assert merged["mine"] == {"x": 1, "y": 3}


def test_yaml_1_2_scalars_mean_what_people_mean() -> None:
    data, _ = safe_yaml.load(
        "a: no\nb: 012\nc: 1:20\nd: 1e-3\ne: 0o17\nf: 0x1f\ng: True\nh: 2026-12-01\ni: ~\nj: .inf\n"
    )
    assert data == {
        "a": "no",
        "b": 12,
        "c": "1:20",
        "d": 0.001,
        "e": 15,
        "f": 31,
        "g": True,
        "h": "2026-12-01",
        "i": None,
        "j": float("inf"),
    }
    assert safe_yaml.load("1: a\ntrue: b\n")[0] == {"1": "a", "true": "b"}  # keys are names


def test_dumped_recipes_read_back_as_they_were() -> None:
    tricky = {"a": "1e-3", "b": "0o17", "c": "no", "d": "012", "e": "null", "f": "1:20", "g": 0.001, "h": "ü"}
    assert safe_yaml.load(safe_yaml.dump(tricky))[0] == tricky


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_are_refused_without_reading(special: str, tmp_path: Path) -> None:
    if not os.path.exists(special):
        pytest.skip(f"{special} is not on this machine")
    started = time.monotonic()
    with pytest.raises(ConfigError, match=f"{special}: recipe is not a regular file"):
        load_recipe(Path(special))
    assert time.monotonic() - started < 1.0


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            load_recipe(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=2)
    if thread.is_alive():  # unblock the reader so the thread can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("loading a FIFO blocked")
    assert isinstance(outcome[0], ConfigError) and "is not a regular file" in str(outcome[0])


def test_big_folder_and_binary_files(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("description: " + "x" * (2 << 20) + "\n")
    with pytest.raises(
        ConfigError, match=r"big.yaml:1: description: recipe is 2,097,166 bytes, over the limit of 1,048,576"
    ):
        load_recipe(big)
    with pytest.raises(ConfigError, match=r"tpuft.yaml: cluster file is a directory"):
        (tmp_path / "tpuft.yaml").mkdir()
        load_cluster(tmp_path / "tpuft.yaml")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: t\ndescription: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml:2: recipe is not UTF-8: byte 0xe9 at column 17"):
        load_recipe(latin)


def test_overrides_go_through_the_same_limits(recipe_dir: Path) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(GOOD)
    nested = "[" * 40 + "]" * 40
    with pytest.raises(ConfigError, match=r"--set description=.*nested more than 16 levels deep"):
        load_recipe(path, [f"description={nested}"])
    expanding = (
        "[&a [1,1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c "
        "[*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]]"
    )
    with pytest.raises(ConfigError, match=r"expands to more than 10,000 values"):
        load_recipe(path, [f"description={expanding}"])
    with pytest.raises(ConfigError, match=r"the tag !!python/object:os.system is not allowed"):
        load_recipe(path, ["description=!!python/object:os.system x"])
    with pytest.raises(ConfigError, match=r"the value is over 16,384 characters"):
        load_recipe(path, ["description=" + "x" * 20_000])


def test_cli_exit_2_and_no_traceback_for_a_bomb(recipe_dir: Path, cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    path = recipe_dir / "r.yaml"
    path.write_text(GOOD + bomb())
    result = cli("recipes", "validate", str(path), "--config", str(cluster_file))
    assert result.code == 2 and "Traceback" not in result.err
    assert f"{path}:17: a6: expands to more than 100,000 values" in result.err  # the line's key named too
