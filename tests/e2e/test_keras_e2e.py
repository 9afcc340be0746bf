"""The Keras backend end to end on the local CPU pod: 2 workers of MultiWorkerMirroredStrategy (TF_CONFIG from
the workers' addresses, gradients all-reduced by TF's collectives), through the real CLI and the real Keras
venv.

* ``tpuft up keras_quickstart``: a tiny TFT5 learns the numbers task to >= 0.9 held-out exact match
  (teacher-forced, computed in the graph), both workers end with identical weights (digests), and the run dir
  holds what monitor, pull, convert and resume read; its test set (``data.test``) is decoded greedily on the
  device once at the end: the ``test_*`` row, the summary's ``test``, one predictions file per worker that
  merge to the 500 inputs in order. ``tpuft predict`` of the run on the pod (the same Keras engine, through
  the shared shard loop) gives the test evaluation's predictions and scores.
* ``tpuft up keras_classification_quickstart``: a tiny BERT over bytes classifies reviews to >= 0.9 accuracy
  (and test accuracy, with macro-F1, on the best checkpoint); the best checkpoint by accuracy is kept and
  exported, and the PyTorch model of the export gives the Keras model's logits (< 1e-4), as does the T5 export
  of the quickstart.
* Early stopping stops both workers at the same evaluation and says why; the test evaluation then runs on the
  best checkpoint (loaded into the model for the test, the last weights put back).
* Gradient accumulation (``train.grad_accum_steps=4``) through the real trainer: the same losses as the
  quickstart run's warm-up without it (dropout is off), both workers identical.
* A worker's trainer killed mid-run fails the run fast (its peer does not wait forever in a collective), and
  ``tpuft resume`` continues from the last checkpoint to the recipe's step count, the metrics without
  duplicates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, wait_until
from tests.e2e.tracking_checks import REPORT, check_tracking
from tests.pods import Finished, Pod, created_pod
from tpuft.backends.keras import LAYOUT
from tpuft.core.paths import recipes_dir
from tpuft.run import rundir
from tpuft.scoring import predictions

pytestmark = pytest.mark.slow

QUICKSTART_STEPS = 1000
"""Not the recipe's 1500: a 1000-step run (its schedule decays to 0 at its last step) clears the quickstart's
0.9 bar with margin (measured: 0.968 held-out exact match, twice, on 9,500 training numbers; with the 9,000
left beside the test split, 0.964, and 0.966 test exact match), in a third less training time."""
CLASSIFIER_STEPS = 400
"""Not the recipe's 600, for the same reason (measured: best accuracy 0.958, at step 400; with the 5,000
training reviews left beside the test split, 0.988 at step 400, and 0.994 test accuracy, macro-F1 0.994)."""


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, keras_python: str) -> Pod:
    pod = created_pod(tmp_path_factory.mktemp("keras-e2e"), "keras-pod")
    setup = pod.tpuft("setup", "keras_quickstart", timeout=1200)
    assert setup.returncode == 0, setup.stderr[-3000:]
    # keras_python built it, through the same cache key
    assert "venv ready (cached)" in setup.stdout + setup.stderr
    return pod


@pytest.fixture(scope="module")
def quickstart(pod: Pod) -> Finished:
    return pod.up("keras_quickstart", "--set", f"train.steps={QUICKSTART_STEPS}", "--set", REPORT)


@pytest.fixture(scope="module")
def classifier(pod: Pod) -> Finished:
    return pod.up("keras_classification_quickstart", "--set", f"train.steps={CLASSIFIER_STEPS}")


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()]


def check_tested(
    done: Finished, data: str, source: str, target: str, step: int, labels: tuple[str, ...] = ()
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's test evaluation, checked against its run dir: the summary's ``test`` is the metrics row's
    (logged at the last step, on the checkpoint of ``step``), one predictions file per worker, merged in input
    order to the test file's 500 examples, scoring as the row says. Returns the test items and the merged
    predictions."""
    run = done.run_dir
    test = done.summary["test"]
    assert test["test_examples"] == 500 and test["test_checkpoint_step"] == step, test
    (row,) = [r for r in rows(run) if "test_examples" in r]
    assert rundir.test_items(row) == test and row["step"] == max(r["step"] for r in rows(run))
    files = sorted(p.name for p in (run / rundir.TEST_DIR).iterdir())
    assert files == [predictions.shard_name(0), predictions.shard_name(1)], files  # no temp file left
    merged = predictions.merged(run / rundir.TEST_DIR)
    expected = [json.loads(line) for line in (recipes_dir() / data).read_text().splitlines()]
    assert [r["id"] for r in merged] == list(range(500))
    assert [(r["input"], r["target"]) for r in merged] == [(e[source], e[target]) for e in expected]
    scores = predictions.score([r["prediction"] for r in merged], [r["target"] for r in merged], labels)
    assert scores == {
        key[5:]: value for key, value in test.items() if key not in {"test_seconds", "test_checkpoint_step"}
    }
    print(f"\n{run.name}: test {test} ({done.summary['last_eval']})")
    return test, merged


def test_the_quickstart_reaches_the_bar_with_identical_workers(quickstart: Finished, pod: Pod) -> None:
    summary, run = quickstart.summary, quickstart.run_dir
    assert summary["last_eval"]["eval_examples"] == 500 and summary["last_eval"]["eval_exact_match"] >= 0.9, (
        summary
    )
    digests = summary["weight_digests"]
    assert len(digests) == 2 and len(set(digests.values())) == 1, digests  # MWMS kept the replicas in sync
    metrics = rows(run)
    train = [r for r in metrics if "loss" in r]
    assert [r["step"] for r in train] == list(range(25, QUICKSTART_STEPS + 1, 25))
    assert (
        all(r["examples_per_s"] > 0 and r["tokens_per_s"] > 0 for r in train)
        and train[-1]["loss"] < train[0]["loss"] / 10
    )
    assert [r["step"] for r in metrics if "eval_exact_match" in r] == list(
        range(500, QUICKSTART_STEPS + 1, 500)
    )
    for worker in (0, 1):
        beat = rundir.read_json(rundir.heartbeat_path(run, worker)) or {}
        assert beat["status"] == "finished" and beat["step"] == QUICKSTART_STEPS, beat
    complete = dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints))
    assert list(complete) == [QUICKSTART_STEPS] and (complete[QUICKSTART_STEPS] / "tf_model.h5").is_file()
    assert (complete[QUICKSTART_STEPS] / "optimizer.npz").is_file()
    assert (run / rundir.EXPORT_HF / "model.safetensors").is_file()
    log = (run / rundir.LOGS_DIR / "worker-0.log").read_text()
    assert "CollectiveAllReduceStrategy with 2 replicas" in log and "25 per execution" in log
    shown = pod.tpuft("monitor", run.name, "--once", "--json", timeout=120)
    assert shown.returncode == 0 and json.loads(shown.stdout)["status"] == "finished", shown.stderr
    # the last weights
    test, _ = check_tested(quickstart, "data/numbers/test.jsonl", "words", "digits", QUICKSTART_STEPS)
    assert test["test_exact_match"] >= 0.9 and {"test_bleu", "test_rouge_l"} <= set(test), test
    state = json.loads((complete[QUICKSTART_STEPS] / "trainer_state.json").read_text())
    assert state["test"] == test  # a resume from the final checkpoint does not test again


def test_wandb_and_mlflow_hold_the_curves_monitor_plots(quickstart: Finished) -> None:
    check_tracking(quickstart.run_dir, run_id=quickstart.run_dir.name, backend="keras", accelerator="v4-16")


def test_the_classifier_reaches_the_bar_and_exports_its_best(classifier: Finished) -> None:
    summary, run = classifier.summary, classifier.run_dir
    evals = [r for r in rows(run) if "eval_accuracy" in r]
    assert evals and max(r["eval_accuracy"] for r in evals) >= 0.9, evals
    digests = summary["weight_digests"]
    assert len(digests) == 2 and len(set(digests.values())) == 1, digests
    best = max(evals, key=lambda r: r["eval_accuracy"])["step"]
    complete = dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints))
    assert best in complete, (best, complete)  # kept besides the last one, whatever checkpoint_every says
    config = json.loads((run / rundir.EXPORT_HF / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    log = (run / rundir.LOGS_DIR / "worker-0.log").read_text()
    assert f"exporting the best checkpoint: step {best}" in log
    test, merged = check_tested(
        classifier, "data/reviews/test.jsonl", "text", "label", best, ("negative", "positive")
    )
    assert test["test_accuracy"] >= 0.9 and test["test_macro_f1"] >= 0.9, test
    # label names, from the argmax's indices
    assert {r["prediction"] for r in merged} == {
        "negative",
        "positive",
    }


# Runs in the Keras venv: the Keras model of each checkpoint, its logits on a few inputs (one process for both
# models: TensorFlow's import is most of the time).
KERAS_LOGITS = textwrap.dedent(
    """
    import sys
    import numpy as np, tensorflow as tf, transformers
    for checkpoint, kind, out in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        rng = np.random.default_rng(0)
        feed = {"input_ids": rng.integers(3, 250, size=(3, 12)).astype(np.int32)}
        feed["attention_mask"] = np.ones_like(feed["input_ids"])
        if kind == "t5":
            model = transformers.TFT5ForConditionalGeneration.from_pretrained(checkpoint)
            feed["decoder_input_ids"] = rng.integers(3, 250, size=(3, 5)).astype(np.int32)
        else:
            model = transformers.TFAutoModelForSequenceClassification.from_pretrained(checkpoint)
        logits = model(**{k: tf.constant(v) for k, v in feed.items()}, training=False).logits.numpy()
        np.savez(out, logits=logits, **feed)
    """
)
# Runs in the torch venv (transformers 5): each exported PyTorch model on the same inputs.
TORCH_LOGITS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch, transformers
    got = {}
    for export, kind, reference in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        reference = np.load(reference)
        cls = transformers.T5ForConditionalGeneration if kind == "t5" else transformers.AutoModelForSequenceClassification
        model = cls.from_pretrained(export, dtype=torch.float32).eval()
        names = ["input_ids", "attention_mask"] + (["decoder_input_ids"] if kind == "t5" else [])
        with torch.no_grad():
            logits = model(**{k: torch.from_numpy(reference[k].astype(np.int64)) for k in names}).logits.numpy()
        got[kind] = {"diff": float(np.abs(logits - reference["logits"]).max()),
                     "scale": float(np.abs(reference["logits"]).max())}
    print(json.dumps(got))
    """  # noqa: E501 (a script run in another interpreter)
)


def test_the_hf_exports_give_the_keras_models_logits(
    quickstart: Finished, classifier: Finished, keras_python: str, torch_python: str, tmp_path: Path
) -> None:
    """The T5 export of the quickstart and the BERT export of the classifier (its best checkpoint, not its
    last)."""
    keras_args: list[str] = []
    torch_args: list[str] = []
    for kind, run in (("t5", quickstart.run_dir), ("bert", classifier.run_dir)):
        log = (run / rundir.LOGS_DIR / "worker-0.log").read_text()
        exported = max(dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints)))
        if "exporting the best checkpoint: step " in log:
            exported = int(log.split("exporting the best checkpoint: step ")[1].split()[0])
        reference = str(tmp_path / f"{kind}.npz")
        keras_args += [str(LAYOUT.checkpoint_dir(run, exported)), kind, reference]
        torch_args += [str(run / rundir.EXPORT_HF), kind, reference]
    for python, script, args in (
        (keras_python, KERAS_LOGITS, keras_args),
        (torch_python, TORCH_LOGITS, torch_args),
    ):
        path = tmp_path / "script.py"
        path.write_text(script)
        env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [python, str(path), *args], capture_output=True, text=True, timeout=600, env=env
        )
        assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(got) == {"t5", "bert"}, got
    for kind, compared in got.items():
        print(
            f"\nkeras {kind} export: max |logits diff| {compared['diff']:.2e} (logits up to "
            f"{compared['scale']:.2f})"
        )
        assert compared["diff"] < 1e-4 and compared["scale"] > 0.1, (kind, compared)


def test_predict_on_the_pod_gives_the_test_evaluations_predictions(
    quickstart: Finished, pod: Pod, tmp_path: Path
) -> None:
    """``tpuft predict RUN`` on the 2-worker pod runs the Keras engine of the run's test evaluation (its last
    checkpoint, greedy decodes on the device under MultiWorkerMirroredStrategy) through the shared shard loop:
    on the test file, the same predictions row for row and the same scores as the run's ``test_*``."""
    test_file = recipes_dir() / "data/numbers/test.jsonl"
    out = tmp_path / "test.predictions.jsonl"
    started = time.monotonic()
    done = pod.tpuft(
        "predict",
        quickstart.run_dir.name,
        "--input",
        str(test_file),
        "--output",
        str(out),
        "--shard-lines",
        "200",
        "--batch-size",
        "64",
        "--json",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    print(
        f"\nkeras predict on the pod: {result['rows']} rows in {time.monotonic() - started:.0f} s end to end"
    )
    test = quickstart.summary["test"]
    assert result["rows"] == 500 and result["scores"] == {
        key[5:]: value for key, value in test.items() if key not in {"test_seconds", "test_checkpoint_step"}
    }
    joined = [json.loads(line) for line in out.read_text().splitlines()]
    merged = predictions.merged(quickstart.run_dir / rundir.TEST_DIR)
    assert [(r["id"], r["prediction"]) for r in joined] == [(r["id"], r["prediction"]) for r in merged]


def test_early_stopping_stops_every_worker_at_the_same_evaluation(pod: Pod) -> None:
    """min_delta larger than any possible gain: the first evaluation is the best, the second one stops the
    run."""
    done = pod.up(
        "keras_classification_quickstart",
        "--set",
        "train.early_stopping={patience: 1, min_delta: 1.0}",
        "--set",
        "eval.every=50",
        "--set",
        "train.log_every=25",
        "--set",
        "eval.max_examples=100",
    )
    run = done.run_dir
    assert [r["step"] for r in rows(run) if "eval_accuracy" in r] == [50, 100], rows(run)
    for worker in (0, 1):
        beat = rundir.read_json(rundir.heartbeat_path(run, worker)) or {}
        assert beat["status"] == "finished" and beat["step"] == 100, beat
        assert "early stopping at step 100" in beat["stopped_early"], beat
    digests = done.summary["weight_digests"]
    assert len(set(digests.values())) == 1, digests
    log = (run / rundir.LOGS_DIR / "worker-0.log").read_text()
    assert "exporting the best checkpoint: step 50" in log
    assert (
        "testing the best checkpoint, step 50" in log and done.summary["test"]["test_checkpoint_step"] == 50
    )
    assert done.summary["test"]["test_examples"] == 500
    # goodput: the chief's events of what fit and the end did, each timed; no data wait (fit takes its batches
    # inside its compiled loop, out of Python's sight: docs/operations.md, Goodput, per backend)
    events = [
        json.loads(line)
        for line in (run / rundir.EVENTS_DIR / "worker-0-attempt-1.jsonl").read_text().splitlines()
    ]
    timed = {
        kind: [e for e in events if e["kind"] == kind]
        for kind in ("checkpoint_save", "eval", "test", "export")
    }
    assert {e["step"]: e["reason"] for e in timed["checkpoint_save"]} == {50: "best", 100: "final"}, events
    assert [e["step"] for e in timed["eval"]] == [50, 100] and len(timed["test"]) == len(
        timed["export"]
    ) == 1, events
    assert all(e["s"] > 0 for kind in timed.values() for e in kind), events
    assert not any("data_wait_s" in e for e in events if e["kind"] == "steps"), events


def test_gradient_accumulation_trains_as_the_whole_batch_does(pod: Pod, quickstart: Finished) -> None:
    """The quickstart's first 100 steps (its warm-up) with 4 micro-batches a step (4 examples each per
    replica), against the quickstart run's own first 100 steps: the warm-up's learning rates do not depend on
    the run's length, so that run is the whole-batch reference (measured: the same losses to the last digit as
    a 100-step run's). The train_step that tests/worker/test_keras_parts.py checks step by step, here under
    MultiWorkerMirroredStrategy with fit, the schedule, checkpoints and the callback's rows. The losses agree
    to float noise, which Adam's steps grow (measured: equal at step 25, 1e-5 apart at 50, 2e-3 at 100); the
    weights of the run's two workers are identical."""
    settings = [
        "--set",
        "train.steps=100",
        "--set",
        "train.log_every=25",
        "--set",
        "eval.every=null",
        "--set",
        "eval.max_examples=64",
        "--set",
        "train.checkpoint_every=50",
    ]
    accumulated = pod.up("keras_quickstart", *settings, "--set", "train.grad_accum_steps=4")
    whole = [r["loss"] for r in rows(quickstart.run_dir) if "loss" in r and r["step"] <= 100]
    losses = [r["loss"] for r in rows(accumulated.run_dir) if "loss" in r]
    assert [r["step"] for r in rows(accumulated.run_dir) if "loss" in r] == [25, 50, 75, 100]
    assert losses[:2] == pytest.approx(whole[:2], rel=1e-4), (whole, losses)
    assert losses == pytest.approx(whole, rel=2e-2), (whole, losses)
    assert len(set(accumulated.summary["weight_digests"].values())) == 1
    log = (accumulated.run_dir / rundir.LOGS_DIR / "worker-0.log").read_text()
    assert "(batch 16 per replica, 32 global, 4 micro-batches a step)" in log


def test_a_killed_worker_fails_the_run_fast_and_resume_continues(pod: Pod) -> None:
    total = 200
    settings = [
        "--set",
        f"train.steps={total}",
        "--set",
        "train.checkpoint_every=50",
        "--set",
        "train.log_every=25",
        "--set",
        f"eval.every={total}",
        "--set",
        "eval.max_examples=64",
    ]
    started = pod.tpuft("train", "keras_quickstart", "--detach", "--json", *settings)
    assert started.returncode == 0, started.stderr[-4000:]
    run = pod.runs / json.loads(started.stdout)["run_id"]

    def step(worker: int) -> int:
        return int((rundir.read_json(rundir.heartbeat_path(run, worker)) or {}).get("step") or 0)

    # tpuft checkpoint: the chief saves at the step boundary both workers reach after the ask (a multiple of
    # log_every), through the trainer's own save path, while the run goes on.
    asked = pod.tpuft("checkpoint", run.name, "--json", timeout=300)
    assert asked.returncode == 0, asked.stderr[-4000:]
    ondemand = json.loads(asked.stdout)
    assert ondemand["step"] % 25 == 0 and ondemand["step"] in dict(
        LAYOUT.local_checkpoints(run / LAYOUT.checkpoints)
    )
    print(
        f"\nkeras tpuft checkpoint: step {ondemand['step']} complete {ondemand['latency_s']} s after the ask"
    )
    wait_until(
        lambda: 50 in dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints)) and step(1) >= 75,
        600,
        "the checkpoint at step 50 and step 75",
    )
    record = json.loads((run / "attempts" / "1" / "worker-1.json").read_text())
    killed_at = time.monotonic()
    os.kill(record["trainer_pid"], signal.SIGKILL)
    wait_until(
        lambda: (rundir.read_json(run / rundir.RUN_INFO) or {}).get("status") not in (None, "running"),
        120,
        "the run to fail",
    )
    print(
        f"\nkeras fail-fast: the run failed {time.monotonic() - killed_at:.1f} s after a worker's trainer "
        "was killed"
    )
    failed = rundir.read_json(run / rundir.RUN_INFO) or {}
    assert failed["status"] == "failed" and failed["culprit"] == 1, failed
    peer = json.loads((run / "attempts" / "1" / "worker-0.json").read_text())
    assert peer.get("final") and peer.get("status") != "running", peer

    # train.time_limit (the sequencer's): resumed with a 1 s budget, the run ends at its next log_every
    # boundary, saved there, and finishes; resumed again with no limit, it goes on from that checkpoint
    limited = pod.tpuft("resume", run.name, "--json", "--time-limit", "1")
    assert limited.returncode == 0, limited.stderr[-6000:]
    beats = [rundir.read_json(rundir.heartbeat_path(run, worker)) or {} for worker in (0, 1)]
    stopped = beats[0]["step"]
    assert all(b["status"] == "finished" and b["ended"] == "time_limit" for b in beats), beats
    assert stopped % 25 == 0 and stopped < total and beats[1]["step"] == stopped, beats
    assert (rundir.read_json(run / rundir.RUN_INFO) or {})["status"] == "finished"
    assert stopped in dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints))
    resumed = pod.tpuft("resume", run.name, "--json", "--time-limit", "0")
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    log = (run / rundir.LOGS_DIR / "worker-0.log").read_text()
    assert any(f"resuming from checkpoint step_{at:08d}" in log for at in (50, 100, 150)), log[-3000:]
    assert f"resuming from checkpoint step_{stopped:08d}" in log and "train.time_limit reached" in log
    # no duplicates, no gaps
    assert [r["step"] for r in rows(run) if "loss" in r] == list(range(25, total + 1, 25))
    assert max(dict(LAYOUT.local_checkpoints(run / LAYOUT.checkpoints))) == total
    summary = json.loads(resumed.stdout)
    assert len(set(summary["weight_digests"].values())) == 1
