"""Odd paths and out-of-range options on the command line: exit 2, one clear line, no traceback, no hang, and
nothing written where it should not be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuft.run import rundir

T5X = Path(__file__).resolve().parents[1] / "data" / "t5x" / "t5_1_1_tiny" / "legacy"


@pytest.fixture
def with_run(tmp_path: Path, cli) -> Path:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: args\nbucket: {tmp_path / 'bucket'}\nlocal:\n  workers: 2\n")
    run = tmp_path / "bucket" / "runs" / "x-1"
    (run / rundir.TB_DIR).mkdir(parents=True)
    (run / rundir.RUN_INFO).write_text(json.dumps({"run_id": "x-1", "status": "finished"}))
    return cluster


CASES = [
    (["tensorboard", "--port", "99999"], "Invalid value for '--port'"),
    (["tensorboard", "--host", "bad host"], "--host 'bad host': not an address of this machine"),
    (["pull", "x-1", "/dev/null"], "/dev/null exists and is not a folder"),
    (["pull", "--workers", "0"], "workers must be at least 1"),
    (["pull", "--checkpoints", "bogus"], "expected one of latest, best, all, none"),
    (["recipes", "cp", "quickstart", "/dev/null"], "/dev/null is not a file or a folder"),
    (
        ["convert", str(T5X), "OUT", "--hf-config", "/dev/zero"],
        "--hf-config /dev/zero: file is not a regular file",
    ),
    (["convert", str(T5X), "OUT", "--hf-set", "bad"], "expected KEY=VALUE"),
    (["convert", str(T5X), "OUT", "--max-shard-size", "abc"], "expected a size such as 5GB"),
    (["monitor", "--interval", "0"], "must be positive"),
    (["monitor", "--plot", "/dev/null/x.png"], "cannot write /dev/null/x.png"),
    (["train", "/dev/zero"], "/dev/zero: recipe is not a regular file"),
    (["recipes", "validate", "/"], "/: recipe is a directory, not a file"),
    (["exec", "-w", "x", "--", "true"], "--worker 'x': expected indices"),
]


@pytest.mark.parametrize(
    ("args", "fragment"), CASES, ids=[" ".join(c[0][:2]) + f"-{i}" for i, c in enumerate(CASES)]
)
def test_bad_arguments_are_one_clear_line(
    with_run: Path, tmp_path: Path, cli, args: list[str], fragment: str
) -> None:  # type: ignore[no-untyped-def]
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    if args[0] != "convert" and args[:2] != ["recipes", "cp"]:
        args = (
            [*args[:1], "-c", str(with_run), *args[1:]]
            if args[0] != "recipes"
            else [*args, "-c", str(with_run)]
        )
    if args[0] == "exec":
        assert cli("create", "-c", str(with_run)).code == 0
    result = cli(*args)
    assert result.code == 2, (result.code, result.err)
    assert fragment in result.err and "Traceback" not in result.err, result.err
    assert not Path("/dev/null.yaml").exists() and not (tmp_path / "out").exists()


def test_a_path_the_system_refuses_is_one_line_not_a_traceback(
    with_run: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    # /proc takes no new files, even from root
    result = cli("recipes", "cp", "quickstart", "/proc/tpuft-test.yaml")
    assert result.code == 1 and "Traceback" not in result.err
    assert "error: No such file or directory: /proc/tpuft-test.yaml" in result.err
    monkeypatch.setenv("TPUFT_DEBUG", "1")
    with pytest.raises(OSError):
        cli("recipes", "cp", "quickstart", "/proc/tpuft-test.yaml")
