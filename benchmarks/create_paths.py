"""Create-to-first-step on the rigs: the Cloud TPU API path beside the Compute Engine path, same pod size.

For each path, a fresh set of stand-ins (the fake Cloud TPU API or the fake Compute Engine API, an sshd pod of
2 workers, the GCS emulator) and one ``tpuft up quickstart`` on it, PyTorch/XLA on CPU workers from this
machine's venv cache (built once before; run the quickstart first). Timed from the start of ``tpuft create``
to:
- created: ``tpuft create`` done (the cluster READY, the bucket made);
- first step: then ``tpuft up quickstart`` (setup from the cached venv, the launch) until the first heartbeat
  with step >= 1 on worker 0 (its staging folder on the sshd worker).
The table is each column's median of ``--runs`` runs, the paths taking turns. The slice: ``v4-16`` (2 hosts,
a TPU node) against ``tpu7x-16`` (2 hosts: an instance template, a workload policy and a managed instance
group).
What it measures is tpuft's own cost per path (the calls, their polls, pinning host keys, the same setup and
launch), not Google's provisioning time, which the stand-ins do not have.

Run: python benchmarks/create_paths.py [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.gcp_rig import rig_cluster, staged_step  # noqa: E402
from tests.rigs.fake_compute import FakeComputeServer  # noqa: E402
from tests.rigs.fake_tpu import FakeTpuServer  # noqa: E402
from tests.rigs.gcs_emulator import GcsEmulator  # noqa: E402
from tests.rigs.sshd_pod import SshdPod  # noqa: E402

STEPS = 20


def one_run(path: str, root: Path) -> dict[str, float]:
    api = FakeComputeServer(operation_polls=1) if path == "compute" else FakeTpuServer(operation_polls=1)
    with api as server, SshdPod(root / "pod", workers=2) as pod, GcsEmulator() as gcs:
        cluster, env = rig_cluster(root, server, pod, gcs)
        started = time.monotonic()
        create = subprocess.run(
            [sys.executable, "-m", "tpuft", "create", "-c", str(cluster), "--yes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if create.returncode != 0:
            raise SystemExit(f"{path}: tpuft create failed:\n{create.stderr[-3000:]}")
        created = time.monotonic() - started
        up = subprocess.Popen(
            [sys.executable, "-m", "tpuft", "up", "quickstart", "-c", str(cluster), "--yes"]
            + ["--set", f"train.steps={STEPS}", "--set", "train.warmup_steps=5", "--set", "eval.every=1000"]
            + ["--set", "train.log_every=1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        first_step = None
        while up.poll() is None and first_step is None:
            if staged_step(pod, 0) >= 1:
                first_step = time.monotonic() - started
            time.sleep(0.05)
        _, err = up.communicate(timeout=900)
        if up.returncode != 0 or first_step is None:
            raise SystemExit(f"{path}: tpuft up failed ({up.returncode}):\n{err[-3000:]}")
        return {"created_s": created, "first_step_s": first_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found: dict[str, list[dict[str, float]]] = {"tpu": [], "compute": []}
    for run in range(args.runs):
        for path in found:
            with tempfile.TemporaryDirectory(prefix=f"create-{path}-{run}-") as folder:
                found[path].append(one_run(path, Path(folder)))
    table = {
        path: {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
        for path, runs in found.items()
    }
    if args.json:
        print(json.dumps(table, indent=2))
        return
    print(f"| path | slice | created (s) | first step (s) |   (median of {args.runs})")
    print("|---|---|---|---|")
    for path, shape in (("tpu", "v4-16 node"), ("compute", "tpu7x-16 MIG")):
        row = table[path]
        print(f"| gcp.api: {path} | {shape} | {row['created_s']} | {row['first_step_s']} |")


if __name__ == "__main__":
    main()
