"""The local provider through the CLI: create is idempotent, status shows workers, delete asks and keeps runs."""

from __future__ import annotations

import json
import os
from pathlib import Path


def test_create_status_delete(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    first = cli("create", "-c", str(cluster_file), "--json")
    assert first.code == 0, first.err
    info = json.loads(first.out)
    assert info["created"] is True and info["state"] == "READY" and len(info["workers"]) == 2
    homes = [Path(w["home"]) for w in info["workers"]]
    assert all(h.is_dir() for h in homes) and homes[0] != homes[1]

    again = cli("create", "-c", str(cluster_file), "--json")
    assert again.code == 0 and json.loads(again.out)["created"] is False  # idempotent

    status = cli("status", "-c", str(cluster_file))
    assert status.code == 0 and "READY" in status.out and "worker-1" in status.out

    bucket = Path(info["bucket"])
    (bucket / "runs" / "r1").mkdir(parents=True)
    refused = cli("delete", "-c", str(cluster_file))  # no TTY, no --yes: refuse, change nothing
    assert refused.code == 2 and "--yes" in refused.err and homes[0].is_dir()

    gone = cli("delete", "-c", str(cluster_file), "--yes")
    assert gone.code == 0 and not homes[0].exists()
    assert (bucket / "runs" / "r1").is_dir()  # runs are kept
    status = cli("status", "-c", str(cluster_file), "--json")
    assert json.loads(status.out)["state"] == "NOT_FOUND"
    assert cli("delete", "-c", str(cluster_file), "--yes").code == 0  # nothing to delete is fine


def test_create_with_other_shape_is_refused(cli, cluster_file: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("create", "-c", str(cluster_file)).code == 0
    bigger = tmp_path / "four.yaml"
    bigger.write_text(cluster_file.read_text().replace("workers: 2", "workers: 4"))
    result = cli("create", "-c", str(bigger))
    assert result.code == 2
    assert "exists with 2 workers, the cluster file asks for 4" in result.err and "tpuft delete" in result.err


def test_broken_cluster_is_reported(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    info = json.loads(cli("create", "-c", str(cluster_file), "--json").out)
    os.rmdir(info["workers"][1]["home"])
    status = json.loads(cli("status", "-c", str(cluster_file), "--json").out)
    assert status["state"] == "BROKEN" and "missing: 1" in status["details"]["problem"]
    result = cli("exec", "-c", str(cluster_file), "--", "true")
    assert result.code == 2 and "BROKEN" in result.err


def test_exec_on_chosen_workers(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    cli("create", "-c", str(cluster_file))
    result = cli("exec", "-c", str(cluster_file), "--worker", "1", "--", "echo id=$TPUFT_WORKER_ID")
    assert result.code == 0 and "[w1] id=1" in result.out and "[w0]" not in result.out
    bad = cli("exec", "-c", str(cluster_file), "--worker", "5", "--", "true")
    assert bad.code == 2 and "no worker 5" in bad.err
    failing = cli("exec", "-c", str(cluster_file), "--", "echo oops; exit 4")
    assert failing.code == 4 and "failed on worker" in failing.err and "oops" in failing.err


def test_train_without_cluster_says_what_to_do(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("train", "quickstart", "-c", str(cluster_file))
    assert result.code == 2 and "does not exist" in result.err and "tpuft create" in result.err


def test_train_before_setup_says_to_run_setup(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(f"name: fresh\nprovider: local\nlocal:\n  workers: 2\n  venv_cache: {tmp_path / 'no-venvs'}\n")
    assert cli("create", "-c", str(cluster)).code == 0
    result = cli("train", "quickstart", "-c", str(cluster))
    assert result.code == 2
    assert "not set up on worker(s) 0, 1" in result.err and "tpuft setup quickstart" in result.err
    assert not (tmp_path / "no-venvs").exists() or not any((tmp_path / "no-venvs").iterdir())


def test_ssh_opens_a_shell_in_the_worker_home(cluster_file: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run([sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)], check=True, env=env, capture_output=True)
    shell = subprocess.run(
        [sys.executable, "-m", "tpuft", "ssh", "--worker", "1", "-c", str(cluster_file)],
        input="echo home=$HOME id=$TPUFT_WORKER_ID; pwd\n", text=True, capture_output=True, env=env, timeout=30,
    )
    assert shell.returncode == 0, shell.stderr
    assert "worker-1 id=1" in shell.stdout and shell.stdout.strip().endswith("worker-1")
