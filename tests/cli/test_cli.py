"""Every verb has help with an example; --version; the CLI and the worker keep their imports apart."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpuft import __version__

VERBS = ["create", "setup", "train", "up", "monitor", "convert", "delete", "status", "exec", "ssh", "doctor"]


@pytest.mark.parametrize("verb", VERBS + ["recipes ls", "recipes show", "recipes cp", "recipes validate"])
def test_help_has_an_example(cli, verb: str) -> None:  # type: ignore[no-untyped-def]
    result = cli(*verb.split(), "--help")
    assert result.code == 0
    assert "Example: tpuft" in result.out


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"tpuft {__version__}"


def test_unknown_command_is_a_usage_error(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("trian")
    assert result.code == 2


HEAVY = (
    "torch",
    "tensorflow",
    "jax",
    "transformers",
    "tf_keras",
    "torch_xla",
    "numpy",
    "safetensors",
    "paramiko",
    "google.cloud.tpu_v2",
    "google.cloud.storage",
)


def test_cli_imports_no_ml_framework() -> None:
    code = f"import sys, tpuft.cli; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_worker_does_not_import_the_cli_side() -> None:
    code = (
        "import sys, tpuft.worker.__main__, tpuft.worker.torch_xla.train, "
        "tpuft.worker.metrics, tpuft.convert.hf_ckpt;print(' '.join(m for m in ('typer', 'rich', "
        "'tpuft.cli', 'tpuft.ops', 'tpuft.fleet', 'tpuft.providers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def test_one_command_table_for_the_app_and_the_fast_help() -> None:
    """The app's verbs are the table's (no command missing from the launcher's help, none the app lacks), with
    the table's panels and help; the launcher's help is built from the same table, without Typer."""
    from typer.main import get_command

    from tpuft.cli import app
    from tpuft.commands import RECIPE_VERBS, VERBS, top_level_help

    group = get_command(app)
    assert sorted(v.name for v in VERBS) == sorted(group.commands)
    for spec in VERBS:
        command = group.commands[spec.name]
        assert command.rich_help_panel == spec.panel or spec.name == "recipes", spec.name
        assert (command.help or "").strip() == (spec.help if spec.name != "recipes" else spec.summary)
    recipes = group.commands["recipes"]
    assert sorted(recipes.commands) == sorted(v.name for v in RECIPE_VERBS)  # type: ignore[attr-defined]
    text = top_level_help(color=False)
    assert "tpuft up quickstart" in text and all(f"  {v.name}" in text for v in VERBS)


def test_the_cli_and_the_launcher_import_each_other_one_way() -> None:
    code = "import sys, tpuft.cli; print('tpuft.launcher' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


def test_fast_help_and_version_skip_typer() -> None:
    code = (
        "import sys; sys.argv=['tpuft', '--help']\nfrom tpuft.launcher import main\ntry:\n    "
        "main()\nexcept SystemExit:\n    pass\nprint('typer' in sys.modules, 'rich' in "
        "sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False False")
    assert "Cluster:" in out and "monitor" in out


def test_fast_exec_parser() -> None:
    from tpuft.launcher import parse_fast_exec

    assert parse_fast_exec(["exec", "--", "echo", "hi"]) == ({}, ["echo", "hi"])
    assert parse_fast_exec(["exec", "-c", "t.yaml", "--worker=0,2", "--", "true"]) == (
        {"config": "t.yaml", "worker": "0,2"},
        ["true"],
    )
    for other in (
        ["exec", "--help"],
        [
            "exec",
            "--",
        ],
        ["exec", "--verbose", "--", "x"],
        ["exec", "-c", "--", "x"],
        ["status"],
        ["exec", "-w", "1", "-w", "2", "--", "x"],
    ):
        assert parse_fast_exec(other) is None, other  # Typer parses (and reports) everything else


@pytest.mark.parametrize(
    "args",
    [
        ["--", "echo id=$TPUFT_WORKER_ID"],
        ["-w", "1", "--", "echo", "one", "two"],
        ["--", 'if [ "$TPUFT_WORKER_ID" = 1 ]; then echo oops; exit 4; fi; sleep 5'],
        ["--worker", "5", "--", "true"],
    ],
    ids=["all", "one-worker-argv", "failure", "bad-worker"],
)
def test_fast_exec_prints_what_the_typer_command_prints(cli, cluster_file, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    import os

    assert cli("create", "-c", str(cluster_file)).code == 0
    typer_path = cli("exec", "-c", str(cluster_file), *args)
    env = {**os.environ, "COLUMNS": "200"}
    fast = subprocess.run(
        [sys.executable, "-m", "tpuft", "exec", "-c", str(cluster_file), *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert fast.returncode == typer_path.code
    assert sorted(fast.stdout.splitlines()) == sorted(typer_path.out.splitlines())
    assert fast.stderr.strip() == typer_path.err.strip()


def test_status_json_gives_each_slice_its_node_state_and_workers() -> None:
    """A multislice GCP cluster: the provider's ``details["slice S"]`` ("NODE STATE") become the slices'
    entries."""
    from tpuft.cli.render import cluster_json
    from tpuft.core.records import Cluster, State, Worker

    workers = [
        Worker(index=i, address=f"34.0.0.{i}", internal_address=f"10.0.{i // 2}.{i % 2}", slice=i // 2)
        for i in range(4)
    ]
    details = {"queued_resource": "qr ACTIVE", "slice 0": "demo-0 READY", "slice 1": "demo-1 PREEMPTED"}
    shown = cluster_json(Cluster("demo", "gcp", State.BROKEN, "v4-16", workers, "gs://b", details))
    assert shown["slices"] == [
        {"slice": 0, "node": "demo-0", "state": "READY", "workers": ["0:0", "0:1"]},
        {"slice": 1, "node": "demo-1", "state": "PREEMPTED", "workers": ["1:0", "1:1"]},
    ]
    assert shown["hosts_per_slice"] == 2 and shown["workers"][3]["ref"] == "1:1"
    assert shown["workers"][3]["internal_address"] == "10.0.1.1"
    one = cluster_json(Cluster("one", "gcp", State.READY, "v4-16", workers[:2], "gs://b", {}))
    assert one["slices"] == [{"slice": 0, "node": None, "state": "READY", "workers": ["0", "1"]}]
