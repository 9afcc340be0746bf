"""The PyTorch/XLA trainer's fine-tuning features, each on the real trainer (one PJRT CPU replica, the
quickstart's tiny T5 and data), in the backend's venv: gradient accumulation, freezing, soft prompt tuning,
bf16, gradient checkpointing, Adafactor's knobs and the decay groups, early stopping with keep_best, and the
greedy decoder behind BLEU/ROUGE-L."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

HARNESS = Path(__file__).with_name("torch_harness.py")
QUICKSTART = REPO / "tpuft" / "recipes" / "quickstart.yaml"
SHORT = [
    "train.log_every=5",
    "eval.every=null",
    "eval.max_examples=64",
    "eval.batch_size=32",
    "train.warmup_steps=0",
    "export.hf=false",
]

pytestmark = pytest.mark.slow


class Harness:
    """One harness process in the backend's venv for the module's runs (``torch_harness.py --serve``): torch,
    torch_xla and transformers are imported once, not once per run. A run that needs another environment (a
    device count) gets a process of its own."""

    def __init__(self, torch_python: str, folder: Path) -> None:
        self.python, self.folder = torch_python, folder
        self.log = folder / "harness.err"
        self.proc = subprocess.Popen(
            [torch_python, str(HARNESS), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
            cwd=REPO,
            env=harness_env(folder),
        )

    def ask(self, config: Path) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{config}\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("__TPUFT_HARNESS_DONE__ "):
                out = json.loads(Path(line.split(" ", 1)[1].strip()).read_text())
                assert not (isinstance(out, dict) and "error" in out), (
                    out["error"] + self.log.read_text()[-3000:]
                )
                return out
        raise AssertionError(
            f"the harness ended (exit code {self.proc.wait()}): {self.log.read_text()[-6000:]}"
        )

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def harness_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TOKENIZERS_PARALLELISM": "false",
        **(extra or {}),
    }


@pytest.fixture(scope="module")
def harness(torch_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    server = Harness(torch_python, tmp_path_factory.mktemp("torch-harness"))
    yield server
    server.close()


def run(
    harness: Harness,
    tmp_path: Path,
    name: str,
    settings: list[str],
    probe: tuple[str, ...] = (),
    recipe: Path = QUICKSTART,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    config = tmp_path / f"{name}.json"
    if not any(setting.startswith("data.test=") for setting in settings):
        # the quickstart's 500 test decodes: only where a test looks at them
        settings = [
            "data.test=null",
            *settings,
        ]
    config.write_text(
        json.dumps(
            {
                "recipe": str(recipe),
                "set": settings,
                "run_dir": str(tmp_path / name),
                "probe": list(probe),
                "result": str(tmp_path / f"{name}.out.json"),
            }
        )
    )
    if env is None:
        return harness.ask(config)
    done = subprocess.run(
        [harness.python, str(HARNESS), str(config)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=harness_env(tmp_path, env),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(harness: Harness, a: str, b: str) -> list[dict[str, float]]:
    """Per saved state (a list of gradient dicts, or one weight dict): the largest difference between ``a``
    and ``b`` over every tensor, and the largest magnitude in ``a`` (computed in the venv: the controller has
    no torch)."""
    config = Path(a).with_name(f"compare-{Path(a).stem}-{Path(b).parent.name}.json")
    config.write_text(json.dumps({"compare": [a, b], "result": str(config.with_suffix(".out.json"))}))
    return harness.ask(config)


def test_one_accumulated_step_of_4x8_gives_the_update_of_one_step_of_32(
    harness: Harness, tmp_path: Path
) -> None:
    """Targets have 2 to 5 tokens, so the micro-batches' token counts differ: averaging per micro-batch would
    not give the big batch's gradient; summing over the step's tokens does."""
    base = [
        *SHORT,
        "train.steps=2",
        "train.batch_size=32",
        "train.max_grad_norm=null",
        "train.optimizer=adamw",
    ]
    one = run(harness, tmp_path, "one", [*base, "train.grad_accum_steps=1"], ("grads",))
    four = run(harness, tmp_path, "four", [*base, "train.grad_accum_steps=4"], ("grads",))
    steps = compare(harness, one["grads"], four["grads"])
    assert len(steps) == 2 and all(step["diff"] <= 1e-5 * step["scale"] for step in steps)
    (weights,) = compare(harness, one["final"], four["final"])
    assert weights["diff"] <= 1e-4  # AdamW's first steps normalise each gradient element: lr 1e-3 per step


def test_frozen_parts_stay_bit_identical_and_the_rest_trains(harness: Harness, tmp_path: Path) -> None:
    got = run(
        harness,
        tmp_path,
        "frozen",
        [*SHORT, "train.steps=10", "model.freeze=[encoder,embeddings]", "train.weight_decay=0.1"],
    )
    aliases = ("decoder.embed_tokens.", "lm_head.")  # the state dict's other names of the shared embedding
    assert set(got["unchanged"]) >= {"shared.weight", "encoder.final_layer_norm.weight"}
    assert all(n.startswith(("encoder.", "shared.", *aliases)) for n in got["unchanged"])
    assert not any(n.startswith("encoder.") for n in got["changed"])
    assert got["changed"] and all(
        n.startswith("decoder.") and not n.startswith(aliases) for n in got["changed"]
    )


def test_prompt_tuning_trains_only_the_prompt_and_learns_a_tiny_task(
    harness: Harness, tmp_path: Path
) -> None:
    """The model is a frozen random T5; the task is a constant answer, which a prompt alone can learn. The
    export has the prompt beside the HF dir, and the generated samples use it. The data comes as TSV (train)
    and Parquet (eval), read in the backend's venv by the one reader every format goes through."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"words": f"input number {i}", "digits": "42"} for i in range(256)]
    data = tmp_path / "constant.tsv"
    data.write_text("words\tdigits\n" + "".join(f"{row['words']}\t{row['digits']}\n" for row in rows))
    held_out = tmp_path / "constant.parquet"
    pq.write_table(pa.Table.from_pylist(rows), held_out, row_group_size=100)
    got = run(
        harness,
        tmp_path,
        "prompt",
        [
            "train.log_every=10",
            "eval.every=null",
            "train.steps=120",
            "train.batch_size=16",
            "train.optimizer=adamw",
            "train.learning_rate=0.3",
            "train.warmup_steps=0",
            f"data.train={data}",
            f"data.eval={held_out}",
            "eval.max_examples=32",
            "model.prompt_tuning.tokens=8",
            "model.prompt_tuning.init=vocab",
        ],
    )
    assert got["changed"] == ["prompt.weight"]
    assert "shared.weight" in got["unchanged"] and len(got["unchanged"]) > 20
    assert got["last_eval"]["eval_exact_match"] == 1.0
    export = tmp_path / "prompt" / "export"
    assert (export / "prompt.safetensors").is_file() and (export / "hf" / "config.json").is_file()


def test_bf16_computes_in_bfloat16_and_still_learns(harness: Harness, tmp_path: Path) -> None:
    got = run(
        harness, tmp_path, "bf16", [*SHORT, "train.steps=60", "train.precision=bf16"], ("logits_dtype",)
    )
    assert got["logits_dtype"] == "torch.bfloat16"
    rows = [json.loads(line) for line in (tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < 0.7 * losses[0]


def test_gradient_checkpointing_gives_the_same_gradients(harness: Harness, tmp_path: Path) -> None:
    base = [*SHORT, "train.steps=1", "train.max_grad_norm=null", "model.dropout=0.0"]
    plain = run(harness, tmp_path, "plain", base, ("grads",))
    recomputed = run(harness, tmp_path, "ckpt", [*base, "model.gradient_checkpointing=true"], ("grads",))
    (step,) = compare(harness, plain["grads"], recomputed["grads"])
    assert step["diff"] <= 1e-6 * step["scale"]


def test_adafactor_gets_every_knob_and_norms_and_biases_get_no_decay(
    harness: Harness, tmp_path: Path
) -> None:
    got = run(
        harness,
        tmp_path,
        "adafactor",
        [
            *SHORT,
            "train.steps=2",
            "train.optimizer=adafactor",
            "train.learning_rate=1e-4",
            "train.weight_decay=0.01",
            "train.adafactor.eps=[1e-30,1e-3]",
            "train.adafactor.clip_threshold=1.0",
            "train.adafactor.decay_rate=-0.8",
            "train.adafactor.beta1=0.9",
        ],
        ("optimizer",),
    )
    optimizer = got["optimizer"]
    assert optimizer["class"] == "Adafactor"
    assert optimizer["defaults"] | {"eps": [1e-30, 1e-3]} == optimizer["defaults"]
    assert {
        k: optimizer["defaults"][k]
        for k in (
            "lr",
            "clip_threshold",
            "decay_rate",
            "beta1",
            "relative_step",
            "scale_parameter",
            "warmup_init",
        )
    } == {
        "lr": 1e-4,
        "clip_threshold": 1.0,
        "decay_rate": -0.8,
        "beta1": 0.9,
        "relative_step": False,
        "scale_parameter": False,
        "warmup_init": False,
    }
    assert [g["weight_decay"] for g in optimizer["groups"]] == [0.01, 0.0]
    no_decay = got["no_decay"]
    assert any("layer_norm" in n for n in no_decay) and "decoder.final_layer_norm.weight" in no_decay
    # norms, and T5's relative attention biases
    assert all("layer_norm" in n or "bias" in n for n in no_decay)
    assert "encoder.block.0.layer.0.SelfAttention.q.weight" not in no_decay


def test_early_stopping_and_keep_best_on_the_real_trainer(harness: Harness, tmp_path: Path) -> None:
    """An improvement must beat the best by 0.5 exact match: the second evaluation cannot, so training stops
    there (step 20) and the export is the first evaluation's checkpoint, kept besides the last one. The test
    set is decoded with that best checkpoint's weights, swapped in and out again: the final checkpoint holds
    the last."""
    lines = (REPO / "tpuft" / "recipes" / "data" / "numbers" / "test.jsonl").read_text().splitlines()
    # a blank line: ids skip it
    (tmp_path / "test.jsonl").write_text("\n".join(lines[:24]) + "\n\n" + lines[24] + "\n")
    got = run(
        harness,
        tmp_path,
        "early",
        [
            "train.log_every=5",
            "eval.every=10",
            "eval.max_examples=32",
            "train.steps=100",
            "train.checkpoint_every=1000",
            "train.keep_checkpoints=1",
            "train.keep_best=true",
            "train.early_stopping.patience=1",
            "train.early_stopping.min_delta=0.5",
            f"data.test={tmp_path / 'test.jsonl'}",
            "eval.batch_size=16",
        ],
        ("test",),
    )
    assert got["step"] == 20 and "early stopping at step 20" in got["stopped_early"]
    assert got["best"]["step"] == 10 and got["best"]["metric"] == "eval_exact_match"
    kept = sorted(p.name for p in (tmp_path / "early" / "checkpoints").iterdir())
    assert kept == ["step_00000010", "step_00000020"]
    state = json.loads(
        (tmp_path / "early" / "checkpoints" / "step_00000020" / "trainer_state.json").read_text()
    )
    assert state["best"]["step"] == 10 and state["stopped_early"] == got["stopped_early"]
    beats = json.loads((tmp_path / "early" / "heartbeat" / "worker-0.json").read_text())
    assert beats["status"] == "finished" and beats["stopped_early"] == got["stopped_early"]
    test = got["test_result"]
    assert (
        test["test_checkpoint_step"] == 10
        and test["test_examples"] == 25
        and 0.0 <= test["test_exact_match"] <= 1.0
    )
    assert {"test_bleu", "test_rouge_l", "test_seconds"} <= set(test) and beats["test_exact_match"] == test[
        "test_exact_match"
    ]
    assert state["test"] == test  # in the final checkpoint: a run resumed from it does not test again
    assert got["weights_vs_checkpoints"] == {"step_00000010": False, "step_00000020": True}
    rows = [
        json.loads(line)
        for line in (tmp_path / "early" / "test" / "predictions-00000.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in rows] == [*range(24), 25] and rows[-1]["target"] == json.loads(lines[24])[
        "digits"
    ]
    assert sum(r["correct"] for r in rows) == round(test["test_exact_match"] * 25)


def test_greedy_decodes_on_the_device_match_generate_and_score_bleu(harness: Harness, tmp_path: Path) -> None:
    got = run(
        harness,
        tmp_path,
        "decode",
        [
            "train.log_every=50",
            "eval.every=null",
            "train.steps=150",
            "eval.max_examples=48",
            "eval.metric=bleu",
            "eval.generate_examples=24",
            "eval.batch_size=16",
        ],
        ("decodes",),
    )
    decodes = got["decodes"]
    assert len(decodes["ours"]) == 24 and decodes["ours"] == decodes["generate"]
    result = got["last_eval"]
    assert result["eval_decoded"] == 24 and 0.0 <= result["eval_bleu"] <= 100.0
    hits = sum(a == b for a, b in zip(decodes["ours"], decodes["targets"]))
    if hits == 24:
        assert result["eval_bleu"] == pytest.approx(100.0)
    assert got["best"]["metric"] == "eval_bleu"


def test_two_cpu_devices_run_data_parallel_or_fsdp_and_both_match_one_device(
    harness: Harness, tmp_path: Path
) -> None:
    """The SPMD code path on two PJRT CPU devices in one process (``local.devices_per_worker: 2``: the plan's
    ``TPUFT_LOCAL_DEVICES=2``, the runtime's ``CPU_NUM_DEVICES``). Without FSDP: a ``data`` mesh, the batch
    split over the devices, every weight replicated, as one process per chip does on a TPU host. With FSDP:
    large matrices split on the fsdp axis, norms whole. Both end two steps with the one-device run's
    weights."""
    base = [*SHORT, "train.steps=2", "train.max_grad_norm=null", "train.optimizer=adamw"]
    plain = run(harness, tmp_path, "one-device", base)
    local = run(harness, tmp_path, "data-parallel", base, ("sharding",), env={"TPUFT_LOCAL_DEVICES": "2"})
    assert local["mesh_devices"] == 2 and local["step"] == 2
    assert set(local["sharding"].values()) <= {"", "{replicated}"}  # data parallel: no weight is split
    sharded = run(
        harness, tmp_path, "fsdp", [*base, "train.sharding=fsdp"], ("sharding",), env={"CPU_NUM_DEVICES": "2"}
    )
    assert sharded["mesh_devices"] == 2
    specs = sharded["sharding"]
    assert specs["shared.weight"].startswith("{devices=[2,1]")  # 384 x 128: the vocabulary split
    # 256 x 128
    assert specs["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"].startswith("{devices=[2,1]")
    assert specs["encoder.block.0.layer.0.layer_norm.weight"] in ("", "{replicated}")
    for other in (local, sharded):
        (weights,) = compare(harness, plain["final"], other["final"])
        assert weights["diff"] <= 1e-4


def test_the_time_limit_ends_the_real_trainer_at_a_log_boundary_tested_and_exported(
    harness: Harness, tmp_path: Path
) -> None:
    """``train.time_limit`` (the sequencer's alone) on the real trainer: a 1 s budget against 10000 steps
    ends training at the first ``log_every`` boundary past it, with a checkpoint there, the test evaluation
    and the export, and a finished heartbeat that says why."""
    lines = (REPO / "tpuft" / "recipes" / "data" / "numbers" / "test.jsonl").read_text().splitlines()
    (tmp_path / "test.jsonl").write_text("\n".join(lines[:8]) + "\n")
    got = run(
        harness,
        tmp_path,
        "limited",
        [
            *SHORT,
            "train.steps=10000",
            "train.time_limit=1",
            "export.hf=true",
            f"data.test={tmp_path / 'test.jsonl'}",
        ],
        ("test",),
    )
    step = got["step"]
    assert 0 < step < 10000 and step % 5 == 0, step
    run_dir = tmp_path / "limited"
    beat = json.loads((run_dir / "heartbeat" / "worker-0.json").read_text())
    assert beat["status"] == "finished" and beat["step"] == step and beat["ended"] == "time_limit", beat
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{step:08d}"]
    state = json.loads((run_dir / "checkpoints" / f"step_{step:08d}" / "trainer_state.json").read_text())
    assert state["ended"] == "time_limit" and "test" not in state  # a resume goes on, and tests again
    test = got["test_result"]
    assert (
        test["test_checkpoint_step"] == step and test["test_examples"] == 8 and test["ended"] == "time_limit"
    )
    assert (run_dir / "export" / "hf" / "config.json").is_file()
