"""Bad values, class by class: each is refused when the file is loaded, at file:line and key, with exit code
2.

A table per class (input -> message fragment); the generated mutations in test_mutations.py cover the same
classes at volume.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuft.config import load_cluster, load_recipe
from tpuft.core.errors import ConfigError

RECIPE = """\
name: t
backend:
  kind: torch_xla
model:
  config:
    d_model: 16
    num_heads: 2
data:
  train: train.jsonl
train:
  steps: 10
  batch_size: 4
"""


def refused(path: Path, loader=load_recipe, overrides: list[str] | None = None) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as info:
        loader(path, overrides or [])
    return str(info.value)


# (old line, new text) in RECIPE -> (line, key, fragment)
RECIPE_CASES = [
    # model.config is a schema, not a dict: typos, types, bounds, activations
    ("    d_model: 16", "    d_modle: 16", 6, "model.config.d_modle", "unknown key; did you mean 'd_model'?"),
    ("    d_model: 16", "    d_model: abc", 6, "model.config.d_model", "expected a whole number (got 'abc')"),
    ("    d_model: 16", "    d_model: 16.5", 6, "model.config.d_model", "expected a whole number (got 16.5)"),
    ("    d_model: 16", "    d_model: true", 6, "model.config.d_model", "expected a whole number (got true)"),
    ("    num_heads: 2", "    num_heads: -1", 7, "model.config.num_heads", "must be >= 1, got -1"),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    dropout_rate: 1e300",
        8,
        "model.config.dropout_rate",
        "must be < 1, got 1e+300",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    dropout_rate: .nan",
        8,
        "model.config.dropout_rate",
        "finite number",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    feed_forward_proj: gated-gleu",
        8,
        "model.config.feed_forward_proj",
        "did you mean 'gated-gelu'?",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    feed_forward_proj: relu-gelu",
        8,
        "model.config.feed_forward_proj",
        "expected ACT or gated-ACT",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    vocab_size: 100",
        8,
        "model.config.vocab_size",
        "smaller than the byt5 tokenizer's 384 ids",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    vocab_size: 500\n    eos_token_id: 700",
        5,
        "model.config",
        "eos_token_id 700 is outside the vocabulary",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    is_decoder: true",
        8,
        "model.config.is_decoder",
        "must be false (got true)",
    ),
    (
        "    num_heads: 2",
        "    num_heads: 2\n    d_ff: 100000000",
        8,
        "model.config.d_ff",
        "must be <= 262144, got 100000000",
    ),
    (
        "  config:\n    d_model: 16\n    num_heads: 2",
        "  config: {}\n  tokenizer: ''",
        6,
        "model.tokenizer",
        "is neither a Hugging Face model id (org/name) nor a path",
    ),
    # numbers and booleans: strict types, sane bounds
    ("  steps: 10", "  steps: 1e30", 11, "train.steps", "expected a whole number (got 1e+30)"),
    ("  steps: 10", "  steps: 1000000000000000000000000000000", 11, "train.steps", "must be <= 1000000000"),
    ("  steps: 10", "  steps: '10'", 11, "train.steps", "expected a whole number (got '10')"),
    ("  batch_size: 4", "  batch_size: 1.0e+30", 12, "train.batch_size", "expected a whole number"),
    ("  batch_size: 4", "  batch_size: 4\n  seed: 1e30", 13, "train.seed", "expected a whole number"),
    ("  batch_size: 4", "  batch_size: 4\n  seed: -1", 13, "train.seed", "must be >= 0, got -1"),
    (
        "  batch_size: 4",
        "  batch_size: 4\n  learning_rate: true",
        13,
        "train.learning_rate",
        "expected a number (got true)",
    ),
    ("  batch_size: 4", "  batch_size: 4\n  learning_rate: .inf", 13, "train.learning_rate", "finite number"),
    (
        "  batch_size: 4",
        "  batch_size: 4\n  max_grad_norm: yes",
        13,
        "train.max_grad_norm",
        "expected a number (got 'yes')",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  max_source_length: true",
        10,
        "data.max_source_length",
        "expected a whole number (got true)",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  shuffle: 'no'",
        10,
        "data.shuffle",
        "expected true or false (got 'no')",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  shuffle: no",
        10,
        "data.shuffle",
        "expected true or false, got the text 'no'",
    ),
    # strings: templates, field names, versions, requirements
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  source_template: 'q: {words'",
        10,
        "data.source_template",
        "not a valid template",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  source_template: 'q: {}'",
        10,
        "data.source_template",
        "positional fields",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  source_template: 'q: {a[0]}'",
        10,
        "data.source_template",
        "use field names joined by dots",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  target_template: 'constant'",
        10,
        "data.target_template",
        "names no field",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  source_field: ''",
        10,
        "data.source_field",
        "expected a JSON field name",
    ),
    (
        "  train: train.jsonl",
        "  train: train.jsonl\n  target_field: a..b",
        10,
        "data.target_field",
        "expected a JSON field name",
    ),
    ("  train: train.jsonl", "  train: /dev/null", 9, "data.train", "is not a regular file"),
    ("  train: train.jsonl", "  train: .", 9, "data.train", "is not a regular file"),
    (
        "  kind: torch_xla",
        "  kind: torch_xla\n  torch_version: '2.9.0; rm -rf /'",
        4,
        "backend.torch_version",
        "is not a version number",
    ),
    (
        "  kind: torch_xla",
        "  kind: torch_xla\n  torch_version: 2.9",
        4,
        "backend.torch_version",
        "expected text",
    ),
    (
        "  kind: torch_xla",
        "  kind: torch_xla\n  extra_requirements: ['--index-url=http://evil']",
        4,
        "backend.extra_requirements[0]",
        "is a pip option",
    ),
    (
        "  kind: torch_xla",
        "  kind: torch_xla\n  extra_requirements: ['datasets>=3', 'a b c']",
        4,
        "backend.extra_requirements[1]",
        "is not a pip requirement",
    ),
    ("name: t", "name: 't; rm -rf ~'", 1, "name", "must be letters, digits"),
]


@pytest.mark.parametrize(
    ("old", "new", "line", "key", "fragment"), RECIPE_CASES, ids=[c[1].strip()[:40] for c in RECIPE_CASES]
)
def test_bad_recipe_values(recipe_dir: Path, old: str, new: str, line: int, key: str, fragment: str) -> None:
    assert old in RECIPE
    path = recipe_dir / "r.yaml"
    path.write_text(RECIPE.replace(old, new, 1))
    text = refused(path)
    assert f"{path}:{line}: {key}: " in text and fragment in text, text


def test_the_typo_is_not_silently_a_bigger_model(recipe_dir: Path) -> None:
    """`d_modle: 128` used to train the default 512-wide model (3.35 M parameters instead of 0.84 M)."""
    path = recipe_dir / "r.yaml"
    path.write_text(RECIPE.replace("    d_model: 16", "    d_modle: 128"))
    assert "did you mean 'd_model'?" in refused(path)
    path.write_text(RECIPE)
    config = load_recipe(path).value.model.config
    assert config is not None and config.kwargs() == {"d_model": 16, "num_heads": 2}  # only what the user set


# cluster files: (text) -> (line, key, fragment)
CLUSTER_CASES = [
    (
        "worker_env:\n  'X=1 touch /tmp/owned; Y': v\n",
        2,
        "worker_env.X=1 touch /tmp/owned; Y",
        "is not an environment variable name",
    ),
    ("worker_env:\n  'A B': v\n", 2, "worker_env.A B", "is not an environment variable name"),
    ("worker_env:\n  '': v\n", 2, "worker_env.", "is not an environment variable name"),
    ("worker_env:\n  1X: v\n", 2, "worker_env.1X", "not starting with a digit"),
    ('worker_env:\n  X: "a\\0b"\n', 2, "worker_env.X", "contains a NUL character"),
    ("worker_env:\n  TPUFT_RUN_ID: x\n", 2, "worker_env.TPUFT_RUN_ID", "is set by tpuft"),
    ("worker_env:\n  PYTHONPATH: /x\n", 2, "worker_env.PYTHONPATH", "is set by tpuft"),
    ("worker_env:\n  X: 1\n", 2, "worker_env.X", "expected text"),
    (
        "provider: gcp\ngcp: {project: my-project, zone: us-central2-z}\n",
        2,
        "gcp.zone",
        "zones end in a letter from a to f",
    ),
    ("provider: gcp\ngcp: {project: my-project, zone: moon base 1}\n", 2, "gcp.zone", "is not a zone"),
    (
        "provider: gcp\ngcp: {project: my-project, zone: us-centrl1-a}\n",
        2,
        "gcp.zone",
        "did you mean us-central1-a?",
    ),
    (
        "provider: gcp\ngcp: {project: 'My Project!', zone: us-central2-b}\n",
        2,
        "gcp.project",
        "is not a project id",
    ),
    (
        "provider: gcp\nbucket: gs://My_Runs!!\ngcp: {project: my-project, zone: us-central2-b}\n",
        2,
        "bucket",
        "bucket name 'My_Runs!!' is not valid",
    ),
    (
        "provider: gcp\nbucket: gs://google-runs\ngcp: {project: my-project, zone: us-central2-b}\n",
        2,
        "bucket",
        "not allowed by Cloud Storage",
    ),
    (
        "provider: gcp\nbucket: gs://runs/a//b\ngcp: {project: my-project, zone: us-central2-b}\n",
        2,
        "bucket",
        "empty, '.' or '..' part",
    ),
    (
        "provider: gcp\naccelerator: v4-16\ngcp:\n  project: my-project\n  zone: us-central2-b\n  topology: "
        "2x2x\n",
        6,
        "gcp.topology",
        "is not a topology",
    ),
    (
        "provider: gcp\naccelerator: v4-16\ngcp:\n  project: my-project\n  zone: us-central2-b\n  topology: "
        "2x2x4\n",
        6,
        "gcp.topology",
        "is 16 chips, but accelerator v4-16 has 8",
    ),
    (
        "provider: gcp\naccelerator: v6e-16\ngcp:\n  project: my-project\n  zone: us-east5-b\n  topology: "
        "2x2x4\n",
        6,
        "gcp.topology",
        "v6e topologies have 2 dimensions",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  labels: {Team: ml}\n",
        5,
        "gcp.labels.Team",
        "starting with a lowercase letter",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  labels: {team: ML}\n",
        5,
        "gcp.labels.team",
        "value 'ML'",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  metadata: {'a b': x}\n",
        5,
        "gcp.metadata.a b",
        "metadata key",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  tpu_api_endpoint: "
        "'http://tpu.example.com'\n",
        5,
        "gcp.tpu_api_endpoint",
        "in the clear",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  tpu_api_endpoint: "
        "'https://x/y?z'\n",
        5,
        "gcp.tpu_api_endpoint",
        "a host and port only",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  tpu_api_endpoint: "
        "'https://h:99999'\n",
        5,
        "gcp.tpu_api_endpoint",
        "out of range",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  runtime_version: 'x; reboot'\n",
        5,
        "gcp.runtime_version",
        "is not a TPU software version",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  service_account: me\n",
        5,
        "gcp.service_account",
        "is not a service account",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  network: 'My Net'\n",
        5,
        "gcp.network",
        "is not a network name",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  python: 'python3 -c evil'\n",
        5,
        "gcp.python",
        "is not a command name",
    ),
    (
        'provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  venv_cache: "a\\nb"\n',
        5,
        "gcp.venv_cache",
        "control character",
    ),
    (
        "provider: gcp\ngcp:\n  project: my-project\n  zone: us-central2-b\n  valid_until: "
        "2026-13-45T00:00:00Z\n",
        5,
        "gcp.valid_until",
        "expected a duration",
    ),
    (
        "provider: gcp\ngcp: {project: my-project, zone: us-central2-b}\nssh:\n  user: 'root; reboot'\n",
        4,
        "ssh.user",
        "is not a login name",
    ),
    (
        "provider: gcp\ngcp: {project: my-project, zone: us-central2-b}\nssh:\n  user: -oProxyCommand=x\n",
        4,
        "ssh.user",
        "is not a login name",
    ),
    (
        "provider: gcp\naccelerator: v4-32\nlocal:\n  workers: 2\ngcp: {project: my-project, zone: "
        "us-central2-b}\n",
        4,
        "local.workers",
        "v4-32 (4)",
    ),
    (
        "provider: gcp\naccelerator: v4-16\nlocal:\n  devices_per_worker: 2\ngcp: {project: my-project, "
        "zone: us-central2-b}\n",
        4,
        "local.devices_per_worker",
        "its host's chips (4)",
    ),
    ("local:\n  devices_per_worker: 0\n", 2, "local.devices_per_worker", "must be >= 1, got 0"),
    ("local:\n  devices_per_worker: 65\n", 2, "local.devices_per_worker", "must be <= 64, got 65"),
    ("provider: local\nbucket: gs://runs\n", 2, "bucket", "the local provider keeps runs in a local folder"),
    ("local:\n  python: '-c'\n", 2, "local.python", "is not a command name"),
]


@pytest.mark.parametrize(
    ("text", "line", "key", "fragment"), CLUSTER_CASES, ids=[c[2] for c in CLUSTER_CASES]
)
def test_bad_cluster_values(tmp_path: Path, text: str, line: int, key: str, fragment: str) -> None:
    path = tmp_path / "tpuft.yaml"
    path.write_text(text)
    message = refused(path, load_cluster)
    assert f"{path}:{line}: {key}: " in message and fragment in message, message


def test_state_dir_and_bucket_that_are_files(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    path = tmp_path / "tpuft.yaml"
    path.write_text(f"local:\n  state_dir: {tmp_path / 'a-file'}\n")
    assert f"{path}:2: local.state_dir: {tmp_path / 'a-file'} exists and is not a folder" in refused(
        path, load_cluster
    )
    path.write_text("bucket: a-file\n")  # relative paths are from the cluster file's folder
    assert f"{path}:1: bucket: {tmp_path / 'a-file'} exists and is not a folder" in refused(
        path, load_cluster
    )
    path.write_text("bucket: runs\nlocal:\n  state_dir: pods\n")
    loaded = load_cluster(path).value
    assert (loaded.bucket, loaded.local.state_dir) == (str(tmp_path / "runs"), tmp_path / "pods")


def test_good_gcp_values_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "tpuft.yaml"
    path.write_text(
        "name: t5-v4\nprovider: gcp\naccelerator: v4-32\nbucket: gs://my-runs/team-a\n"
        "worker_env: {XLA_FLAGS: '--xla_dump_to=/tmp/x y', _X1: ''}\n"
        "gcp:\n  project: example.com:my-project\n  zone: us-central2-b\n  topology: 2x2x4\n"
        "  labels: {team: ml, cost-centre: ''}\n  metadata: {startup-script: 'echo hi; date'}\n"
        "  network: projects/my-project/global/networks/default\n  service_account: "
        "t@my-project.iam.gserviceaccount.com\n"
        "  tpu_api_endpoint: http://127.0.0.1:8080\n  valid_until: 2026-12-01T00:00:00Z\n"
        "ssh: {user: ml_user, key_file: ~/.ssh/id_ed25519}\n"
    )
    loaded = load_cluster(path).value
    assert loaded.num_workers == 4 and loaded.worker_env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x y"


def test_cli_exit_2_without_traceback_for_an_injection(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tpuft.yaml"
    path.write_text("worker_env:\n  'X=1 touch /tmp/owned; Y': v\n")
    result = cli("status", "--config", str(path))
    assert result.code == 2 and "Traceback" not in result.err
    assert "is not an environment variable name" in result.err
