"""convert from and to gs:// through the storage layer (real google-cloud-storage client against the GCS
emulator), choosing one step's parameters only; and --verify in the torch venv."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.convert.model_source import ConvertError
from tpuft.convert.remote import fetch_checkpoint, select_files
from tpuft.storage import open_storage

DATA = Path(__file__).resolve().parent.parent / "data" / "t5x"
BUCKET = "tpuft-convert-test"


def test_select_one_steps_parameters_only() -> None:
    names = [
        "config.gin",
        *(
            f"checkpoint_{s}/{f}"
            for s in (2, 10)
            for f in (
                "checkpoint",
                "target.encoder.x/.zarray",
                "target.encoder.x/0",
                "state.param_states.x/0",
            )
        ),
        "train/events.out.tfevents.1",
    ]
    chosen = select_files(names, None, "gs://b/m")
    assert chosen.checkpoint == "checkpoint_10"
    assert chosen.files == {
        "config.gin",
        "checkpoint_10/checkpoint",
        "checkpoint_10/target.encoder.x/.zarray",
        "checkpoint_10/target.encoder.x/0",
    }
    assert select_files(names, 2, "gs://b/m").checkpoint == "checkpoint_2"
    with pytest.raises(ConvertError, match=r"no checkpoint for step 3 \(have: 2, 10\)"):
        select_files(names, 3, "gs://b/m")

    run = [
        "run.json",
        "checkpoints/step_00000500/config.json",
        "checkpoints/step_00000500/model.safetensors",
        "checkpoints/step_00000500/optimizer.pt",
        "checkpoints/step_00001000/config.json",
        "checkpoints/step_00001000/model.safetensors",
        "checkpoints/step_00001000/optimizer.pt",
    ]
    chosen = select_files(run, None, "gs://b/runs/r")
    assert chosen.files == {
        "checkpoints/step_00001000/config.json",
        "checkpoints/step_00001000/model.safetensors",
    }
    with pytest.raises(ConvertError, match="no checkpoint found"):
        select_files(["a/b.txt"], None, "gs://b/x")


def test_what_a_conversion_fetches_is_what_the_layouts_say() -> None:
    """The backends' RunLayouts decide: a Keras run's optimizer variables and trainer state stay in the bucket
    too (its step_N folders are named like PyTorch/XLA's, so a file is fetched only when both layouts read
    it)."""
    run = [
        "run.json",
        *(
            f"checkpoints/step_00000100/{f}"
            for f in ("config.json", "tf_model.h5", "optimizer.npz", "trainer_state.json", "manifest.json")
        ),
    ]
    chosen = select_files(run, None, "gs://b/runs/k", lambda folder: [])
    assert chosen.files == {
        "checkpoints/step_00000100/config.json",
        "checkpoints/step_00000100/tf_model.h5",
        "checkpoints/step_00000100/manifest.json",
    }
    orbax = [
        "checkpoint_4/state/_METADATA",
        "checkpoint_4/state/ocdbt.process_0/d/1",
        "checkpoint_4/_CHECKPOINT_METADATA",
        "checkpoint_4/config.gin",
        "train/events.out.tfevents.1",
    ]
    # T5X's own: no manifest
    chosen = select_files(orbax, None, "gs://b/m", lambda folder: ["no readable manifest"])
    assert chosen.checkpoint == "checkpoint_4" and chosen.files == set(orbax[:4])


def test_a_half_uploaded_torch_checkpoint_is_never_picked() -> None:
    """The syncer uploads a checkpoint file by file: step 1000 has its config but not all its weights yet."""
    run = [
        "checkpoints/step_00000500/config.json",
        "checkpoints/step_00000500/model.safetensors",
        "checkpoints/step_00001000/config.json",
        "checkpoints/step_00001000/manifest.json",
    ]
    missing = {"checkpoints/step_00001000": ["model.safetensors: missing"], "checkpoints/step_00000500": []}
    chosen = select_files(run, None, "gs://b/runs/r", missing.__getitem__)
    assert chosen.checkpoint == "checkpoints/step_00000500"
    with pytest.raises(ConvertError, match="step_00001000 is incomplete \\(model.safetensors: missing\\)"):
        select_files(run, 1000, "gs://b/runs/r", missing.__getitem__)
    with pytest.raises(ConvertError, match="no complete checkpoint"):
        select_files(run, None, "gs://b/runs/r", lambda folder: ["no readable manifest"])


def test_convert_gs_to_gs(cli, gcs: GcsEmulator, tmp_path: Path) -> None:
    storage = open_storage(f"gs://{BUCKET}")
    storage.ensure_bucket("us-central1")
    model = tmp_path / "model"
    shutil.copytree(DATA / "byt5_tiny_asym" / "legacy", model)
    shutil.copytree(model / "checkpoint_2", model / "checkpoint_1")  # an older step that must not be fetched
    storage.upload_tree(model, "t5x/byt5")

    fetched = fetch_checkpoint(f"gs://{BUCKET}/t5x/byt5", None)
    assert fetched.name == "checkpoint_2" and (fetched.parent / "config.gin").is_file()
    assert not (fetched.parent / "checkpoint_1").exists()
    assert not [p for p in fetched.iterdir() if p.name.startswith("state.")]  # no optimizer state downloaded

    result = cli("convert", f"gs://{BUCKET}/t5x/byt5", f"gs://{BUCKET}/hf/byt5", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["step"] == 2
    names = storage.list("hf/byt5")
    assert set(names) == {
        f"hf/byt5/{n}"
        for n in ("config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json")
    }

    local = tmp_path / "local"
    assert cli("convert", str(model), str(local), "--step", "2").code == 0
    storage.download_tree("hf/byt5", tmp_path / "downloaded")
    assert (tmp_path / "downloaded" / "model.safetensors").read_bytes() == (
        local / "model.safetensors"
    ).read_bytes()

    again = cli("convert", f"gs://{BUCKET}/t5x/byt5", f"gs://{BUCKET}/hf/byt5")
    assert again.code == 2 and "--overwrite" in again.err
    missing = cli("convert", f"gs://{BUCKET}/nothing-here", str(tmp_path / "x"))
    assert missing.code == 2 and "nothing is stored under it" in missing.err


@pytest.mark.slow
def test_verify_loads_runs_and_compares(cli, tmp_path: Path, torch_python: str) -> None:
    result = cli(
        "convert",
        str(DATA / "t5_1_1_tiny" / "orbax"),
        str(tmp_path / "t5x"),
        "--verify",
        "--verify-python",
        torch_python,
        "--json",
    )
    assert result.code == 0, result.err
    verify = json.loads(result.out)["verify"]
    assert (
        verify["ok"]
        and verify["finite"]
        and verify["missing"] == []
        and verify["model_class"] == "T5ForConditionalGeneration"
    )
    assert verify["compared_with"] is None and "T5X" in verify["not_compared"]

    # a torch checkpoint is compared with itself as the source: bf16 output differs a little, and is reported
    result = cli(
        "convert",
        str(tmp_path / "t5x"),
        str(tmp_path / "bf16"),
        "--dtype",
        "bfloat16",
        "--verify",
        "--verify-python",
        torch_python,
        "--json",
    )
    assert result.code == 0, result.err
    verify = json.loads(result.out)["verify"]
    assert verify["compared_with"] == "the torch checkpoint" and 0 < verify["max_abs_diff"] < 0.1

    # weights that the model does not take fail the command
    from tpuft.convert.safetensors_io import PlannedTensor, SafetensorsReader, write_streaming

    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "t5x", broken)
    with SafetensorsReader(broken / "model.safetensors") as reader:
        arrays = {name: np.array(reader.get(name)) for name in reader.tensors}
    arrays["encoder.block.0.layer.9.extra.weight"] = np.zeros(3, np.float32)
    del arrays["decoder.final_layer_norm.weight"]
    write_streaming(
        broken / "model.safetensors",
        [PlannedTensor(k, "F32", v.shape, lambda v=v: v) for k, v in arrays.items()],
        {"format": "pt"},
    )
    result = cli(
        "convert", str(broken), str(tmp_path / "broken-out"), "--verify", "--verify-python", torch_python
    )
    assert result.code == 2
    assert (
        "decoder.final_layer_norm.weight" in result.err
        and "encoder.block.0.layer.9.extra.weight" in result.err
    )
