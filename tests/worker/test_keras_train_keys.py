"""The shared training keys on the Keras backend, the way the PyTorch/XLA feature tests test them, in one
process of the Keras venv on a tiny random T5 (and one of the torch venv for Adafactor's reference):

* ``train.precision: bf16``: the mixed_bfloat16 policy: the blocks and the output layer compute in bfloat16,
  the weights stay float32, and gradient accumulation under it still gives the big batch's step (within
  bfloat16's precision);
* ``train.label_smoothing``: the train step's loss is the smoothed cross-entropy computed by hand in NumPy;
* ``train.adafactor``: the Keras Adafactor (``tpuft/worker/keras/adafactor.py``) takes the steps transformers'
  torch Adafactor takes on the same weights and gradients, knob by knob;
* ``model.freeze``: a frozen part is bit-identical after training while the rest changed;
* ``model.gradient_checkpointing``: the blocks really recompute (twice the block calls), with the same loss
  and gradients as without, dropout included (its masks are replayed), and it trains under a 2-replica
  strategy.

Plus the recipe's side: the capabilities and the located refusals of what the Keras engine cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.worker.test_keras_parts import run_in_venv

ADAFACTOR_CASES = [
    {},
    {"beta1": 0.9},
    {"scale_parameter": True, "weight_decay": 0.1},
    {"relative_step": True, "warmup_init": True, "scale_parameter": True},
    {"clip_threshold": 0.01, "decay_rate": -0.5, "eps": [1e-20, 1e-2]},
]
"""Knobs of ``train.adafactor`` (and the weight decay), each run 3 steps on a 3x4 matrix and a 4-vector."""

ADAFACTOR_DATA = {
    "weights": [
        [[0.3, -0.2, 0.5, 0.1], [0.0, 0.4, -0.6, 0.2], [0.25, -0.05, 0.15, -0.35]],
        [0.1, -0.2, 0.3, 0.05],
    ],
    "grads": [
        [[[0.2, -0.1, 0.05, 0.3], [-0.4, 0.02, 0.1, 0.0], [0.07, 0.5, -0.2, 0.1]], [0.3, -0.1, 0.0, 0.2]],
        [[[-0.1, 0.3, 0.2, -0.05], [0.1, 0.1, -0.3, 0.4], [0.2, -0.2, 0.0, 0.06]], [-0.2, 0.4, 0.1, 0.0]],
        [[[0.05, 0.05, -0.1, 0.2], [0.3, -0.2, 0.1, 0.1], [-0.1, 0.0, 0.4, -0.3]], [0.1, 0.1, -0.3, 0.2]],
    ],
}


def _knobs(case: dict[str, Any]) -> dict[str, Any]:
    defaults = {
        "eps": [1e-30, 1e-3],
        "clip_threshold": 1.0,
        "decay_rate": -0.8,
        "beta1": None,
        "scale_parameter": False,
        "relative_step": False,
        "warmup_init": False,
        "weight_decay": 0.0,
    }
    return {**defaults, **case}


@pytest.mark.slow
def test_keras_adafactor_takes_transformers_steps(keras_python: str, torch_python: str) -> None:
    cases = [_knobs(case) for case in ADAFACTOR_CASES]
    keras = run_in_venv(
        keras_python,
        f"""
        import json, types, numpy as np, tensorflow as tf
        from tpuft.worker.keras.adafactor import make_optimizer
        data, out = {ADAFACTOR_DATA!r}, []
        for knobs in {cases!r}:
            w = [tf.Variable(np.array(v, np.float32), name=n) for v, n in zip(data["weights"], ("kernel", "layer_norm"))]
            train = types.SimpleNamespace(optimizer="adafactor", weight_decay=knobs.pop("weight_decay"),
                                          adafactor=types.SimpleNamespace(**knobs))
            opt = make_optimizer(tf, train, 0.05)
            for grads in data["grads"]:
                opt.apply_gradients(zip([tf.constant(g, tf.float32) for g in grads], w))
            out.append([v.numpy().tolist() for v in w])
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    torch_out = _run(
        torch_python,
        f"""
        import json, torch
        from transformers.optimization import Adafactor
        data, out = {ADAFACTOR_DATA!r}, []
        for knobs in {cases!r}:
            w = [torch.nn.Parameter(torch.tensor(v)) for v in data["weights"]]
            opt = Adafactor([{{"params": w[:1], "weight_decay": knobs.pop("weight_decay")}},
                             {{"params": w[1:], "weight_decay": 0.0}}],  # the vector is a norm scale: no decay
                            lr=None if knobs["relative_step"] else 0.05, **{{**knobs, "eps": tuple(knobs["eps"])}})
            for grads in data["grads"]:
                for p, g in zip(w, grads):
                    p.grad = torch.tensor(g)
                opt.step()
            out.append([p.detach().tolist() for p in w])
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    import numpy as np

    for case, got, want in zip(ADAFACTOR_CASES, keras, torch_out):
        start = [np.array(v) for v in ADAFACTOR_DATA["weights"]]
        for g, t, s in zip(got, want, start):
            assert not np.allclose(t, s), case  # the steps moved the weights
            np.testing.assert_allclose(g, t, rtol=2e-5, atol=1e-7, err_msg=str(case))


def _run(python: str, code: str) -> Any:
    proc = subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# an lm_head of its own, as T5 v1.1 has
TINY_T5 = (
    "vocab_size=48, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=2, decoder_start_token_id=0, "
    "tie_word_embeddings=False"
)


@pytest.mark.slow
def test_precision_smoothing_freeze_and_checkpointing_on_a_tiny_t5(keras_python: str) -> None:
    got = run_in_venv(
        keras_python,
        f"""
        import json, types, numpy as np, tensorflow as tf, transformers
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
        from tpuft.backends.keras_schema import KerasBackend
        from tpuft.worker.keras import layers as keras_layers, model as keras_model
        from tpuft.worker.keras.parts import build_trainable, make_schedule
        rng = np.random.default_rng(0)
        n = 8
        labels = rng.integers(3, 40, size=(n, 5)).astype(np.int32)
        for row, length in enumerate(rng.integers(2, 6, size=n)):
            labels[row, length:] = -100
        data = {{"input_ids": rng.integers(3, 40, size=(n, 7)).astype(np.int32), "attention_mask": np.ones((n, 7), np.int32),
                 "labels": labels, "weight": np.ones(n, np.float32)}}
        shapes = types.SimpleNamespace(max_source_length=7, max_target_length=5)
        out = {{}}

        def t5(dropout=0.0):
            tf.keras.utils.set_random_seed(1)
            return transformers.TFT5ForConditionalGeneration(transformers.T5Config({TINY_T5}, dropout_rate=dropout))

        strategies = {{}}  # one per device set: two MirroredStrategies over the same devices mix up their collectives

        def trained(make, optimizer, steps, devices=("/cpu:0",), **options):
            strategy = strategies.setdefault(devices, tf.distribute.MirroredStrategy(list(devices)))
            with strategy.scope():
                model = build_trainable(tf, make(), classify=False, start_token=0,
                                        clip_norm=None, **options)
                model.distribute_reduction_method = "first"
                model.build_all(shapes)
                before = {{w.name: w.numpy() for w in model.hf.weights}}
                model.compile(optimizer=optimizer())
            dist = strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices(data).repeat().batch(n, drop_remainder=True))
            history = model.fit(dist, steps_per_epoch=1, epochs=steps, verbose=0)
            after = {{w.name: w.numpy() for w in model.hf.weights}}
            return model, before, after, history.history["loss"]

        # label smoothing: the train step's loss (before its update) against NumPy's smoothed cross-entropy
        model, _, _, loss = trained(t5, lambda: tf.keras.optimizers.SGD(0.0), 1, label_smoothing=0.1)
        dec = np.concatenate([np.zeros((n, 1), np.int32), np.where(labels == -100, 0, labels)[:, :-1]], axis=1)
        logits = model.hf(input_ids=data["input_ids"], decoder_input_ids=dec).logits.numpy().astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        mask = labels != -100
        nll = -np.take_along_axis(logp, np.where(mask, labels, 0)[..., None], -1)[..., 0]
        smoothed = 0.9 * nll + 0.1 * -logp.mean(-1)
        out["smoothing"] = [loss[0], float((smoothed * mask).sum() / mask.sum()), float((nll * mask).sum() / mask.sum())]

        # model.freeze: frozen parts bit-identical after 3 AdamW steps, the rest changed
        for parts in (["encoder"], ["embeddings", "decoder"]):
            frozen = []
            def frozen_t5():  # in the strategy's scope, as the trainer builds it
                hf = t5()
                hf(input_ids=data["input_ids"][:1], decoder_input_ids=dec[:1])
                frozen.extend(keras_layers.freeze(hf, parts, classify=False))
                return hf
            _, before, after, _ = trained(frozen_t5, lambda: tf.keras.optimizers.AdamW(1e-2), 3)
            same = sorted(name for name in before if np.array_equal(before[name], after[name]))
            out["-".join(parts)] = [sorted(frozen), same, len(before)]

        # bf16: bfloat16 compute, float32 weights; accumulation under it gives the big batch's SGD step as closely
        # as bfloat16 itself gives float32's
        def sgd_change(accum):
            _, before, after, loss = trained(t5, lambda: tf.keras.optimizers.SGD(0.5), 1, accum_steps=accum)
            return np.concatenate([(after[k] - before[k]).ravel() for k in before])  # in the model's order
        exact = sgd_change(1)
        policy = keras_model.set_precision(tf, KerasBackend(), 0, "bf16")
        hf = t5()
        result = hf(input_ids=data["input_ids"], decoder_input_ids=dec)
        out["bf16"] = [policy, result.encoder_last_hidden_state.dtype.name, hf.lm_head.compute_dtype,
                       result.logits.dtype.name, sorted({{w.dtype.name for w in hf.weights}})]
        big, accumulated = sgd_change(1), sgd_change(4)
        distance = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
        out["bf16_accum"] = [distance(accumulated, big), distance(big, exact)]
        tf.keras.mixed_precision.set_global_policy("float32")

        # gradient checkpointing: recomputed blocks (counted), the same loss and gradients; dropout replayed
        def grads(dropout, wrap, recompute=True):
            hf = t5(dropout)
            hf(input_ids=data["input_ids"][:1], decoder_input_ids=dec[:1])
            calls = [0]
            for block in [*hf.encoder.block, *hf.decoder.block]:
                def counted(*args, original=block.call, **kwargs):
                    calls[0] += 1
                    return original(*args, **kwargs)
                block.call = counted
            if wrap:
                keras_layers.checkpoint_blocks(tf, hf, recompute=recompute)
            tf.random.set_seed(7)
            with tf.GradientTape() as tape:
                logits = hf(input_ids=data["input_ids"], decoder_input_ids=dec, training=True).logits
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(dec, logits, from_logits=True))
            grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, hf.trainable_variables)]
            return float(loss), grads, calls[0]
        def compare(a, b):
            return [a[0], b[0], a[2], b[2], max(float(np.abs(x - y).max()) for x, y in zip(a[1], b[1]))]
        out["ckpt"] = compare(grads(0.0, False), grads(0.0, True))
        out["ckpt_dropout"] = compare(grads(0.3, True, recompute=False), grads(0.3, True))
        def checkpointed():
            hf = t5()
            keras_layers.checkpoint_blocks(tf, hf)
            return hf
        two = ("/cpu:0", "/cpu:1")
        _, _, plain, _ = trained(t5, lambda: tf.keras.optimizers.AdamW(1e-2), 2, devices=two)
        _, _, ckpt, _ = trained(checkpointed, lambda: tf.keras.optimizers.AdamW(1e-2), 2, devices=two)
        out["ckpt_fit"] = max(float(np.abs(a - b).max()) for a, b in zip(plain.values(), ckpt.values()))
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    fit_loss, smoothed, plain = got["smoothing"]
    assert fit_loss == pytest.approx(smoothed, rel=1e-5) and abs(smoothed - plain) > 1e-3, got["smoothing"]

    def short(
        names: list[str],
    ) -> list[str]:  # without the model's instance name (tft5_for_conditional_generation_3/)
        return [name.split("/", 1)[1] if name.startswith("tft5") else name for name in names]

    frozen, same, total = got["encoder"]
    print(f"\nkeras freeze encoder: {len(frozen)} of {total} variables frozen and bit-identical")
    assert frozen and same == frozen, got["encoder"]
    assert all(name.startswith(("encoder/block", "encoder/final")) for name in short(frozen)), frozen
    frozen, same, total = got["embeddings-decoder"]
    assert same == frozen and {"shared/shared/embeddings:0", "lm_head/kernel:0"} <= set(short(frozen)), frozen
    assert not any(name.startswith("encoder") for name in short(frozen)) and total - len(frozen) > 5

    # the blocks and the output layer compute in bfloat16; transformers casts the logits to float32 (for the
    # loss)
    assert got["bf16"] == ["mixed_bfloat16", "bfloat16", "bfloat16", "float32", ["float32"]], got["bf16"]
    accumulated, rounding = got["bf16_accum"]
    print(
        f"\nkeras bf16: accum4 vs big batch step {accumulated:.2e} (relative), bf16 vs float32 step "
        f"{rounding:.2e}"
    )
    assert 0 < rounding < 0.15 and accumulated <= 2 * rounding, got["bf16_accum"]  # as close as bf16 gets

    for name in ("ckpt", "ckpt_dropout"):
        loss_ref, loss_ckpt, calls_ref, calls_ckpt = got[name][:4]
        assert loss_ref == loss_ckpt and got[name][4] <= 1e-6, (name, got[name])
        # 4 blocks, each run again in the backward pass
        assert (calls_ref, calls_ckpt) == (4, 8), (
            name,
            got[name],
        )
    assert got["ckpt_fit"] <= 1e-5, got["ckpt_fit"]


def test_the_recipe_side_of_the_keras_training_keys(recipe_dir: Path) -> None:
    from tpuft.backends.keras_schema import CAPABILITIES, KerasBackend
    from tpuft.config import load_recipe
    from tpuft.core.errors import ConfigError

    for key in (
        ("train", "precision"),
        ("train", "label_smoothing"),
        ("train", "adafactor"),
        ("model", "freeze"),
        ("model", "gradient_checkpointing"),
    ):
        assert key in CAPABILITIES.keys
    assert "fsdp" in (CAPABILITIES.reason(("train", "sharding")) or "")
    backend = KerasBackend()
    assert (
        backend.policy("bf16", tpu=False) == "mixed_bfloat16"
        and backend.policy("float32", tpu=False) == "float32"
    )
    assert backend.policy("float32", tpu=True) == "mixed_bfloat16"
    assert KerasBackend(precision="float32").policy("float32", tpu=True) == "float32"

    recipe = recipe_dir / "keras.yaml"
    recipe.write_text(
        textwrap.dedent("""
        name: k
        backend: {kind: keras, precision: float32}
        model: {config: {d_model: 16, num_layers: 1, num_heads: 2, d_kv: 8, d_ff: 32}}
        data: {train: train.jsonl}
        train: {steps: 2, precision: bf16, sharding: fsdp}
    """)
    )
    (recipe_dir / "train.jsonl").write_text('{"source": "a", "target": "b"}\n')
    with pytest.raises(ConfigError) as raised:
        load_recipe(recipe)
    text = str(raised.value)
    assert "keras.yaml:3: backend.precision: float32 contradicts train.precision: bf16" in text, text
    assert (
        "keras.yaml:6: train.sharding: not supported by the keras backend: fsdp shards parameters" in text
    ), text
