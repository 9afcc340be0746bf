"""What the Keras backend tells shared code: its recipe section and located refusals, its venv for CPU and
TPU, where its TF program runs (every worker of the CPU pod; worker 0 alone on a TPU slice), and its share of
the shared keys that only some backends implement."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE
from tpuft.backends import kinds
from tpuft.backends.base import ClusterShape, get_backend
from tpuft.backends.keras import LAYOUT, TF_VERSION, TPU_RUNTIME, KerasBackend
from tpuft.config import load_recipe
from tpuft.core.errors import ConfigError

BACKEND = get_backend("keras")
RECIPES = Path(__file__).resolve().parents[2] / "tpuft" / "recipes"

TEXT2TEXT = MINIMAL_RECIPE.replace("kind: torch_xla", "kind: keras").replace(
    "batch_size: 4", "batch_size: 16"
)
CLASSIFY = """\
name: c
backend:
  kind: keras
  task: classification
  encoder: {model_type: bert, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 1, intermediate_size: 8}
data:
  train: train.jsonl
  label_field: target
  labels: [no, yes]
train:
  steps: 10
  batch_size: 16
"""  # noqa: E501 (a script run in another interpreter)


def write(folder: Path, text: str) -> Path:
    path = folder / "r.yaml"
    path.write_text(text)
    return path


def refused(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides)
    assert info.value.exit_code == 2
    return str(info.value)


def test_registered_with_its_own_section(recipe_dir: Path) -> None:
    assert kinds() == ["keras", "t5x", "torch_xla"] and BACKEND.config_model is KerasBackend
    recipe = load_recipe(write(recipe_dir, TEXT2TEXT)).value
    assert recipe.backend.task == "text2text" and recipe.backend.precision == "auto"
    assert (LAYOUT.manifest, LAYOUT.checkpoint_format, LAYOUT.exports_hf) == (
        "manifest.json",
        "step_{step:08d}",
        True,
    )


def test_venv_pins_tensorflow_per_target_and_keeps_tf_keras_from_pulling_full_tensorflow() -> None:
    cpu = BACKEND.env_spec(KerasBackend(), "cpu", "python3")
    tpu = BACKEND.env_spec(KerasBackend(), "tpu", "python3")
    assert f"tensorflow-cpu=={TF_VERSION}" in cpu.requirements and not any(
        r.startswith("tensorflow-tpu") for r in cpu.requirements
    )
    assert f"tensorflow-tpu=={TF_VERSION}" in tpu.requirements and "-f" in tpu.pip_args
    for spec in (cpu, tpu):
        # same minor as TF, installed without its `tensorflow` requirement
        assert spec.no_deps == ("tf-keras==2.20.1",)
        assert "transformers==4.57.6" in spec.requirements  # transformers 5 has no TensorFlow models
        assert not any(r.startswith(("tensorflow==", "tf-keras")) for r in spec.requirements)
    assert cpu.key != tpu.key
    assert TPU_RUNTIME == {False: "tpu-vm-tf-2.20.0-pjrt", True: "tpu-vm-tf-2.20.0-pod-pjrt"}


def test_every_cpu_worker_trains_but_one_program_drives_a_tpu_slice(recipe_dir: Path) -> None:
    recipe = load_recipe(write(recipe_dir, TEXT2TEXT)).value
    cpu = BACKEND.plan(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu"))
    assert (
        cpu.workers == (0, 1) and cpu.env["TF_USE_LEGACY_KERAS"] == "1" and "TPUFT_TPU_HOSTS" not in cpu.env
    )
    pod = BACKEND.plan(recipe, ClusterShape(hosts=4, chips_per_host=4, target="tpu"))
    # setup, launch and monitor: worker 0 only
    assert pod.workers == (0,) and pod.env["TPUFT_TPU_HOSTS"] == "4"
    single = BACKEND.plan(recipe, ClusterShape(hosts=1, chips_per_host=4, target="tpu"))
    assert single.workers == (0,) and single.env["TPUFT_TPU_HOSTS"] == "1"


def test_batches_split_over_replicas_cores_on_tpu_workers_on_cpu(recipe_dir: Path, tmp_path: Path) -> None:
    recipe = load_recipe(write(recipe_dir, TEXT2TEXT), ["eval.batch_size=30"]).value
    # 16 and 30 over 2
    assert BACKEND.check(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu")) == []
    assert BACKEND.check(recipe, ClusterShape(hosts=4, chips_per_host=4, target="cpu")) == [
        (("eval", "batch_size"), "30 does not split evenly over 4 workers (use a multiple of 4, e.g. 28)")
    ]
    found = dict(BACKEND.check(recipe, ClusterShape(hosts=4, chips_per_host=4, target="tpu")))
    assert found[("eval", "batch_size")].startswith("30 does not split evenly over 16 TPU cores")
    assert ("train", "batch_size") not in found  # 16 over 16 cores


def test_a_local_worker_with_several_devices_is_that_many_replicas(recipe_dir: Path) -> None:
    """``local.devices_per_worker``: every logical CPU device of every worker is a replica (a v4-16 rehearsed
    as 2 workers x 4 devices has the slice's 8), the plan tells each worker its count, and both batches split
    over all."""
    recipe = load_recipe(write(recipe_dir, TEXT2TEXT), ["eval.batch_size=12"]).value
    rehearsal = ClusterShape(hosts=2, chips_per_host=4, target="cpu", local_devices=4)
    assert (
        BACKEND.replicas(rehearsal)
        == 8
        == BACKEND.replicas(ClusterShape(hosts=2, chips_per_host=4, target="tpu"))
    )
    assert BACKEND.check(recipe, rehearsal) == [
        (
            ("eval", "batch_size"),
            "12 does not split evenly over 8 replicas (2 workers x 4 devices) (use a multiple of 8, e.g. 8)",
        )
    ]
    assert BACKEND.check(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu", local_devices=2)) == []
    assert BACKEND.plan(recipe, rehearsal).env["TPUFT_LOCAL_DEVICES"] == "4"
    assert (
        BACKEND.plan(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu")).env["TPUFT_LOCAL_DEVICES"]
        == "1"
    )
    assert (
        "TPUFT_LOCAL_DEVICES"
        not in BACKEND.plan(recipe, ClusterShape(hosts=2, chips_per_host=4, target="tpu")).env
    )


def test_gradient_accumulation_splits_each_replicas_batch(recipe_dir: Path) -> None:
    """``train.grad_accum_steps`` is the Keras backend's (its capabilities): the global batch must split into
    replicas x micro-batches; the eval batch is not accumulated."""
    recipe = load_recipe(
        write(recipe_dir, TEXT2TEXT), ["train.grad_accum_steps=4", "eval.batch_size=6"]
    ).value
    assert recipe.train.grad_accum_steps == 4
    # 16 = 2 x 4 x 2
    assert BACKEND.check(recipe, ClusterShape(hosts=2, chips_per_host=4, target="cpu")) == []
    assert BACKEND.check(recipe, ClusterShape(hosts=3, chips_per_host=4, target="cpu")) == [
        (
            ("train", "batch_size"),
            "16 does not split evenly over 3 workers x 4 accumulation steps (use a multiple of 12, e.g. 12)",
        )
    ]
    found = dict(
        BACKEND.check(recipe, ClusterShape(hosts=1, chips_per_host=4, target="tpu", devices_per_chip=2))
    )
    assert found == {
        ("train", "batch_size"): "16 does not split evenly over 8 TPU cores x 4 accumulation steps (use "
        "a multiple of 32, e.g. 32)",
        ("eval", "batch_size"): "6 does not split evenly over 8 TPU cores (use a multiple of 8, e.g. 8)",
    }


def test_steps_per_execution_auto_and_checked(recipe_dir: Path) -> None:
    path = write(recipe_dir, TEXT2TEXT)
    recipe = load_recipe(path, ["train.log_every=25", "eval.every=500", "train.checkpoint_every=200"]).value
    assert recipe.backend.steps_per_call(recipe) == 25
    recipe = load_recipe(path, ["train.log_every=1000", "eval.every=null"]).value
    assert recipe.backend.steps_per_call(recipe) == 100  # at most 100 steps between visits to Python
    message = refused(path, ["backend.steps_per_execution=40", "train.log_every=100"])
    assert "train.log_every" in message and "not a multiple of backend.steps_per_execution (40)" in message
    assert "backend.steps_per_execution" in refused(path, ["backend.steps_per_execution=0"])


def test_classification_needs_labels_and_an_encoder(recipe_dir: Path) -> None:
    path = write(recipe_dir, CLASSIFY)
    recipe = load_recipe(path).value
    assert recipe.data.labels == ["no", "yes"] and recipe.backend.encoder["model_type"] == "bert"
    assert "data.label_field" in refused(write(recipe_dir, CLASSIFY.replace("  label_field: target\n", "")))
    assert "data.labels" in refused(write(recipe_dir, CLASSIFY.replace("  labels: [no, yes]\n", "")))
    assert "listed twice" in refused(write(recipe_dir, CLASSIFY.replace("[no, yes]", "[no, no]")))
    assert "at least two" in refused(write(recipe_dir, CLASSIFY.replace("[no, yes]", "[no]")))
    assert "has no TF sequence classifier" in refused(
        write(recipe_dir, CLASSIFY.replace("model_type: bert", "model_type: t5"))
    )
    both = CLASSIFY.replace("data:", "model: {name_or_path: bert-base-uncased}\ndata:")
    assert "exactly one of model.name_or_path" in refused(write(recipe_dir, both))
    t5_config = CLASSIFY.replace(
        "  encoder: {model_type: bert, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 1, "
        "intermediate_size: 8}\n",
        "",
    ).replace("data:", "model: {config: {d_model: 8}}\ndata:")
    assert "model.config describes a T5" in refused(write(recipe_dir, t5_config))


def test_text2text_refuses_classification_keys(recipe_dir: Path) -> None:
    path = write(recipe_dir, TEXT2TEXT)
    assert "for backend.task: classification" in refused(path, ["data.label_field=label"])
    assert "backend.encoder" in refused(path, ["backend.encoder={model_type: bert}"])


def test_other_backends_refuse_what_only_keras_does(recipe_dir: Path) -> None:
    torch_recipe = write(recipe_dir, MINIMAL_RECIPE)
    message = refused(torch_recipe, ["data.labels=[a, b]"])
    assert "not supported by the torch_xla backend" in message, message
    for setting in (
        "train.early_stopping={patience: 2}",
        "train.keep_best=true",
    ):  # PyTorch/XLA has them too ...
        # ... given held-out data
        assert "needs evaluations: give data.eval" in refused(torch_recipe, [setting])
    assert load_recipe(torch_recipe, ["data.truncation=head+tail"]).value.data.truncation == "head+tail"


def test_keras_refuses_what_only_pytorch_xla_does(recipe_dir: Path) -> None:
    """FSDP is the one shared training key the Keras engine cannot do (its strategies replicate); the others
    are its own (tests/worker/test_keras_train_keys.py)."""
    path = write(recipe_dir, TEXT2TEXT)
    assert "not supported by the keras backend: fsdp shards parameters" in refused(
        path, ["train.sharding=fsdp"]
    )
    keys = [
        "train.precision=bf16",
        "model.freeze=[encoder]",
        "train.label_smoothing=0.1",
        "model.gradient_checkpointing=true",
        "train.adafactor.beta1=0.9",
    ]
    assert load_recipe(path, keys).value.train.label_smoothing == 0.1
    assert "a text2text run has" in refused(path, ["eval.metric=accuracy"])
    assert (
        load_recipe(path, ["train.schedule=cosine", "eval.metric=token_accuracy"]).value.eval.metric
        == "token_accuracy"
    )


def test_keras_decodes_and_prompt_tunes_text2text_only(recipe_dir: Path) -> None:
    """data.hf, eval.generate_examples, eval.metric bleu / rouge_l and model.prompt_tuning are the keras
    backend's too (tests/worker/test_keras_eval_keys.py trains with them); a classifier refuses the decoding
    ones at their key."""
    path = write(recipe_dir, TEXT2TEXT)
    recipe = load_recipe(path, ["eval.metric=bleu", "model.prompt_tuning.tokens=4"]).value
    assert recipe.eval.generate_examples == 256 and recipe.model.prompt_tuning.tokens == 4
    assert (
        load_recipe(path, ["eval.metric=rouge_l", "eval.generate_examples=8"]).value.eval.generate_examples
        == 8
    )
    classifier = write(recipe_dir, CLASSIFY)
    assert "bleu is a text2text metric" in refused(classifier, ["eval.metric=bleu"])
    assert "eval.generate_examples: greedy decodes are text2text's" in refused(
        classifier, ["eval.generate_examples=4"]
    )
    assert "model.prompt_tuning: a soft prompt goes before a T5 encoder's input" in refused(
        classifier, ["model.prompt_tuning.tokens=4"]
    )


def test_shared_keys_validate(recipe_dir: Path) -> None:
    path = write(recipe_dir, TEXT2TEXT)
    recipe = load_recipe(
        path, ["train.early_stopping={patience: 3, min_delta: 0.01}", "train.keep_best=true"]
    ).value
    assert recipe.train.early_stopping.patience == 3 and recipe.train.keep_best
    assert "train.early_stopping.patience" in refused(path, ["train.early_stopping={patience: 0}"])
    assert "data.truncation" in refused(path, ["data.truncation=middle"])


@pytest.mark.parametrize(
    "name",
    [
        "keras_quickstart",
        "keras_classification_quickstart",
        "sst2_bert_base_keras",
        "sst2_bert_large_keras",
        "sst2_t5_small_keras",
        "sst2_t5_base_keras",
        "question_quality_t5_base_keras",
    ],
)
def test_shipped_keras_recipes_load_with_the_seeds_settings(name: str) -> None:
    recipe = load_recipe(RECIPES / f"{name}.yaml", check_files=False).value
    assert recipe.backend.kind == "keras"
    if name.startswith("sst2_"):
        assert recipe.data.max_source_length == 128 and recipe.eval.every == 400
        assert recipe.train.early_stopping is not None and recipe.train.keep_best
        v3_8 = ClusterShape(hosts=1, chips_per_host=4, target="tpu", devices_per_chip=2)  # TF sees 8 cores
        assert BACKEND.replicas(v3_8) == 8 and recipe.train.batch_size == 64  # 8 per core, as in the seed
        assert BACKEND.check(recipe, v3_8) == []
    if name.startswith("sst2_bert"):
        assert recipe.backend.task == "classification" and recipe.train.learning_rate == 5e-5
    if name == "question_quality_t5_base_keras":
        assert recipe.data.truncation == "head+tail" and recipe.data.max_source_length == 512
        assert recipe.model.name_or_path == "t5-base"


def test_the_catalogue_tells_tensorflow_devices_per_chip(tmp_path: Path) -> None:
    from tpuft.config import load_cluster

    path = tmp_path / "c.yaml"
    for accelerator, devices in (("v3-8", 8), ("v2-32", 32), ("v4-16", 8), ("v5litepod-8", 8)):
        path.write_text(
            f"provider: gcp\naccelerator: {accelerator}\n"
            "gcp: {project: my-project, zone: us-central2-b, skip_zone_check: true}\n"
        )
        assert BACKEND.replicas(load_cluster(path).value.shape()) == devices, accelerator


def test_several_slices_are_refused_at_the_backend_and_the_clusters_slices_key(recipe_dir: Path) -> None:
    """TensorFlow has no Multislice runtime: a cluster of 2 slices is refused before launch, located at the
    recipe's backend.kind and at the cluster file's line that makes the slices."""
    from tpuft.config.loader import load_cluster
    from tpuft.ops.preflight import cluster_problems

    path = write(recipe_dir, TEXT2TEXT)
    recipe = load_recipe(path)
    ((key, message),) = BACKEND.check(
        recipe.value, ClusterShape(hosts=4, chips_per_host=4, target="tpu", slices=2)
    )
    assert (
        key == ("backend", "kind")
        and message.startswith("keras cannot train on 2 slices: TensorFlow has no Multislice runtime")
        and "t5x or torch_xla" in message
    )
    cluster = recipe_dir / "tpuft.yaml"
    cluster.write_text("name: two\nprovider: local\naccelerator: v4-8\nlocal:\n  workers: 1\n  slices: 2\n")
    loaded = load_cluster(cluster).value
    (problem,) = cluster_problems(recipe, loaded.shape(), loaded)
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("kind:")
    )
    assert problem.startswith(f"{path}:{line}: backend.kind: keras cannot train on 2 slices") and (
        f"{cluster}:6: local.slices: 2" in problem
    ), problem
    # one slice
    assert BACKEND.check(recipe.value, ClusterShape(hosts=4, chips_per_host=4, target="tpu")) == []
