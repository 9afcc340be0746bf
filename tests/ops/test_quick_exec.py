"""A cold ``tpuft exec`` from what the last one remembered (tpuft/ops/quick_exec.py,
providers/gcp/exec_plan.py): against the fake TPU API and real sshd servers. What is checked: the plan skips
the API and the cluster file's validation (no pydantic, Fabric, invoke or Google import) but not the pinned
host keys; a plan gone stale (the node recreated with new keys) costs one API re-check and then works; a host
whose key is not the one the API publishes is still refused, after that one re-check; a file with worker_env,
or a file that changed, gets no plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.providers.test_gcp_host_keys import cluster_file, needs_sshd, tpu  # noqa: F401 - tpu is a fixture
from tests.rigs.fake_tpu import FakeTpuServer
from tests.rigs.sshd_pod import SshdPod
from tpuft.providers.gcp import exec_plan

REPO = Path(__file__).resolve().parents[2]


def remembered(cli, tmp_path: Path, tpu: FakeTpuServer, pod: SshdPod) -> Path:  # noqa: F811
    """A node whose workers are ``pod``, created, and one exec the whole way (which remembers the plan)."""
    tpu.worker_addresses = pod.addresses
    tpu.host_keys.update(pod.host_keys)
    path = cluster_file(tmp_path, tpu, pod)
    assert cli("create", "-c", str(path), "--yes").code == 0
    assert cli("exec", "-c", str(path), "--", "true").code == 0
    return path


def seen_an_hour_ago(path: Path) -> None:
    """The API described the node an hour ago: the whole path would ask it again (its memory lasts 10
    minutes)."""
    from tests.providers.test_gcp_host_keys import provider_for

    cache = provider_for(path).cache
    record = cache.read()
    assert record is not None
    cache.write({**record, "time": record["time"] - 3600})


def fast_exec(
    path: Path, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """The launcher's exec path in-process (what `tpuft exec -c PATH -- COMMAND` runs), agent off."""
    from tpuft.launcher import _fast_exec

    monkeypatch.setenv("TPUFT_NO_AGENT", "1")
    code = _fast_exec({"config": str(path)}, [command])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@needs_sshd
def test_a_remembered_exec_asks_nothing_and_imports_nothing_heavy(
    cli,
    tmp_path: Path,
    tpu: FakeTpuServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with SshdPod(tmp_path / "pod", workers=2, first_address=110) as pod:
        path = remembered(cli, tmp_path, tpu, pod)
        assert exec_plan.load(str(path)) is not None
        seen_an_hour_ago(path)
        tpu.requests.clear()
        code = (
            "import json, sys\nfrom tpuft.launcher import _fast_exec\n"
            f"code = _fast_exec({{'config': {str(path)!r}}}, ['echo hi-$TPUFT_WORKER_ID'])\n"
            "heavy = [m for m in ('pydantic', 'fabric', 'invoke', 'google', 'tpuft.config') if m in "
            "sys.modules]\n"
            "print('RESULT=' + json.dumps([code, heavy]))"
        )
        import os

        env = {**os.environ, "TPUFT_NO_AGENT": "1"}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert "[w0] hi-0" in out.stdout and "[w1] hi-1" in out.stdout, out.stderr
        result = next(line for line in out.stdout.splitlines() if line.startswith("RESULT="))
        assert json.loads(result.removeprefix("RESULT=")) == [0, []]
        assert tpu.requests == []  # no API call at all


@needs_sshd
def test_a_stale_plan_costs_one_api_check_then_works(
    cli,
    tmp_path: Path,
    tpu: FakeTpuServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SshdPod(tmp_path / "pod", workers=2, first_address=120) as pod:
        path = remembered(cli, tmp_path, tpu, pod)
        # The node is recreated behind tpuft's back: worker 1 has a new host key, which the API publishes.
        from tests.providers.test_gcp_host_keys import provider_for, recreate_out_of_band

        recreate_out_of_band(provider_for(path))
        tpu.host_keys[pod.addresses[1]] = pod.swap_host_key(1)
        seen_an_hour_ago(path)
        tpu.requests.clear()

        code, out, err = fast_exec(path, "touch ran-$TPUFT_WORKER_ID", monkeypatch, capsys)
        assert code == 0, err
        assert (pod.home(0) / "ran-0").exists() and (pod.home(1) / "ran-1").exists()
        # one re-check (and the key put back in the new node's metadata)
        assert len(tpu.calls("GetGuestAttributes")) == 1
        seen_an_hour_ago(path)
        tpu.requests.clear()
        assert fast_exec(path, "true", monkeypatch, capsys)[0] == 0
        assert tpu.requests == []  # and the new plan is remembered


@needs_sshd
def test_a_changed_host_key_is_still_refused(
    cli,
    tmp_path: Path,
    tpu: FakeTpuServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with SshdPod(tmp_path / "pod", workers=2, first_address=130) as pod:
        path = remembered(cli, tmp_path, tpu, pod)
        # the API still publishes the old key: someone else answers on worker 1's address
        pod.swap_host_key(1)
        tpu.requests.clear()

        code, out, err = fast_exec(path, "touch ran-$TPUFT_WORKER_ID", monkeypatch, capsys)
        assert code == 1 and "worker 1" in err and "not the one pinned from the TPU API" in err, err
        # nothing ran anywhere
        assert not (pod.home(0) / "ran-0").exists() and not (pod.home(1) / "ran-1").exists()
        # the pins were checked with the API once, then refused
        assert len(tpu.calls("GetGuestAttributes")) == 1


def test_no_plan_with_worker_env_or_after_the_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuft.config import load_cluster
    from tpuft.providers.gcp import GcpProvider

    monkeypatch.setenv("TPUFT_HOME", str(tmp_path / "home"))
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: p\nprovider: gcp\naccelerator: v4-8\ngcp: {project: tpuft-test, zone: us-central2-b}\n"
        f"ssh: {{user: u, key_file: {tmp_path / 'k'}}}\n"
    )
    provider = GcpProvider(load_cluster(path).value)
    provider._login = "u:ssh-ed25519 AAAA"
    provider.remember_exec_plan(str(path))
    assert exec_plan.plan_path(str(path)).exists()
    assert exec_plan.identity(str(path)) == json.loads(exec_plan.plan_path(str(path)).read_text())["identity"]
    path.write_text(path.read_text() + "# an edit\n")
    assert exec_plan.load(str(path)) is None  # another file: the whole path validates it

    path.write_text(path.read_text() + "worker_env: {HF_TOKEN: secret-value}\n")
    provider = GcpProvider(load_cluster(path).value)
    provider._login = "u:ssh-ed25519 AAAA"
    provider.remember_exec_plan(str(path))
    assert not exec_plan.plan_path(str(path)).exists()  # values are never written to tpuft's state


def test_paramiko_without_invoke_still_runs_match_exec() -> None:
    """paramiko imported the quick way (tpuft/fleet/ssh_direct.py) knows its version for the SSH banner,
    leaves the real importlib.metadata to whoever imports it next, and runs a ``Match exec`` once it is asked
    to."""
    code = (
        "import sys\nfrom tpuft.fleet.ssh_direct import import_paramiko, lookup\n"
        "paramiko = import_paramiko()\nassert 'invoke' not in sys.modules and 'importlib.metadata' not in "
        "sys.modules\n"
        "from importlib import metadata\nassert paramiko.__version__ == metadata.version('paramiko'), "
        "paramiko.__version__\n"
        "parsed = paramiko.SSHConfig.from_text('Match exec \"true\"\\n  User bob\\n')\n"
        "print(lookup(parsed, 'h')['user'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "bob", out.stderr
