"""--dry-run of create, setup, train and up (issue 25, item 3): the plan, with no API call and no connection.

The GCP cluster files point the TPU API at the fake server (tests/rigs/fake_tpu.py), which records every
request: a dry run leaves its log empty. Storage is not reached either: STORAGE_EMULATOR_HOST points at a
closed port.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuft.providers.gcp.tuning as tuning
from tests.rigs.fake_tpu import FakeTpuServer
from tpuft.config import load_cluster
from tpuft.core.accelerators import lookup
from tpuft.ops.plan import TRAINER_ENV
from tpuft.providers.gcp import GcpProvider

SECRET = "hf_secret-token-value-0123456789"


@pytest.fixture
def fake_tpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTpuServer]:
    monkeypatch.setattr(tuning, "POLL_SECONDS", 0.0)
    # a closed port: any bucket call would fail
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with FakeTpuServer(operation_polls=1, queued_gets_per_state=0) as server:
        yield server


def gcp_cluster(tmp_path: Path, server: FakeTpuServer, extra: str = "") -> Path:
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        "name: tp\nprovider: gcp\naccelerator: v4-16\n"
        f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  tpu_api_endpoint: {server.endpoint}\n{extra}"
        "worker_env:\n  HF_TOKEN: ${HF_TOKEN}\n  WANDB_MODE: offline\n"
    )
    return path


@pytest.mark.parametrize("verb", ["create", "setup", "train", "up"])
def test_a_dry_run_calls_nothing_and_prints_no_secret(
    cli, tmp_path: Path, fake_tpu: FakeTpuServer, verb: str
) -> None:  # type: ignore[no-untyped-def]
    cluster = gcp_cluster(tmp_path, fake_tpu, "  queued: true\n  spot: true\n")
    recipe = [] if verb == "create" else ["quickstart"]
    text = cli(verb, *recipe, "-c", str(cluster), "--dry-run")
    as_json = cli(verb, *recipe, "-c", str(cluster), "--dry-run", "--json")
    assert text.code == 0 and as_json.code == 0, text.err + as_json.err
    assert fake_tpu.requests == []
    assert SECRET not in text.out + text.err + as_json.out + as_json.err
    plan = json.loads(as_json.out)
    assert plan["dry_run"] is True and plan["verb"] == verb
    assert plan["create"]["request"]["rpc"] == "CreateQueuedResource" and "CreateQueuedResource" in text.out
    assert plan["create"]["bucket"] == "gs://tpuft-test-tpuft" and "gs://tpuft-test-tpuft" in text.out
    assert plan["price"]["per_hour"] == pytest.approx(lookup("v4-16").price_per_hour)
    assert "per hour" in text.out
    if verb == "create":
        assert plan["roles"] == [] and plan["env"] == {}
        return
    assert [role["worker"] for role in plan["roles"]] == [0, 1]  # v4-16: 2 hosts, both run the trainer
    assert "HF_TOKEN" in plan["env"]["setup"] and "HF_TOKEN" in text.out
    if verb != "setup":
        assert {"HF_TOKEN", "WANDB_MODE", "TPUFT_WORKER_ID", "PJRT_DEVICE"} <= set(plan["env"]["trainer"])
        assert "rank 1 of 2" in plan["roles"][1]["runs"]
        assert plan["price"]["steps"] == 1500 and "per hour only" in plan["price"]["run_note"]


def test_the_planned_request_is_the_one_create_sends(tmp_path: Path, fake_tpu: FakeTpuServer) -> None:
    """One code path: what --dry-run shows is byte for byte the body ``create`` then sends (multislice
    here)."""
    cluster = gcp_cluster(tmp_path, fake_tpu, "  queued: true\n  slices: 2\n  valid_until: 6h\n")
    provider = GcpProvider(load_cluster(cluster).value)
    planned = provider.plan()
    assert fake_tpu.requests == []
    provider.nodes.create_queued(None)
    [sent] = fake_tpu.calls("CreateQueuedResource")
    assert (
        planned["request"]["body"] == sent.body
        and planned["request"]["queuedResourceId"] == sent.query["queuedResourceId"]
    )
    assert planned["nodes"] == ["tp-0", "tp-1"]


def test_multislice_price_counts_every_slice(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    cluster = gcp_cluster(tmp_path, fake_tpu, "  queued: true\n  slices: 2\n")
    plan = json.loads(cli("create", "-c", str(cluster), "--dry-run", "--json").out)
    assert plan["chips"] == 16 and plan["workers"] == 4
    assert plan["price"]["per_hour"] == pytest.approx(2 * lookup("v4-16").price_per_hour)


def test_a_local_plan_is_worker_folders_without_a_price(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text("name: lp\nprovider: local\naccelerator: v4-8\nlocal:\n  workers: 2\n")
    result = cli("up", "quickstart", "-c", str(cluster), "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    folders = plan["create"]["worker_folders"]
    assert len(folders) == 2 and plan["price"]["per_hour"] is None and plan["chips"] == 0
    assert not any(Path(folder).exists() for folder in folders)  # planned, not made
    text = cli("up", "quickstart", "-c", str(cluster), "--dry-run").out
    assert "2 worker folder(s)" in text and "no price" in text


def test_dry_run_refuses_resume(cli, tmp_path: Path, fake_tpu: FakeTpuServer) -> None:  # type: ignore[no-untyped-def]
    result = cli("train", "--resume", "abc", "-c", str(gcp_cluster(tmp_path, fake_tpu)), "--dry-run")
    assert result.code == 2 and "--dry-run plans a new run" in result.err


def test_trainer_env_names_are_the_ones_train_sets() -> None:
    """TRAINER_ENV lists tpuft's own variables; hold it to the literals the two functions that set them
    use."""
    root = Path(__file__).resolve().parents[2] / "tpuft" / "ops"
    found: set[str] = set()
    for module, function in (("lifecycle.py", "supervisor_env"), ("trainer_env.py", "trainer_env")):
        tree = ast.parse((root / module).read_text(encoding="utf-8"))
        [body] = [
            node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == function
        ]
        found |= {
            node.value
            for node in ast.walk(body)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isupper()
            and node.value.replace("_", "").isalnum()
        }
    found.discard("TPUFT_RESUME")  # only a resumed attempt's trainers get it; a dry run plans a new run
    assert found == set(TRAINER_ENV)


def test_a_recipe_that_does_not_fit_is_refused_as_the_verb_would(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "tpuft.yaml"
    cluster.write_text("name: lp\nprovider: local\naccelerator: v4-8\nlocal:\n  workers: 3\n")
    result = cli("train", "quickstart", "-c", str(cluster), "--dry-run")
    assert result.code == 2 and "quickstart.yaml:" in result.err and "train.batch_size" in result.err
