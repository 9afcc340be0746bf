"""T5X -> Hugging Face: golden tests against T5X's own logits, hand-built scanned/UMT5 and v1.0 checkpoints,
and the error paths. Conversion runs here (no torch); logits are computed in the PyTorch/XLA backend venv with
transformers 5.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.t5x_builders import write_legacy, write_orbax
from tpuft.convert.hf_writer import write_hf_model
from tpuft.convert.model_source import ConvertError
from tpuft.convert.safetensors_io import SafetensorsReader
from tpuft.convert.t5x_ckpt import find_t5x_checkpoint, open_t5x_checkpoint
from tpuft.convert.t5x_to_hf import plan_t5x

DATA = Path(__file__).resolve().parent.parent / "data" / "t5x"
MODELS = ("t5_1_1_tiny", "byt5_tiny_asym")
FORMATS = ("legacy", "orbax")

# Runs in the torch venv: load each converted dir, compare its logits on the given inputs with the reference.
CHECK_LOGITS = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch, transformers
    out = {}
    for job in json.loads(sys.argv[1]):
        ref = np.load(job["reference"])
        config = transformers.AutoConfig.from_pretrained(job["model"])
        cls = getattr(transformers, config.architectures[0])
        model, info = cls.from_pretrained(job["model"], output_loading_info=True, dtype=torch.float32)
        written = json.load(open(job["model"] + "/config.json"))
        if written.get("model_type") == "umt5" and not hasattr(model.config, "scale_decoder_outputs"):
            # transformers 5.0-5.23 force UMT5's tie_word_embeddings to true and so rescale the decoder output even
            # before an own head (5.24 fixed it; 4.x never did it): compare the weights as T5X computes with them
            model.config.tie_word_embeddings = written.get("tie_word_embeddings", True)
        ids = torch.from_numpy(ref["encoder_input_tokens"].astype(np.int64))
        dec = torch.from_numpy(ref["decoder_input_tokens"].astype(np.int64))
        with torch.no_grad():
            logits = model.eval()(input_ids=ids, attention_mask=ids > 0, decoder_input_ids=dec).logits.float().numpy()
        result = {"diff": float(np.abs(logits - ref["logits"]).max()), "missing": sorted(info["missing_keys"]),
                  "unexpected": sorted(info["unexpected_keys"]), "tied": model.lm_head.weight is model.shared.weight}
        if job.get("text"):
            tok = transformers.AutoTokenizer.from_pretrained(job["model"])
            result["ids"] = tok(job["text"]).input_ids
        out[job["model"]] = result
    print(json.dumps(out))
    """  # noqa: E501 (a script run in another interpreter)
)


def check_logits(python: str, jobs: list[dict], tmp_path: Path) -> dict[str, dict]:
    script = tmp_path / "check_logits.py"
    script.write_text(CHECK_LOGITS)
    proc = subprocess.run(
        [python, str(script), json.dumps(jobs)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fixture_copy(tmp_path: Path, model: str, fmt: str) -> Path:
    """A writable copy of one fixture's model dir (the checkpoint_2 inside it and its config.gin)."""
    target = tmp_path / model / fmt
    shutil.copytree(DATA / model / fmt, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


# ----------------------------------------------------------------------------------------------------------
# golden: T5X's own checkpoints and logits


@pytest.mark.slow
def test_golden_logits_match_t5x_for_both_formats_and_sharded_output(
    cli, tmp_path: Path, torch_python: str
) -> None:
    jobs = []
    for model in MODELS:
        for fmt in FORMATS:
            out = tmp_path / f"{model}-{fmt}"
            result = cli("convert", str(DATA / model / fmt), str(out), "--json")
            assert result.code == 0, result.err
            report = json.loads(result.out)
            assert report["kind"] == f"t5x-{fmt}" and report["step"] == 2 and report["shards"] == 1
            assert report["notes"] == []
            jobs.append(
                {"model": str(out), "reference": str(DATA / model / "reference.npz"), "text": "copy: word7"}
            )
    sharded = tmp_path / "sharded"
    result = cli(
        "convert", str(DATA / "t5_1_1_tiny" / "orbax"), str(sharded), "--max-shard-size", "40KB", "--json"
    )
    assert result.code == 0, result.err
    assert json.loads(result.out)["shards"] > 4
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == json.loads(result.out)["shards"]
    assert not (sharded / "model.safetensors").exists()
    jobs.append({"model": str(sharded), "reference": str(DATA / "t5_1_1_tiny" / "reference.npz")})

    results = check_logits(torch_python, jobs, tmp_path)
    reference_ids = np.load(DATA / "t5_1_1_tiny" / "reference.npz")["encoder_input_tokens"][0].tolist()
    for job in jobs:
        r = results[job["model"]]
        assert r["diff"] < 1e-4, (job["model"], r)
        assert r["missing"] == [] and r["unexpected"] == [], r
        assert r["tied"] is False  # the untied v1.1 head survived transformers 5's forced tying
        if "ids" in r:
            # the ByT5 tokenizer written beside the model encodes like T5X did
            assert r["ids"] == reference_ids


def test_both_formats_hold_the_same_parameters_and_config_matches_hf() -> None:
    for model in MODELS:
        legacy = open_t5x_checkpoint(find_t5x_checkpoint(DATA / model / "legacy"))
        orbax = open_t5x_checkpoint(find_t5x_checkpoint(DATA / model / "orbax"))
        assert (legacy.kind, orbax.kind) == ("t5x-legacy", "t5x-orbax")
        assert set(legacy.params) == set(orbax.params) and len(legacy.params) > 40
        # optimizer state never read
        assert not any(p.startswith(("state", "param_states")) for p in legacy.params)
        for name, param in legacy.params.items():
            np.testing.assert_array_equal(param.read(None), orbax.params[name].read(None))
        config = plan_t5x(legacy).config
        expected = json.loads((DATA / model / "hf_config.json").read_text())
        assert {k: config[k] for k in expected} == expected


@pytest.mark.parametrize("fmt", ["legacy", "orbax"])
def test_a_relative_path_through_dotdot_converts_like_the_absolute_one(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """tensorstore refuses non-normalised paths (`Invalid file path`); the reader hands it absolute ones."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    relative = os.path.relpath(DATA / "t5_1_1_tiny" / fmt, tmp_path / "here")
    assert ".." in relative
    via_dots = cli("convert", relative, str(tmp_path / "dots"))
    assert via_dots.code == 0, via_dots.err
    absolute = cli("convert", str(DATA / "t5_1_1_tiny" / fmt), str(tmp_path / "abs"))
    assert absolute.code == 0, absolute.err
    assert (tmp_path / "dots" / "model.safetensors").read_bytes() == (
        tmp_path / "abs" / "model.safetensors"
    ).read_bytes()


def test_step_selection(tmp_path: Path) -> None:
    model_dir = fixture_copy(tmp_path, "t5_1_1_tiny", "legacy")
    shutil.copytree(model_dir / "checkpoint_2", model_dir / "checkpoint_10")
    assert find_t5x_checkpoint(model_dir).name == "checkpoint_10"  # numeric, not lexical
    assert find_t5x_checkpoint(model_dir, step=2).name == "checkpoint_2"
    assert find_t5x_checkpoint(model_dir / "checkpoint_2").name == "checkpoint_2"
    assert find_t5x_checkpoint(model_dir / "checkpoint_2" / "checkpoint").name == "checkpoint_2"
    with pytest.raises(ConvertError, match=r"no T5X checkpoint for step 5 \(have: 2, 10\)"):
        find_t5x_checkpoint(model_dir, step=5)
    assert find_t5x_checkpoint(tmp_path) is None


# ----------------------------------------------------------------------------------------------------------
# errors: named parameter, nothing left behind


def test_missing_parameter_is_named_and_nothing_is_written(cli, tmp_path: Path) -> None:
    model_dir = fixture_copy(tmp_path, "t5_1_1_tiny", "legacy")
    shutil.rmtree(model_dir / "checkpoint_2" / "target.decoder.layers_1.mlp.wo.kernel")
    out = tmp_path / "out"
    result = cli("convert", str(model_dir), str(out))
    assert result.code == 2
    assert "decoder/layers_1/mlp/wo/kernel" in result.err and "missing" in result.err
    assert "Traceback" not in result.err
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_unknown_parameter_is_an_unknown_layout(tmp_path: Path) -> None:
    model_dir = fixture_copy(tmp_path, "t5_1_1_tiny", "orbax")
    ckpt = open_t5x_checkpoint(model_dir / "checkpoint_2")
    extra = ckpt.params["encoder/encoder_norm/scale"]
    ckpt.params["encoder/adapter/kernel"] = extra
    with pytest.raises(ConvertError, match=r"unknown layout: .*encoder/adapter/kernel"):
        plan_t5x(ckpt)


def test_override_that_contradicts_the_shapes_names_the_parameter(cli, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = cli("convert", str(DATA / "t5_1_1_tiny" / "legacy"), str(out), "--hf-set", "d_ff=128")
    assert result.code == 2
    assert "encoder/layers_0/mlp/wi_0/kernel" in result.err and "(32, 64)" in result.err
    assert not out.exists()
    result = cli(
        "convert", str(DATA / "t5_1_1_tiny" / "legacy"), str(out), "--hf-set", "dropout_rate=0.0", "--json"
    )
    assert result.code == 0 and json.loads((out / "config.json").read_text())["dropout_rate"] == 0.0


def test_failure_midway_leaves_the_previous_output_intact(tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = plan_t5x(open_t5x_checkpoint(find_t5x_checkpoint(DATA / "byt5_tiny_asym" / "orbax")))
    write_hf_model(source, out)
    before = sorted(p.name for p in out.iterdir())

    def broken() -> np.ndarray:
        raise ConvertError("parameter decoder/decoder_norm/scale: cannot read (disk error)")

    last = source.tensors[-1]
    source.tensors[-1] = type(last)(last.name, last.shape, last.dtype, broken, last.origin)
    with pytest.raises(ConvertError, match="disk error"):
        write_hf_model(source, out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_bfloat16_output(tmp_path: Path) -> None:
    source = plan_t5x(open_t5x_checkpoint(find_t5x_checkpoint(DATA / "t5_1_1_tiny" / "legacy")))
    result = write_hf_model(source, tmp_path / "bf16", dtype="bfloat16")
    with SafetensorsReader(tmp_path / "bf16" / "model.safetensors") as reader:
        assert {i.dtype for i in reader.tensors.values()} == {"BF16"}
        bits = reader.get("shared.weight")
        back = (bits.astype(np.uint32) << 16).view(np.float32)
    exact = source.tensors[0].load()
    np.testing.assert_allclose(back, exact, rtol=2**-8, atol=1e-30)
    assert result.weight_bytes * 2 == sum(int(np.prod(t.shape)) * 4 for t in source.tensors)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


# ----------------------------------------------------------------------------------------------------------
# hand-built checkpoints: scanned UMT5-style layers (legacy format) and a tied T5 v1.0 (Orbax format)

MAKE_REFERENCES = textwrap.dedent(
    """
    import sys, numpy as np, torch, transformers
    out = sys.argv[1]
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 100, size=(2, 9)); ids[:, -1] = 1; ids[1, 6:] = 0
    dec = rng.integers(2, 100, size=(2, 4)); dec[:, 0] = 0
    def save(model, name):
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids > 0),
                           decoder_input_ids=torch.tensor(dec)).logits.numpy()
        state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        np.savez(f"{out}/{name}.npz", encoder_input_tokens=ids, decoder_input_tokens=dec, logits=logits,
                 **{"param:" + k: v for k, v in state.items()})
    common = dict(vocab_size=100, d_model=16, d_kv=4, d_ff=24, num_heads=4, relative_attention_num_buckets=8,
                  dropout_rate=0.0)
    umt5 = transformers.UMT5ForConditionalGeneration(transformers.UMT5Config(
        num_layers=3, num_decoder_layers=2, feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common))
    # give it a head of its own (transformers 5 builds UMT5 tied; T5X's UMT5 is not) and T5X's logits for it: no
    # d_model**-0.5 rescale before an own head (5.0-5.23 read tie_word_embeddings, which they force to true; 5.24+
    # read scale_decoder_outputs)
    umt5.lm_head.weight = torch.nn.Parameter(torch.randn(100, 16) * 0.5)
    umt5.config.tie_word_embeddings = False
    umt5.config.scale_decoder_outputs = False
    for block in list(umt5.encoder.block) + list(umt5.decoder.block):  # distinct per-layer biases
        torch.nn.init.normal_(block.layer[0].SelfAttention.relative_attention_bias.weight, std=1.0)
    save(umt5, "umt5")
    t5v10 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        num_layers=2, num_decoder_layers=2, feed_forward_proj="relu", tie_word_embeddings=True, **common))
    save(t5v10, "t5v10")
    """  # noqa: E501 (a script run in another interpreter)
)


@pytest.fixture(scope="module")
def references(torch_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("references")
    script = folder / "make.py"
    script.write_text(MAKE_REFERENCES)
    proc = subprocess.run(
        [torch_python, str(script), str(folder)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def _hf_params(npz: Path) -> dict[str, np.ndarray]:
    data = np.load(npz)
    return {k.removeprefix("param:"): data[k] for k in data.files if k.startswith("param:")}


def _t5x_layer(hf: dict[str, np.ndarray], prefix: str, heads: int) -> dict[str, np.ndarray]:
    """One HF block's attention/MLP/norm weights under T5X names, with the heads split like scalable_t5
    does."""
    out: dict[str, np.ndarray] = {}
    d_model = hf[f"{prefix}.layer.0.layer_norm.weight"].shape[0]
    is_decoder = prefix.startswith("decoder")
    attentions = [("0.SelfAttention", "self_attention" if is_decoder else "attention")]
    if is_decoder:
        attentions.append(("1.EncDecAttention", "encoder_decoder_attention"))
    for hf_name, t5x_name in attentions:
        for short, long in (("q", "query"), ("k", "key"), ("v", "value")):
            out[f"{t5x_name}/{long}/kernel"] = hf[f"{prefix}.layer.{hf_name}.{short}.weight"].T.reshape(
                d_model, heads, -1
            )
        out[f"{t5x_name}/out/kernel"] = hf[f"{prefix}.layer.{hf_name}.o.weight"].T.reshape(heads, -1, d_model)
    mlp = 2 if is_decoder else 1
    for n in ("wi_0", "wi_1", "wi"):
        key = f"{prefix}.layer.{mlp}.DenseReluDense.{n}.weight"
        if key in hf:
            out[f"mlp/{n}/kernel"] = hf[key].T
    out["mlp/wo/kernel"] = hf[f"{prefix}.layer.{mlp}.DenseReluDense.wo.weight"].T
    norms = (
        ["pre_self_attention_layer_norm", "pre_cross_attention_layer_norm", "pre_mlp_layer_norm"]
        if is_decoder
        else ["pre_attention_layer_norm", "pre_mlp_layer_norm"]
    )
    for i, name in enumerate(norms):
        out[f"{name}/scale"] = hf[f"{prefix}.layer.{i}.layer_norm.weight"]
    bias = f"{prefix}.layer.0.SelfAttention.relative_attention_bias.weight"
    if bias in hf:
        out["relpos_bias/rel_embedding"] = hf[bias].T
    return out


def scanned_t5x_params(
    hf: dict[str, np.ndarray], heads: int, layers: dict[str, int]
) -> dict[str, np.ndarray]:
    """HF UMT5 weights -> T5X scanned names: one stacked array per kind, the layer axis second."""
    params = {
        "token_embedder/embedding": hf["shared.weight"],
        "decoder/logits_dense/kernel": hf["lm_head.weight"].T,
        "encoder/encoder_norm/scale": hf["encoder.final_layer_norm.weight"],
        "decoder/decoder_norm/scale": hf["decoder.final_layer_norm.weight"],
    }
    for stack, count in layers.items():
        per_layer = [_t5x_layer(hf, f"{stack}.block.{i}", heads) for i in range(count)]
        for name in per_layer[0]:
            params[f"{stack}/{stack}/{name}"] = np.stack([layer[name] for layer in per_layer], axis=1)
    return params


def unscanned_t5x_params(
    hf: dict[str, np.ndarray], heads: int, layers: dict[str, int]
) -> dict[str, np.ndarray]:
    params = {
        "token_embedder/embedding": hf["shared.weight"],
        "encoder/encoder_norm/scale": hf["encoder.final_layer_norm.weight"],
        "decoder/decoder_norm/scale": hf["decoder.final_layer_norm.weight"],
    }
    for stack, count in layers.items():
        for i in range(count):
            layer = _t5x_layer(hf, f"{stack}.block.{i}", heads)
            bias = layer.pop("relpos_bias/rel_embedding", None)
            if bias is not None:
                params[f"{stack}/relpos_bias/rel_embedding"] = bias  # shared, held by layer 0 in HF
            params.update({f"{stack}/layers_{i}/{k}": np.ascontiguousarray(v) for k, v in layer.items()})
    return params


@pytest.mark.slow
def test_scanned_umt5_and_tied_v1_0_round_trip(
    cli, tmp_path: Path, references: Path, torch_python: str
) -> None:
    umt5 = tmp_path / "umt5_model"
    write_legacy(
        umt5 / "checkpoint_7",
        scanned_t5x_params(_hf_params(references / "umt5.npz"), 4, {"encoder": 3, "decoder": 2}),
    )
    (umt5 / "config.gin").write_text(
        "network.T5Config.mlp_activations = ('gelu', 'linear')\nDROPOUT_RATE = 0.0\n"
        "network.T5Config.dropout_rate = %DROPOUT_RATE\n"
    )
    v10 = tmp_path / "v10_model"
    write_orbax(
        v10 / "checkpoint_7",
        unscanned_t5x_params(_hf_params(references / "t5v10.npz"), 4, {"encoder": 2, "decoder": 2}),
    )

    result = cli("convert", str(umt5), str(tmp_path / "umt5_hf"), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert (report["kind"], report["model_type"], report["step"]) == ("t5x-legacy", "umt5", 7)
    config = json.loads((tmp_path / "umt5_hf" / "config.json").read_text())
    assert (
        config["num_layers"],
        config["num_decoder_layers"],
        config["feed_forward_proj"],
        config["dropout_rate"],
    ) == (3, 2, "gated-gelu", 0.0)
    assert config["tie_word_embeddings"] is False

    result = cli("convert", str(v10), str(tmp_path / "v10_hf"), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["kind"] == "t5x-orbax"
    config = json.loads((tmp_path / "v10_hf" / "config.json").read_text())
    # logits through the embedding, rescaled
    assert (config["feed_forward_proj"], config["tie_word_embeddings"]) == (
        "relu",
        True,
    )

    results = check_logits(
        torch_python,
        [
            {"model": str(tmp_path / "umt5_hf"), "reference": str(references / "umt5.npz")},
            {"model": str(tmp_path / "v10_hf"), "reference": str(references / "t5v10.npz")},
        ],
        tmp_path,
    )
    umt5_result, v10_result = results[str(tmp_path / "umt5_hf")], results[str(tmp_path / "v10_hf")]
    assert umt5_result["diff"] < 1e-4 and umt5_result["missing"] == [] and umt5_result["tied"] is False, (
        umt5_result
    )
    assert v10_result["diff"] < 1e-4 and v10_result["missing"] == [] and v10_result["tied"] is True, (
        v10_result
    )
