"""The local provider through the CLI: create is idempotent, status shows workers, delete asks and keeps
runs."""

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
    cluster.write_text(
        f"name: fresh\nprovider: local\nlocal:\n  workers: 2\n  venv_cache: {tmp_path / 'no-venvs'}\n"
    )
    assert cli("create", "-c", str(cluster)).code == 0
    result = cli("train", "quickstart", "-c", str(cluster))
    assert result.code == 2
    assert "not set up on worker(s) 0, 1" in result.err and "tpuft setup quickstart" in result.err
    assert not (tmp_path / "no-venvs").exists() or not any((tmp_path / "no-venvs").iterdir())


def test_ssh_opens_a_shell_in_the_worker_home(cluster_file: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run(
        [sys.executable, "-m", "tpuft", "create", "-c", str(cluster_file)],
        check=True,
        env=env,
        capture_output=True,
    )
    shell = subprocess.run(
        [sys.executable, "-m", "tpuft", "ssh", "--worker", "1", "-c", str(cluster_file)],
        input="echo home=$HOME id=$TPUFT_WORKER_ID; pwd\n",
        text=True,
        capture_output=True,
        env=env,
        timeout=30,
    )
    assert shell.returncode == 0, shell.stderr
    assert "worker-1 id=1" in shell.stdout and shell.stdout.strip().endswith("worker-1")


def test_two_slices_make_their_workers_and_show_them(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """local.slices: 2 x 2 workers, numbered slice by slice; status shows each slice, exec and ssh take
    S:I."""
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text(
        "name: ms\nprovider: local\naccelerator: v4-16\nlocal:\n  workers: 2\n  slices: 2\n"
        f"  state_dir: {tmp_path / 'state'}\n"
    )
    created = json.loads(cli("create", "-c", str(cluster), "--json").out)
    assert [(w["index"], w["slice"], w["host"], w["ref"]) for w in created["workers"]] == [
        (0, 0, 0, "0:0"),
        (1, 0, 1, "0:1"),
        (2, 1, 0, "1:0"),
        (3, 1, 1, "1:1"),
    ]
    assert [Path(w["home"]).name for w in created["workers"]] == [f"worker-{i}" for i in range(4)]
    status = json.loads(cli("status", "-c", str(cluster), "--json").out)  # a fresh get: the slices round-trip
    assert status["workers"] == created["workers"] and status["hosts_per_slice"] == 2
    assert status["slices"] == [
        {"slice": 0, "node": None, "state": "READY", "workers": ["0:0", "0:1"]},
        {"slice": 1, "node": None, "state": "READY", "workers": ["1:0", "1:1"]},
    ]
    text = cli("status", "-c", str(cluster)).out
    assert (
        "slices: 2 x 2 host(s)" in text and "slice 1: READY, workers 1:0, 1:1" in text and "1:1 (w3)" in text
    )

    from tpuft.config import load_cluster
    from tpuft.providers.local import LocalProvider

    with monkeypatch.context() as patched:  # an 8-core machine: the 4 workers of both slices get 2 cores each
        patched.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
        pinned = [w.cpus for w in LocalProvider(load_cluster(cluster).value).get().workers]
    assert pinned == [(0, 1), (2, 3), (4, 5), (6, 7)]

    ran = cli(
        "exec",
        "-c",
        str(cluster),
        "-w",
        "1:*",
        "--",
        "echo id=$TPUFT_WORKER_ID/$TPUFT_NUM_WORKERS slice=$TPUFT_SLICE_ID/$TPUFT_NUM_SLICES",
    )
    assert ran.code == 0 and sorted(ran.out.splitlines()) == [
        "[w2] id=2/4 slice=1/2",
        "[w3] id=3/4 slice=1/2",
    ]
    refused = cli("exec", "-c", str(cluster), "-w", "2:0", "--", "true")
    assert (
        refused.code == 2
        and "no slice 2 (the cluster has slices 0..1 of 2 hosts (0..1), workers 0..3)" in refused.err
    )
    # the same 4 workers as one slice: another shape, refused as local.workers is
    one_slice = tmp_path / "one.yaml"
    one_slice.write_text(cluster.read_text().replace("workers: 2\n  slices: 2", "workers: 4"))
    other = cli("create", "-c", str(one_slice))
    assert (
        other.code == 2
        and "exists with 4 workers (2 slices of 2), the cluster file asks for 4 workers" in other.err
    )
