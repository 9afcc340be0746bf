"""The shared training keys on the T5X backend (tpuft/worker/t5x/keys.py): each key's binding in the run gin,
the located refusals where T5X's own setting disagrees or its network cannot, and one short T5X training with
bf16, label smoothing, gradient accumulation, a frozen encoder and embeddings, FSDP and early stopping
together, checked in what T5X built and wrote: the frozen parameters bit-identical to T5X's own
initialisation, the rest changed, the run stopped early at its checkpoint."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.worker.test_t5x_parts import QUICKSTART, run_script, stack_env
from tpuft.config import dump_recipe, load_recipe
from tpuft.core.errors import ConfigError
from tpuft.worker.t5x import keys as t5x_keys
from tpuft.worker.t5x.gin import learning_rate_bindings, run_gin

SPEC = {"name": "tpuft_keys", "task": "finetune", "vocabulary": "byt5", "extra_ids": 0}
"""The task spec run_gin needs, without seqio (what task_spec gives the quickstart)."""


def gin_lines(overrides: list[str], *, cpu: bool = True) -> dict[str, str]:
    """The run gin's bindings (name -> value text), the last one of each name winning as in gin."""
    recipe = load_recipe(QUICKSTART, overrides).value
    text = run_gin(recipe, SPEC, model_dir="/m", initial_step=0, cpu=cpu)
    bound = {}
    for line in text.split("# backend.gin_overrides")[0].splitlines():
        name, sep, value = line.partition(" = ")
        if sep and not line.startswith(("#", "include", "from", "import")):
            bound[name] = value
    return bound


def refused(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_recipe(QUICKSTART, overrides)
    assert info.value.exit_code == 2
    return [line.strip() for line in str(info.value).splitlines()[1:]]


def test_keys_left_at_their_defaults_leave_the_model_gins_choices() -> None:
    bound = gin_lines([])
    assert bound["trainer.Trainer.num_microbatches"] == "None"
    assert bound["network.T5Config.dtype"] == "'float32'"  # CPU; TPU: T5X's bfloat16
    assert gin_lines([], cpu=False)["network.T5Config.dtype"] == "'bfloat16'"
    for name in (
        "OPTIMIZER",
        "models.EncoderDecoderModel.label_smoothing",
        "adafactor.Adafactor.beta1",
        "partitioning.standard_logical_axis_rules.parameter_partitioning_dims",
        "train_script.train.actions",
    ):
        assert name not in bound


def test_each_key_becomes_its_t5x_binding() -> None:
    bound = gin_lines(
        [
            "train.precision=bf16",
            "train.label_smoothing=0.1",
            "train.grad_accum_steps=4",
            "model.freeze=[encoder, embeddings]",
            "train.sharding=fsdp",
            "train.adafactor.beta1=0.9",
            "train.adafactor.decay_rate=-0.5",
            "train.adafactor.scale_parameter=true",
            "train.early_stopping.patience=2",
        ]
    )
    assert bound["network.T5Config.dtype"] == "'bfloat16'"  # on the CPU too: the recipe asked
    assert bound["models.EncoderDecoderModel.label_smoothing"] == "0.1"
    assert bound["trainer.Trainer.num_microbatches"] == "4"
    assert bound["OPTIMIZER"] == "@optimizers.MultiOptimizer()"
    assert bound["optimizers.MultiOptimizer.traversals_and_optimizers"] == (
        "[[@t5x_keys.trainable_params(), @adafactor.Adafactor()]]"
    )
    assert bound["t5x_keys.trainable_params.frozen"] == "['embeddings', 'encoder']"
    assert bound["partitioning.standard_logical_axis_rules.parameter_partitioning_dims"] == "2"
    assert bound["adafactor.Adafactor.beta1"] == "0.9"
    assert bound["adafactor.Adafactor.decay_rate"] == "0.5"  # HF writes T5X's exponent negated
    assert bound["adafactor.Adafactor.multiply_by_parameter_scale"] == "True"
    assert (
        bound["adafactor.Adafactor.epsilon1"] == "1e-30" and bound["adafactor.Adafactor.epsilon2"] == "0.001"
    )
    assert bound["train_script.train.actions"] == "{'INFER_EVAL': [@t5x_hooks.EarlyStop()]}"
    assert bound["train_script.train.concurrent_metrics"] == "False"
    assert bound["utils.SaveCheckpointConfig.period"] == "400"  # the quickstart's checkpoint_every
    assert (
        gin_lines(["backend.num_microbatches=4", "train.grad_accum_steps=4"])[
            "trainer.Trainer.num_microbatches"
        ]
        == "4"
    )
    assert gin_lines(["backend.num_microbatches=4"])["trainer.Trainer.num_microbatches"] == "4"
    stopping = gin_lines(["train.checkpoint_every=null", "eval.every=100", "train.early_stopping.patience=2"])
    # every evaluation is a checkpoint to stop at
    assert stopping["utils.SaveCheckpointConfig.period"] == "100"


def test_the_umt5_network_gets_a_remat_policy() -> None:
    recipe = load_recipe(QUICKSTART, ["backend.family=umt5", "model.gradient_checkpointing=true"]).value
    binds = t5x_keys.key_bindings(recipe, initial_step=0, network="t5x.examples.scalable_t5.network")
    assert binds == {"network.T5Config.remat_policy": "full"}


def test_adafactors_relative_step_is_hfs_rate_as_t5x_factors() -> None:
    """transformers: min(1e-2, 1/sqrt(t)) (warm-up init: min(1e-6 t, 1/sqrt(t))), t counted from 1 at the
    first update; T5X's factors at its step s (after a checkpoint at 1000), evaluated here as T5X computes
    them."""
    for warmup_init, rate in (
        (False, lambda t: min(1e-2, 1 / math.sqrt(t))),
        (True, lambda t: min(1e-6 * t, 1 / math.sqrt(t))),
    ):
        sets = [
            "train.adafactor.relative_step=true",
            f"train.adafactor.warmup_init={str(warmup_init).lower()}",
        ]
        binds = learning_rate_bindings(load_recipe(QUICKSTART, sets).value, 1000)
        knobs = {name.rsplit(".", 1)[1]: value for name, value in binds.items()}
        for step in (1000, 1001, 5000, 10_999, 11_000, 50_000):
            t = step - knobs["step_offset"]  # T5X: max(0, step - step_offset), then its factors
            value = knobs["base_learning_rate"] / math.sqrt(max(t, knobs["warmup_steps"]))
            if "linear_warmup" in knobs["factors"]:
                value *= min(1.0, t / knobs["warmup_steps"])
            assert value == pytest.approx(rate(step - 1000 + 1), rel=1e-9), (warmup_init, step)


def test_the_model_parts_by_t5x_parameter_path() -> None:
    assert t5x_keys.part_of("/token_embedder/embedding") == "embeddings"
    assert t5x_keys.part_of("/decoder/logits_dense/kernel") == "embeddings"  # HF's lm_head goes with them
    assert t5x_keys.part_of("/encoder/layers_0/attention/query/kernel") == "encoder"
    assert t5x_keys.part_of("/encoder/relpos_bias/rel_embedding") == "encoder"
    assert t5x_keys.part_of("/decoder/layers_1/mlp/wo/kernel") == "decoder"
    assert t5x_keys.part_of("/decoder/decoder_norm/scale") == "decoder"
    assert t5x_keys.part_of("/something_else/kernel") is None


def test_t5xs_own_settings_disagreeing_with_the_shared_keys_are_located_errors() -> None:
    (problem,) = refused(["backend.num_microbatches=2", "train.grad_accum_steps=4"])
    assert problem == (
        "--set train.grad_accum_steps=4: train.grad_accum_steps: 4 disagrees with "
        "backend.num_microbatches (2): they are the same setting on T5X (its microbatches); give one"
    )
    (problem,) = refused(["train.grad_accum_steps=3"])
    assert problem.endswith(
        "train.grad_accum_steps: 3 microbatches do not split train.batch_size (32) evenly"
    )
    (problem,) = refused(["backend.dtype=float32", "train.precision=bf16"])
    assert "train.precision: bf16 disagrees with backend.dtype (float32)" in problem
    (problem,) = refused(["model.gradient_checkpointing=true"])
    assert "model.gradient_checkpointing: t5x's T5 network (family byt5) has no remat policy" in problem
    (problem,) = refused(["train.early_stopping.patience=2", "train.checkpoint_every=200", "eval.every=100"])
    assert "every evaluation must be a checkpoint step" in problem
    (problem,) = refused(["model.prompt_tuning.tokens=20"])
    assert (
        ": model.prompt_tuning: not supported by the t5x backend: T5X's prompt tuning is a separate package"
        in problem
    )


def test_an_early_stop_is_the_judges(tmp_path: Path) -> None:
    """T5X's action asks the run's judge: no stop while the eval improves, a stop after `patience` that do
    not."""
    from tpuft.worker.context import WorkerContext
    from tpuft.worker.t5x import hooks as t5x_hooks
    from tpuft.worker.t5x.train import T5xRun

    recipe = load_recipe(
        QUICKSTART, ["train.early_stopping.patience=2", "eval.every=10", "train.checkpoint_every=10"]
    ).value
    ctx = WorkerContext(
        run_id="stop-1",
        run_dir=tmp_path,
        worker_id=0,
        num_workers=1,
        coordinator="127.0.0.1:1",
        run_url=str(tmp_path),
    )
    run = T5xRun(ctx, recipe)
    run.loop.open_metrics(None)
    t5x_hooks.activate(run)
    action = t5x_hooks.EarlyStop()
    try:
        verdicts = []
        for step, exact in ((10, 0.5), (20, 0.6), (30, 0.6), (40, 0.55)):
            run.on_inference_eval(step, {"exact_match": exact}, [])
            verdicts.append(action.run(None, {}))
    finally:
        t5x_hooks.activate(None)  # type: ignore[arg-type]
        assert run.loop.metrics is not None
        run.loop.metrics.close()
    assert verdicts == [False, False, False, True]
    assert run.stopped_early is not None and "step 40" in run.stopped_early


# ----------------------------------------------------------------------------------------------------------
# one short T5X training with the keys together, checked in T5X's own objects and checkpoints

CHECK = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # the run's devices, for Orbax's restore
    import numpy as np
    import jax, jax.numpy as jnp
    import gin
    import orbax.checkpoint as ocp
    from flax import traverse_util
    from t5x import adafactor, optimizers, utils
    from tpuft.worker.t5x.compile import _configured_train_args
    from tpuft.worker.t5x.keys import part_of

    cfg = json.loads(sys.argv[1])
    args = _configured_train_args(cfg["gin"])
    model, partitioner, dataset = args["model"], args["partitioner"], args["train_dataset_cfg"]
    trainer = args["trainer_cls"]
    lengths = model.FEATURE_CONVERTER_CLS(pack=dataset.pack).get_model_feature_lengths(dataset.task_feature_lengths)
    shapes = {name: (dataset.batch_size, length) for name, length in lengths.items()}
    initializer = utils.TrainStateInitializer(
        optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables, input_shapes=shapes,
        input_types={name: np.int32 for name in lengths}, partitioner=partitioner)

    def params(checkpoint):
        restored = ocp.PyTreeCheckpointer().restore(os.path.join(checkpoint, "state"))
        return restored, traverse_util.flatten_dict(jax.tree.map(np.asarray, restored["target"]), sep="/")

    _, initial = params(cfg["initial"])  # T5X's own checkpoint of its initialisation, before the first step
    axes = traverse_util.flatten_dict(initializer.train_state_axes.params, sep="/")
    optimizer = model.optimizer_def
    sub = optimizer.sub_optimizers[0] if isinstance(optimizer, optimizers.MultiOptimizer) else optimizer
    out = {"optimizer": type(optimizer).__name__, "sub": type(sub).__name__,
           "beta1": sub.hyper_params.beta1, "label_smoothing": model._label_smoothing,
           "microbatches": gin.query_parameter("trainer.Trainer.num_microbatches"), "dtype": str(model.module.config.dtype),
           "on_data_axis": sorted(name for name, spec in axes.items() if "data" in str(spec))}
    batch = {name: jnp.ones(shape, jnp.int32) for name, shape in shapes.items()}
    jaxpr = str(jax.make_jaxpr(lambda p: model.module.apply({"params": p}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"], enable_dropout=False))(
        traverse_util.unflatten_dict(initial, sep="/")))
    out["bf16_ops"] = jaxpr.count("bf16[")
    restored, trained = params(cfg["checkpoint"])
    out["params"] = {name: {"part": part_of(name), "dtype": str(trained[name].dtype),
                            "same": bool(np.array_equal(trained[name], initial[name])),
                            "moved": float(np.abs(trained[name] - initial[name]).max())} for name in initial}
    states = traverse_util.flatten_dict(restored["state"]["param_states"], sep="/", keep_empty_nodes=True)
    out["state_parts"] = sorted({part_of(name.split("/v")[0].split("/m")[0]) or "none" for name, value in states.items()
                                 if value is not None and getattr(value, "size", 0) > 1})
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


UMT5 = [
    "backend.family=umt5",
    "backend.gin_overrides="
    + json.dumps(
        {
            "network.T5Config.vocab_size": 384,
            "network.T5Config.emb_dim": 32,
            "network.T5Config.num_heads": 2,
            "network.T5Config.head_dim": 16,
            "network.T5Config.mlp_dim": 64,
            "network.T5Config.num_encoder_layers": 2,
            "network.T5Config.num_decoder_layers": 2,
        }
    ),
]
"""A tiny umT5 (t5x's scalable T5 network, the one with a remat policy), its vocabulary ByT5's bytes."""


@pytest.mark.slow
def test_a_short_t5x_run_with_the_shared_keys(t5x_python: str, tmp_path: Path) -> None:
    recipe = load_recipe(
        QUICKSTART,
        [
            "train.steps=8",
            "train.batch_size=8",
            "train.log_every=2",
            "train.checkpoint_every=2",
            "train.warmup_steps=1",
            "eval.every=2",
            "eval.max_examples=8",
            "eval.batch_size=8",
            "data.test=null",
            "export.hf=false",
            "train.precision=bf16",
            "train.label_smoothing=0.1",
            "train.grad_accum_steps=2",
            "model.freeze=[embeddings, encoder]",
            "train.sharding=fsdp",
            "train.adafactor.beta1=0.9",
            "train.early_stopping.patience=1",
            "train.keep_checkpoints=5",
        ],
    ).value
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
    # two CPU devices: FSDP splits the parameters over both replicas
    env = stack_env(
        TPUFT_RUN_ID="t5x-keys-1",
        TPUFT_RUN_DIR=str(run_dir),
        TPUFT_WORKER_ID="0",
        TPUFT_NUM_WORKERS="1",
        TPUFT_LOCAL_DEVICES="2",
    )
    proc = subprocess.run(
        [t5x_python, "-m", "tpuft.worker"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if "eval_examples" in row]
    heartbeat = json.loads((run_dir / "heartbeat" / "worker-0.json").read_text())
    # exact match does not improve on a model this young: patience 1 stops the run at its second evaluation
    assert [row["step"] for row in evals] == [2, 4], rows
    assert (
        heartbeat["status"] == "finished"
        and heartbeat["step"] == 4
        and "early stopping" in heartbeat["stopped_early"]
    )
    # T5X's initial one, then every evaluation's; none at 6
    assert sorted(
        p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("checkpoint_")
    ) == [
        "checkpoint_0",
        "checkpoint_2",
        "checkpoint_4",
    ]
    layout = json.loads((run_dir / "t5x" / "layout.json").read_text())
    # FSDP, really
    assert layout["mesh"] == {"data": 2, "model": 1} and layout["sharded_over"] == ["data"], layout
    losses = [row["loss"] for row in rows if "loss" in row]
    assert losses and all(math.isfinite(loss) and loss > 0 for loss in losses)

    checkpoints = run_dir / "checkpoints"
    found: dict[str, Any] = run_script(
        t5x_python,
        CHECK,
        {
            "gin": str(run_dir / "t5x" / "run.gin"),
            "initial": str(checkpoints / "checkpoint_0"),
            "checkpoint": str(checkpoints / "checkpoint_4"),
        },
        tmp_path,
    )
    assert found["optimizer"] == "MultiOptimizer" and found["sub"] == "Adafactor" and found["beta1"] == 0.9
    assert found["label_smoothing"] == 0.1 and found["microbatches"] == 2
    assert found["dtype"] == "bfloat16" and found["bf16_ops"] > 10  # the network computes in bfloat16
    assert "token_embedder/embedding" in found["on_data_axis"]  # FSDP: the embed axis over the data axis
    assert any(name.startswith("encoder/layers_0/mlp") for name in found["on_data_axis"])
    params = found["params"]
    frozen = {name: p for name, p in params.items() if p["part"] in ("embeddings", "encoder")}
    trained = {name: p for name, p in params.items() if p["part"] == "decoder"}
    assert (
        "token_embedder/embedding" in frozen and "decoder/logits_dense/kernel" in frozen and len(trained) > 5
    )
    assert all(p["same"] for p in frozen.values()), {
        n: p["moved"] for n, p in frozen.items() if not p["same"]
    }
    assert all(not p["same"] and p["moved"] > 0 for p in trained.values()), trained
    assert {p["dtype"] for p in params.values()} == {"float32"}  # bf16 compute, float32 parameters
    assert found["state_parts"] == ["decoder"]  # no optimizer state for what does not train


REMAT = textwrap.dedent(
    """
    import json, os, re, sys
    from pathlib import Path
    import __main__
    import gin, jax, jax.numpy as jnp, t5x
    import t5x.train as train_script
    from t5x import gin_utils
    from tpuft.config import load_recipe
    from tpuft.worker.t5x.gin import run_gin

    __main__.train = train_script.train  # the gin binds `__main__.train`: t5x.train runs as __main__
    cfg = json.loads(sys.argv[1])

    def remat_policies(on):
        # the remat policies in the program of the loss gradient, as T5X builds the model from the run gin
        recipe = load_recipe(Path(cfg["quickstart"]), [*cfg["umt5"], f"model.gradient_checkpointing={str(on).lower()}"]).value
        gin_file = os.path.join(cfg["out"], f"umt5-{on}.gin")
        with open(gin_file, "w") as handle:
            handle.write(run_gin(recipe, cfg["spec"], model_dir="/m", initial_step=0, cpu=True))
        gin.clear_config()
        gin_utils.parse_gin_flags(gin_search_paths=[os.path.dirname(os.path.dirname(t5x.__file__))],
                                  gin_files=[gin_file], gin_bindings=[])
        model = gin.query_parameter("%MODEL").scoped_configurable_fn()
        shapes = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 4), "decoder_target_tokens": (2, 4)}
        params = jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"])
        batch = {**{k: jnp.ones(v, jnp.int32) for k, v in shapes.items()}, "decoder_loss_weights": jnp.ones((2, 4))}
        program = str(jax.make_jaxpr(jax.grad(lambda p: model.loss_fn(p, batch, None)[0]))(params))
        return sorted(set(re.findall(r"policy=(\\w+)", program)))

    print(json.dumps({"on": remat_policies(True), "off": remat_policies(False)}))
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.mark.slow
def test_gradient_checkpointing_is_umt5s_full_remat(t5x_python: str, tmp_path: Path) -> None:
    """umT5's gin already saves the matmuls without a batch dimension (its 'minimal' policy); the key makes
    the backward pass recompute everything (no policy: nothing saved), as the other backends' checkpointing
    does."""
    found = run_script(
        t5x_python,
        REMAT,
        {"quickstart": str(QUICKSTART), "umt5": UMT5, "spec": SPEC, "out": str(tmp_path)},
        tmp_path,
    )
    assert found == {"on": ["None"], "off": ["DotsSaveable"]}, found


@pytest.mark.slow
def test_the_time_limit_ends_a_t5x_run_tested_and_exported_and_a_resume_goes_on(
    t5x_python: str, tmp_path: Path
) -> None:
    """``train.time_limit`` (the sequencer's alone) on T5X, whose loop is its own: a 1 s budget ends training
    at the boundary T5X comes back to Python at (every ``log_every`` steps) once it is spent; T5X saves
    there through its own checkpoint manager, the test and the export run, the heartbeat says finished and
    why. Resumed with no limit, T5X restores that checkpoint itself and trains to the end, testing again."""
    lines = (REPO / "tpuft" / "recipes" / "data" / "numbers" / "test.jsonl").read_text().splitlines()
    (tmp_path / "test.jsonl").write_text("\n".join(lines[:8]) + "\n")
    settings = [
        "train.steps=60",  # at most 20 steps a second here, after the compile: the 1 s limit comes first
        "train.batch_size=8",
        "train.log_every=2",
        "train.checkpoint_every=60",
        "train.warmup_steps=1",
        "eval.every=null",
        "eval.max_examples=8",
        "eval.batch_size=8",
        f"data.test={tmp_path / 'test.jsonl'}",
        "export.hf=true",
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = stack_env(
        TPUFT_RUN_ID="t5x-limit-1", TPUFT_RUN_DIR=str(run_dir), TPUFT_WORKER_ID="0", TPUFT_NUM_WORKERS="1"
    )

    def attempt(limit: str, **extra: str) -> dict[str, Any]:
        recipe = load_recipe(QUICKSTART, [*settings, f"train.time_limit={limit}"]).value
        (run_dir / "recipe.yaml").write_text(dump_recipe(recipe))
        proc = subprocess.run(
            [t5x_python, "-m", "tpuft.worker"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
            env={**env, **extra},
        )
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
        return json.loads((run_dir / "heartbeat" / "worker-0.json").read_text())

    beat = attempt("1")
    step = beat["step"]
    assert (
        beat["status"] == "finished" and beat["ended"] == "time_limit" and 0 < step < 60 and step % 2 == 0
    ), beat
    steps = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("checkpoint_*"))
    assert step in steps and beat["exported_from"] == f"checkpoint_{max(steps)}", (steps, beat)
    assert (run_dir / "export" / "hf" / "config.json").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("ended")) for r in rows if "test_examples" in r] == [(step, "time_limit")]

    beat = attempt("null", TPUFT_RESUME="1")  # tpuft resume RUN --time-limit 0: no limit this attempt
    assert beat["status"] == "finished" and beat["step"] == 60 and "ended" not in beat, beat
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("ended")) for r in rows if "test_examples" in r] == [
        (step, "time_limit"),
        (60, None),
    ]
    logged = [r["step"] for r in rows if "loss" in r]
    assert [at for at in logged if at > step] == list(range(step + 2, 61, 2)) and len(set(logged)) == len(
        logged
    )
