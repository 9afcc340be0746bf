"""Bad recipes and cluster files are refused before anything runs: file:line, key path, what is allowed, exit
2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE as GOOD
from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError


def write(recipe_dir: Path, text: str) -> Path:
    path = recipe_dir / "r.yaml"
    path.write_text(text)
    return path


def test_good_recipe_loads(recipe_dir: Path) -> None:
    loaded = load_recipe(write(recipe_dir, GOOD))
    assert loaded.value.train.steps == 10
    assert loaded.value.data.train == recipe_dir / "train.jsonl"  # relative to the recipe's folder


# (replace this line of GOOD, with this text) -> (message fragment, line)
BAD_RECIPES = [
    (
        "  steps: 10",
        "  stpes: 10",
        ["train.stpes: unknown key; did you mean 'steps'?", "train.steps: required key is missing"],
        9,
    ),
    ("  steps: 10", "  steps: ten", ["train.steps: expected a whole number", "(got 'ten')"], 9),
    ("  steps: 10", "  steps: 0", ["train.steps: must be >= 1, got 0"], 9),
    (
        "  kind: torch_xla",
        "  kind: torchxla",
        [
            "backend.kind: must be one of keras, t5x, torch_xla",
            "did you mean 'torch_xla'?",
            "(got 'torchxla')",
        ],
        3,
    ),
    ("  train: train.jsonl", "  train: missing.jsonl", ["data.train: file not found:", "missing.jsonl"], 7),
    (
        "  config: {d_model: 8}",
        "  name_or_path: t5-small\n  config: {d_model: 8}",
        ["give exactly one of model.name_or_path"],
        4,
    ),
    (
        "  batch_size: 4",
        "  batch_size: 4\n  optimizer: sgd",
        ["train.optimizer: must be one of adafactor, adamw", "(got 'sgd')"],
        11,
    ),
    (
        "  batch_size: 4",
        "  batch_size: 4\n  warmup_steps: 50",
        ["train.warmup_steps: 50 warm-up steps is more than train.steps (10)"],
        11,
    ),
    ("name: t", "name: t\nname: u", ["name: duplicate key (first set on line 1)"], 2),
    ("  batch_size: 4", "  batch_size: [4", ["not valid YAML"], 11),
]


@pytest.mark.parametrize(
    ("old", "new", "fragments", "line"), BAD_RECIPES, ids=[b[1].strip() for b in BAD_RECIPES]
)
def test_bad_recipe_is_located(recipe_dir: Path, old: str, new: str, fragments: list[str], line: int) -> None:
    path = write(recipe_dir, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    text = str(info.value)
    assert f"{path}:{line}" in text
    for fragment in fragments:
        assert fragment in text


def test_all_problems_reported_at_once(recipe_dir: Path) -> None:
    path = write(
        recipe_dir,
        GOOD.replace("  steps: 10", "  steps: -1\n  seeed: 3").replace("train.jsonl", "nope.jsonl"),
    )
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert len(info.value.problems) == 3


def test_override_errors_name_the_override(recipe_dir: Path) -> None:
    path = write(recipe_dir, GOOD)
    assert load_recipe(path, ["train.steps=50"]).value.train.steps == 50
    with pytest.raises(ConfigError) as info:
        load_recipe(path, ["train.stpes=50"])
    assert "--set train.stpes=50: train.stpes: unknown key; did you mean 'steps'?" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_recipe(path, ["train.steps"])
    assert "expected KEY.PATH=VALUE" in str(info.value)


def test_cluster_errors(tmp_path: Path) -> None:
    path = tmp_path / "tpuft.yaml"
    path.write_text("name: Bad_Name\nprovider: local\naccelerator: v4-30\nlocal:\n  workerz: 2\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    text = str(info.value)
    assert f"{path}:1: name: must be 1-63 lowercase letters" in text
    assert f"{path}:3: accelerator: unknown accelerator type 'v4-30'" in text and "v4-32" in text
    assert f"{path}:5: local.workerz: unknown key; did you mean 'workers'?" in text


def test_gcp_cluster_needs_project_and_zone(tmp_path: Path) -> None:
    path = tmp_path / "tpuft.yaml"
    path.write_text("provider: gcp\ngcp:\n  spot: true\n  valid_until: soon\n")
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    text = str(info.value)
    assert f"{path}:4: gcp.valid_until: expected a duration like 6h" in text
    path.write_text("provider: gcp\ngcp:\n  spot: true\n")
    with pytest.raises(ConfigError, match=r"tpuft.yaml:2: gcp: provider gcp needs gcp.project and gcp.zone"):
        load_cluster(path)
    path.write_text(
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  spot: true\n  preemptible: "
        "true\n"
    )
    with pytest.raises(
        ConfigError, match=r"tpuft.yaml:2: gcp: gcp.spot and gcp.preemptible exclude each other"
    ):
        load_cluster(path)
    path.write_text("provider: gcp\nbucket: my-bucket\ngcp: {project: my-project, zone: us-central2-b}\n")
    with pytest.raises(
        ConfigError, match=r"tpuft.yaml:2: bucket: provider gcp keeps runs in a bucket: expected gs://NAME"
    ):
        load_cluster(path)


def test_cli_exit_code_2_without_traceback(recipe_dir: Path, cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    path = write(recipe_dir, GOOD.replace("  steps: 10", "  stepz: 10"))
    result = cli("recipes", "validate", str(path), "--config", str(cluster_file))
    assert result.code == 2
    assert "Traceback" not in result.err
    assert f"{path}:9: train.stepz: unknown key; did you mean 'steps'?" in result.err


def test_batch_size_must_split_over_workers(recipe_dir: Path, cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = tmp_path / "three.yaml"
    cluster.write_text("provider: local\nlocal:\n  workers: 3\n  devices_per_worker: 1\n")
    path = write(recipe_dir, GOOD)
    result = cli("recipes", "validate", str(path), "--config", str(cluster))
    assert result.code == 2
    assert f"{path}:10: train.batch_size: 4 does not split evenly over 3 workers" in result.err


def test_missing_cluster_file(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("status", "--config", str(tmp_path / "nope.yaml"))
    assert result.code == 2
    assert "nope.yaml: cluster file not found" in result.err


def test_embedded_default_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_cluster()
    assert loaded.value.provider == "local" and loaded.value.num_workers == 2


def test_worker_env_names_secrets_from_the_controllers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HF_TOKEN: ${HF_TOKEN}``: the file names the token, the controller's environment holds it; unset is
    located."""
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        'name: c\nworker_env:\n  HF_TOKEN: ${TPUFT_T_TOKEN}\n  PRICE: "$$5 and $${NOT_A_TOKEN}"\n'
        '  WANDB_API_KEY: "k-${TPUFT_T_UNSET}"\n'
    )
    monkeypatch.setenv("TPUFT_T_TOKEN", "hf_abc")
    monkeypatch.delenv("TPUFT_T_UNSET", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_cluster(path)
    text = str(caught.value)
    assert (
        "tpuft.yaml:5" in text
        and "worker_env.WANDB_API_KEY" in text
        and "${TPUFT_T_UNSET} is not set" in text
    )
    assert "PRICE" not in text  # $$ is a literal $, so ${NOT_A_TOKEN} after it is text, not a token
    monkeypatch.setenv("TPUFT_T_UNSET", "wb")
    env = load_cluster(path).value.worker_env
    assert env == {"HF_TOKEN": "hf_abc", "PRICE": "$5 and ${NOT_A_TOKEN}", "WANDB_API_KEY": "k-wb"}
