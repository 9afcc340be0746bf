"""The Keras trainer's parts against the real stack (the Keras venv: tensorflow-cpu, tf-keras, transformers
4):

* the learning-rate schedules in TF against ``tpuft.worker.schedule.lr_factor``, step by step;
* truncation (head, tail, head+tail) with a real tokenizer, special tokens kept;
* the optimizer state saved and restored by position (AdamW and Adafactor), the weight digest;
* the train step under ``model.fit``: with steps_per_execution it gives the same weights as one step per call,
  and the summed-gradient loss scaling gives the gradient of the global mean over replicas (2 CPU replicas of
  a MirroredStrategy against one replica with the whole batch);
* gradient accumulation (``train.grad_accum_steps``): one optimizer step over 4 micro-batches, or over 2
  replicas x 2 micro-batches, gives the update of one step over the whole batch, and the optimizer counts
  optimizer steps;
* eval sums: exact match with teacher forcing and token accuracy, weight-0 padding rows ignored;
* the prediction engine (test evaluation and ``tpuft predict``): greedy and beam decodes and the classifier's
  argmax on the device, over two replicas, as transformers computes them; the test's weight swap.

Each check runs in a subprocess of the Keras venv and prints JSON; the assertions are made here."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from typing import Any

import pytest

from tests.conftest import REPO
from tpuft.data import keep_tokens
from tpuft.worker.keras.parts import epoch_length, eval_row
from tpuft.worker.schedule import lr_factor

pytestmark = pytest.mark.slow


def run_in_venv(python: str, code: str, timeout: float = 600) -> Any:
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_USE_LEGACY_KERAS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }
    proc = subprocess.run(
        [python, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_keep_tokens_and_epoch_length() -> None:
    ids = list(range(10))
    assert keep_tokens(ids, 4, "head") == [0, 1, 2, 3]
    assert keep_tokens(ids, 4, "tail") == [6, 7, 8, 9]
    assert keep_tokens(ids, 5, "head+tail") == [0, 1, 2, 8, 9]
    assert keep_tokens(ids, 20, "head+tail") == ids and keep_tokens(ids, 1, "head+tail") == [0]
    assert (
        epoch_length(1500, 500, None) == 500
        and epoch_length(1000, 400, 300) == 100
        and epoch_length(90, None, None) == 90
        and epoch_length(200, 200, 50, start=75) == 25  # resumed from a checkpoint between two epochs' ends
        and epoch_length(200, 200, 50, start=100) == 50
    )
    row = eval_row(
        {"loss_sum": 6.0, "tokens": 3.0, "correct": 2.0, "exact": 1.0, "examples": 2.0}, classify=False
    )
    assert row == {
        "eval_loss": 2.0,
        "eval_token_accuracy": 0.666667,
        "eval_exact_match": 0.5,
        "eval_examples": 2,
    }
    assert (
        eval_row(
            {"loss_sum": 1.0, "tokens": 4.0, "correct": 3.0, "exact": 3.0, "examples": 4.0}, classify=True
        )["eval_accuracy"]
        == 0.75
    )


def test_schedules_match_the_shared_definition(keras_python: str) -> None:
    cases = [
        (100, 10, "linear"),
        (100, 0, "linear"),
        (100, 10, "constant"),
        (100, 10, "inverse_sqrt"),
        (100, 10, "cosine"),
    ]
    got = run_in_venv(
        keras_python,
        f"""
        import json, tensorflow as tf
        from tpuft.worker.keras.parts import make_schedule
        out = []
        for steps, warmup, kind in {cases!r}:
            schedule = make_schedule(tf, 2.0, steps, warmup, kind)
            out.append([float(schedule(tf.constant(k))) for k in range(steps + 5)])
        print(json.dumps(out))
    """,
    )
    for (steps, warmup, kind), values in zip(cases, got):
        factor = lr_factor(steps, warmup, kind)
        assert values == pytest.approx([2.0 * factor(k) for k in range(steps + 5)], rel=1e-6, abs=1e-7), kind


def test_head_tail_truncation_keeps_special_tokens(keras_python: str) -> None:
    got = run_in_venv(
        keras_python,
        """
        import json
        from tpuft.data import encode_texts, load_tokenizer
        tok = load_tokenizer("byt5")
        out = {mode: encode_texts(tok, ["abcdefghij", "ab"], 6, mode) for mode in ("head", "tail", "head+tail")}
        print(json.dumps({"out": out, "eos": tok.eos_token_id, "a": tok("a", add_special_tokens=False)["input_ids"][0]}))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    a, eos = got["a"], got["eos"]
    letters = lambda text: [a + "abcdefghij".index(c) for c in text]  # noqa: E731
    ids, masks = got["out"]["head"]
    assert (
        ids[0] == letters("abcde") + [eos]
        and ids[1] == letters("ab") + [eos, 0, 0, 0]
        and masks[1] == [1, 1, 1, 0, 0, 0]
    )
    assert got["out"]["tail"][0][0] == letters("fghij") + [eos]
    assert got["out"]["head+tail"][0][0] == letters("abcij") + [eos]
    assert got["out"]["head+tail"][0][1] == got["out"]["head"][0][1]  # a short text is not touched


def test_optimizer_state_round_trips_and_digest(keras_python: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = run_in_venv(
        keras_python,
        f"""
        import json, numpy as np, tensorflow as tf
        from pathlib import Path
        from tpuft.worker.keras.parts import save_optimizer, restore_optimizer, weights_digest
        out = {{}}
        for name in ("adamw", "adafactor"):
            tf.keras.backend.clear_session()
            tf.keras.utils.set_random_seed(0)
            def build():
                model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(3,)), tf.keras.layers.Dense(2)])
                opt = tf.keras.optimizers.AdamW(1e-2) if name == "adamw" else tf.keras.optimizers.Adafactor(1e-2)
                opt.build(model.trainable_variables)
                return model, opt
            model, opt = build()
            for _ in range(3):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(model(tf.ones([2, 3])) ** 2)
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            path = Path({str(tmp_path)!r}) / f"{{name}}.npz"
            save_optimizer(opt, path)
            tf.keras.backend.clear_session()  # the same layer names, as in another worker's process
            other, opt2 = build()
            other.set_weights(model.get_weights())
            restore_optimizer(opt2, path)
            same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(opt.variables, opt2.variables))
            out[name] = {{"same": same, "iterations": int(opt2.iterations), "count": len(opt.variables),
                          "digest_equal": weights_digest(model) == weights_digest(other)}}
            other.layers[0].kernel.assign_add(tf.ones_like(other.layers[0].kernel) * 1e-3)
            out[name]["digest_changes"] = weights_digest(model) != weights_digest(other)
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    for name, state in got.items():
        assert state == {
            "same": True,
            "iterations": 3,
            "count": state["count"],
            "digest_equal": True,
            "digest_changes": True,
        }, name
        assert state["count"] > 3


def test_train_step_scaling_and_steps_per_execution(keras_python: str) -> None:
    """Two CPU replicas each with half the batch take the same step as one replica with all of it (the loss of
    a replica is its share of the global mean); running 4 steps per execution changes nothing."""
    got = run_in_venv(
        keras_python,
        """
        import json, numpy as np, tensorflow as tf, transformers
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
        from tpuft.worker.keras.parts import build_trainable, make_schedule
        rng = np.random.default_rng(0)
        n = 16
        labels = rng.integers(3, 40, size=(n, 5)).astype(np.int32)
        labels[:5, 3:] = -100  # padded target positions: the two replicas' halves have different token counts
        data = {"input_ids": rng.integers(3, 40, size=(n, 7)).astype(np.int32), "attention_mask": np.ones((n, 7), np.int32),
                "labels": labels, "weight": np.ones(n, np.float32)}
        def train(devices, per_execution, steps=4):
            strategy = tf.distribute.MirroredStrategy(devices)
            tf.keras.utils.set_random_seed(1)
            with strategy.scope():
                config = transformers.T5Config(vocab_size=48, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1,
                                               dropout_rate=0.0, decoder_start_token_id=0)
                model = build_trainable(tf, transformers.TFT5ForConditionalGeneration(config), classify=False,
                                        start_token=0, clip_norm=1.0)
                model.distribute_reduction_method = "first"
                model.compile(optimizer=tf.keras.optimizers.AdamW(make_schedule(tf, 1e-2, 10, 0, "constant")),
                              steps_per_execution=per_execution)
            dist = strategy.experimental_distribute_dataset(  # each replica gets half of the global batch
                tf.data.Dataset.from_tensor_slices(data).repeat().batch(n, drop_remainder=True))
            model.fit(dist, steps_per_epoch=steps, epochs=1, verbose=0)
            return [w.numpy() for w in model.hf.weights], float(model.loss_tracker.result())
        one, loss_one = train(["/cpu:0"], 1)
        two, loss_two = train(["/cpu:0", "/cpu:1"], 1)
        chunked, _ = train(["/cpu:0", "/cpu:1"], 4)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(one, two))
        chunk_diff = max(float(np.abs(a - b).max()) for a, b in zip(two, chunked))
        print(json.dumps({"diff": diff, "chunk_diff": chunk_diff, "loss_one": loss_one, "loss_two": loss_two}))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    assert got["diff"] < 2e-5, got  # 2 replicas x half batch == 1 replica x whole batch
    assert got["chunk_diff"] < 1e-5, got  # float sums in another order, no more
    assert got["loss_one"] == pytest.approx(got["loss_two"], rel=1e-5)


def test_accumulated_micro_batches_give_the_big_batch_step(keras_python: str) -> None:
    """Like PyTorch/XLA's: targets have 2 to 5 tokens, so the micro-batches count different tokens and
    averaging per micro-batch would not give the big batch's gradient; dividing by the whole step's tokens
    does. SGD makes the weights' change the gradient itself (times the rate); AdamW then checks that the
    optimizer's iterations, hence the learning-rate schedule, and the logged loss count optimizer steps, not
    micro-batches."""
    got = run_in_venv(
        keras_python,
        """
        import json, types, numpy as np, tensorflow as tf, transformers
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
        from tpuft.worker.keras.parts import build_trainable, make_schedule
        rng = np.random.default_rng(0)
        n = 16
        labels = rng.integers(3, 40, size=(n, 5)).astype(np.int32)
        for row, length in enumerate(rng.integers(2, 6, size=n)):
            labels[row, length:] = -100
        data = {"input_ids": rng.integers(3, 40, size=(n, 7)).astype(np.int32), "attention_mask": np.ones((n, 7), np.int32),
                "labels": labels, "weight": np.ones(n, np.float32)}
        shapes = types.SimpleNamespace(max_source_length=7, max_target_length=5)
        def train(devices, accum, optimizer, steps):
            strategy = tf.distribute.MirroredStrategy(devices)
            tf.keras.utils.set_random_seed(1)
            with strategy.scope():
                config = transformers.T5Config(vocab_size=48, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1,
                                               dropout_rate=0.0, decoder_start_token_id=0)
                model = build_trainable(tf, transformers.TFT5ForConditionalGeneration(config), classify=False,
                                        start_token=0, clip_norm=None, accum_steps=accum)
                model.distribute_reduction_method = "first"
                model.build_all(shapes)  # the trainer builds every weight before fit, as here
                before = [w.numpy() for w in model.hf.trainable_weights]
                schedule = make_schedule(tf, 0.5 if optimizer == "sgd" else 1e-3, 10, 4, "linear")
                opt = tf.keras.optimizers.SGD(schedule) if optimizer == "sgd" else tf.keras.optimizers.AdamW(schedule)
                model.compile(optimizer=opt)
            dist = strategy.experimental_distribute_dataset(
                tf.data.Dataset.from_tensor_slices(data).repeat().batch(n, drop_remainder=True))
            history = model.fit(dist, steps_per_epoch=1, epochs=steps, verbose=0)
            after = [w.numpy() for w in model.hf.trainable_weights]
            return {"delta": [a - b for a, b in zip(after, before)], "iterations": int(opt.iterations.numpy()),
                    "loss": history.history["loss"], "lr": float(schedule(opt.iterations))}
        out = {}
        for optimizer, steps in (("sgd", 1), ("adamw", 3)):
            big = train(["/cpu:0"], 1, optimizer, steps)
            for name, devices, accum in (("accum4", ["/cpu:0"], 4), ("replicas2_accum2", ["/cpu:0", "/cpu:1"], 2)):
                run = train(devices, accum, optimizer, steps)
                out[f"{optimizer}_{name}"] = {
                    "diff": max(float(np.abs(a - b).max()) for a, b in zip(big["delta"], run["delta"])),
                    "scale": max(float(np.abs(a).max()) for a in big["delta"]),
                    "iterations": [big["iterations"], run["iterations"]], "loss": [big["loss"], run["loss"]],
                    "lr": [big["lr"], run["lr"]]}
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    for name, case in got.items():
        print(
            f"\nkeras {name}: max |weight change diff| {case['diff']:.2e} (changes up to {case['scale']:.2e})"
        )
        assert case["scale"] > 0, name
        if name.startswith(
            "sgd"
        ):  # the change is the gradient times the rate: float sums in another order, no more
            assert case["diff"] <= 1e-4 * case["scale"], (name, case)
        else:  # AdamW's first steps normalise every element: lr 1e-3 a step
            assert case["diff"] <= 1e-5, (name, case)
        steps = 1 if name.startswith("sgd") else 3
        # one optimizer step per fit step, not per micro-batch
        assert case["iterations"] == [steps, steps], (
            name,
            case,
        )
        assert case["lr"][0] == case["lr"][1], (name, case)
        big, accumulated = case["loss"]
        assert len(accumulated) == steps and accumulated == pytest.approx(big, rel=1e-5), (name, case)


def test_eval_sums_exact_match_on_the_device(keras_python: str) -> None:
    got = run_in_venv(
        keras_python,
        """
        import json, numpy as np, tensorflow as tf, transformers
        from tpuft.worker.keras.parts import build_trainable, eval_row
        tf.keras.utils.set_random_seed(3)
        config = transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1,
                                       decoder_start_token_id=0)
        hf = transformers.TFT5ForConditionalGeneration(config)
        model = build_trainable(tf, hf, classify=False, start_token=0, clip_norm=None)
        model.compile(optimizer="adam")
        rng = np.random.default_rng(0)
        ids = rng.integers(3, 30, size=(6, 5)).astype(np.int32)
        # targets: the model's own greedy argmax for rows 0-2 (exact), a changed token for rows 3-5
        labels = np.zeros((6, 4), np.int32)
        for pos in range(4):
            dec = np.concatenate([np.zeros((6, 1), np.int32), labels[:, :-1]], axis=1)
            logits = hf(input_ids=ids, decoder_input_ids=dec).logits.numpy()
            labels[:, pos] = logits[:, pos].argmax(-1)
        labels[3:, 1] = (labels[3:, 1] + 1) % 32
        labels[0, 3] = -100  # a padded position does not count
        weight = np.array([1, 1, 1, 1, 1, 0], np.float32)  # the last row pads the batch
        ds = tf.data.Dataset.from_tensor_slices({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                 "labels": labels, "weight": weight}).batch(3)
        sums = model.evaluate(ds, verbose=0, return_dict=True)
        # the reference, in NumPy: teacher-forced argmax against the labels, real rows and positions only
        dec = np.concatenate([np.zeros((6, 1), np.int32), np.where(labels == -100, 0, labels)[:, :-1]], axis=1)
        pred = hf(input_ids=ids, decoder_input_ids=dec).logits.numpy().argmax(-1)
        mask = (labels != -100) & (weight[:, None] > 0)
        print(json.dumps({**eval_row(sums, classify=False), "tokens": int(mask.sum()),
                          "reference": float(((pred == labels) & mask).sum() / mask.sum())}))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    assert got["eval_examples"] == 5 and got["eval_exact_match"] == pytest.approx(3 / 5), got
    assert got["tokens"] == 19 and got["eval_token_accuracy"] == pytest.approx(got["reference"], abs=1e-6), (
        got
    )
    assert got["eval_token_accuracy"] < 1.0


def test_two_workers_with_two_cpu_devices_each_are_four_replicas_in_sync(keras_python: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``local.devices_per_worker: 2`` on a 2-worker pod (``tpuft/worker/keras/devices.py``): each worker's
    two logical CPU devices are replicas of one MultiWorkerMirroredStrategy (TF alone would take one CPU
    device per worker), the all-reduce spans all four, and a short ``fit`` ends with the same weights on both
    workers."""
    from tpuft.core.ports import free_port

    peers = json.dumps([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
    code = textwrap.dedent(f"""
        import json, os, sys
        index = int(sys.argv[1])
        os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"worker": {peers}}}, "task": {{"type": "worker", "index": index}}}})
        import tensorflow as tf
        from tpuft.worker.keras.devices import cpu_strategy
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = cpu_strategy(tf, 2, 2, options)
        ids = strategy.run(lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32))
        total = float(strategy.reduce("SUM", ids, axis=None))
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
            model.compile(optimizer="sgd", loss="mse")
        x = tf.random.stateless_normal((32, 4), seed=(1, index))
        data = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1, keepdims=True))).repeat().batch(4)
        model.fit(strategy.distribute_datasets_from_function(lambda _: data), epochs=1, steps_per_epoch=3, verbose=0)
        print(json.dumps({{"replicas": strategy.num_replicas_in_sync, "local": len(strategy.extended.worker_devices),
                          "sum": total, "weights": [float(w) for w in model.get_weights()[0].ravel()]}}))
    """)  # noqa: E501 (a script run in another interpreter)
    env = {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_USE_LEGACY_KERAS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    procs = [
        subprocess.Popen(
            [keras_python, "-c", code, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(err[-3000:] for _, err in outs)
    first, second = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert first["replicas"] == second["replicas"] == 4 and first["local"] == second["local"] == 2
    assert first["sum"] == second["sum"] == 1 + 2 + 3 + 4  # every replica of both workers in one all-reduce
    assert first["weights"] == second["weights"]


def test_the_prediction_engine_decodes_and_classifies_on_the_device(keras_python: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``keras_predict.KerasEngine`` (the test evaluation's and ``tpuft predict``'s) under a MirroredStrategy
    of two CPU devices, with a batch that does not fill its static size: the greedy decodes on the device
    equal transformers' own greedy ``generate`` row for row (so the rows come back in order from both
    replicas), beam search equals ``generate``'s with the same beams, and the classifier's argmax on the
    device gives the label of the host's argmax. Then the test evaluation's weight swap: a checkpoint's
    weights loaded into the model by name (``keras_test.swap_in``), the last ones put back."""
    got = run_in_venv(
        keras_python,
        f"""
        import json, types, numpy as np, tensorflow as tf, transformers
        from pathlib import Path
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
        from tpuft.backends.keras import LAYOUT
        from tpuft.data import encode_texts, load_tokenizer
        from tpuft.worker.keras.parts import weights_digest
        from tpuft.worker.keras.predict import KerasEngine
        from tpuft.worker.keras.testset import swap_in
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        tok = load_tokenizer("byt5")
        data = types.SimpleNamespace(max_source_length=12, max_target_length=6, truncation="head", labels=[])
        sources = ["one two", "seven", "forty four", "nine hundred", "zero", "a b c d e f g h"]
        out = {{}}
        with strategy.scope():
            tf.keras.utils.set_random_seed(5)
            config = transformers.T5Config(vocab_size=len(tok), d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1,
                                           pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
            t5 = transformers.TFT5ForConditionalGeneration(config)
        recipe = types.SimpleNamespace(data=data, backend=types.SimpleNamespace(task="text2text"))
        ids, masks = encode_texts(tok, sources, 12, "head")
        for beams in (1, 2):
            engine = KerasEngine(tf, strategy, t5, tok, recipe, batch_size=4, num_beams=beams)  # 2 calls: 4 + 2 rows
            ref = t5.generate(tf.constant(ids), attention_mask=tf.constant(masks), max_new_tokens=6, num_beams=beams,
                              do_sample=False).numpy()[:, 1:]
            out[f"beams{{beams}}"] = [engine.predict(sources), [engine.decode(row) for row in ref], engine.batch]
        with strategy.scope():
            bert = transformers.TFBertForSequenceClassification(transformers.BertConfig(
                vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                num_labels=3))
        labels = ["red", "green", "blue"]
        recipe = types.SimpleNamespace(data=types.SimpleNamespace(**{{**vars(data), "labels": labels}}),
                                       backend=types.SimpleNamespace(task="classification"))
        engine = KerasEngine(tf, strategy, bert, tok, recipe, batch_size=3)
        host = bert(tf.constant(ids), attention_mask=tf.constant(masks), training=False).logits.numpy().argmax(-1)
        out["classes"] = [engine.predict(sources), [labels[i] for i in host]]
        # the weight swap: a checkpoint folder as the trainer writes it, the model changed after it
        folder = Path({str(tmp_path)!r}) / "step_00000001"
        t5.save_pretrained(folder)
        LAYOUT.write_manifest(folder)
        saved = weights_digest(t5)
        for variable in t5.weights:
            variable.assign(variable + 0.5)
        changed = weights_digest(t5)
        run = types.SimpleNamespace(model=types.SimpleNamespace(hf=t5), ctx=None, loop=types.SimpleNamespace(layout=LAYOUT))
        last = swap_in(run, folder)
        loaded = weights_digest(t5)
        for variable, value in zip(t5.weights, last):
            variable.assign(value)
        out["swap"] = [saved != changed, loaded == saved, weights_digest(t5) == changed]
        print(json.dumps(out))
    """,  # noqa: E501 (a script run in another interpreter)
    )
    greedy, reference, batch = got["beams1"]
    assert batch == 4 and greedy == reference and len(greedy) == 6 and len(set(greedy)) > 2, got
    assert got["beams2"][0] == got["beams2"][1], got
    predicted, host = got["classes"]
    assert predicted == host and len(predicted) == 6 and len(set(predicted)) > 1, got
    assert got["swap"] == [True, True, True], got
