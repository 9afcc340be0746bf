"""train's bookkeeping around the trainer: a run that cannot start, and a run interrupted by Ctrl-C, each leave
run.json saying so, with no worker process left behind.

The venvs here are real folders that tpuft's bootstrap accepts as built (its completion marker). Their ``bin/python``
is either missing (as after a half-finished clean-up of the cache) or a stand-in trainer: a shell script that records
its pid and waits, so that the controller's side (launch, supervision, Ctrl-C, run.json) is tested without torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.ops.standin import built_venv


def test_a_trainer_that_cannot_start_leaves_a_failed_run(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    cluster, recipe, venv = built_venv(tmp_path, cli, None)
    cache, key = venv.parent, venv.name

    result = cli("train", str(recipe), "-c", str(cluster))
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    assert f"worker 0: cannot start {cache / key / 'bin' / 'python'}: No such file or directory" in result.err
    bucket = Path(json.loads(cli("status", "-c", str(cluster), "--json").out)["bucket"])
    runs = list((bucket / "runs").iterdir())
    assert len(runs) == 1
    info = json.loads((runs[0] / "run.json").read_text())
    assert info["status"] == "failed" and "cannot start" in info["cause"]


STAND_IN = """#!/bin/bash
echo $$ > "$HOME/trainer.pid"
echo "stand-in trainer $TPUFT_WORKER_ID of $TPUFT_NUM_WORKERS"
sleep 300
"""


def test_ctrl_c_during_training_stops_every_worker_and_says_interrupted(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import default_sigint
    from tests.fleet.test_local_fleet import alive, wait_for_files

    cluster, recipe, _ = built_venv(tmp_path, cli, STAND_IN)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuft", "train", str(recipe), "-c", str(cluster)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
        env={**os.environ, "COLUMNS": "200"},
    )
    homes = [Path(os.environ["TPUFT_HOME"]) / "local" / "stand-in" / "workers" / f"worker-{i}" for i in range(2)]
    wait_for_files([home / "trainer.pid" for home in homes])
    pids = [int((home / "trainer.pid").read_text()) for home in homes]
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    assert [pid for pid in pids if alive(pid)] == []
    bucket = Path(json.loads(cli("status", "-c", str(cluster), "--json").out)["bucket"])
    (run,) = list((bucket / "runs").iterdir())
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["workers"] == 2
    log = (run / "logs" / "worker-1.log").read_text()
    assert "stand-in trainer 1 of 2" in log  # TPUFT_WORKER_ID / TPUFT_NUM_WORKERS from the launch plan
