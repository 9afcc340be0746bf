"""Model shapes from a T5 config (tpuft/model/shapes.py) and ``tpuft recipes show --summary``
(tpuft/model/summary.py).

The fast tests use the analytical shapes; one slow test builds the real Hugging Face models in the PyTorch/XLA
backend's venv and compares every parameter name and shape."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tpuft.model.shapes import (
    KNOWN_CONFIGS,
    architecture,
    count,
    known_config,
    t5_shapes,
    tokenizer_size,
)
from tpuft.model.summary import (
    activation_bytes,
    fmt_bytes,
    module_rows,
    optimizer_bytes,
    trainable_names,
)

REPO = Path(__file__).resolve().parent.parent
GiB = 2**30


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("t5-small", 60_506_624),  # the published counts: 60.5M (tied), 223M, 738M, 2.85B, 11.3B
        ("t5-base", 222_903_552),
        ("t5-large", 737_668_096),
        ("t5-3b", 2_851_598_336),
        ("t5-11b", 11_307_321_344),
        ("google/t5-v1_1-xxl", 11_135_332_352),  # 11.1B
        ("google/mt5-base", 582_401_280),  # 582M
        ("google/mt5-xxl", 12_921_057_280),  # 12.9B
        ("google/byt5-small", 299_637_760),  # 300M
        ("google/byt5-xxl", 12_906_899_328),  # 12.9B
    ],
)
def test_known_models_have_their_published_sizes(name: str, params: int) -> None:
    assert count(t5_shapes(known_config(name))) == params


def test_known_ids_and_aliases() -> None:
    assert known_config("google-t5/t5-11b") == known_config("t5-11b")
    assert known_config("google/t5-v1_1-small")["tie_word_embeddings"] is False
    assert known_config("google/mt5-small")["model_type"] == "mt5"
    assert known_config("google/flan-t5-base") is None
    assert len(KNOWN_CONFIGS) == 20


def test_tokenizer_sizes() -> None:
    from tpuft.model.t5_config import BYT5_VOCAB

    assert tokenizer_size("byt5") == BYT5_VOCAB
    assert tokenizer_size("t5-base") == 32100 and tokenizer_size("google-t5/t5-base") == 32100
    assert tokenizer_size("google/mt5-xl") == 250100 and tokenizer_size("google/byt5-base") == BYT5_VOCAB
    assert tokenizer_size("./my-tokenizer") is None


def test_shapes_follow_the_config() -> None:
    relu = t5_shapes(
        {"vocab_size": 100, "d_model": 16, "d_kv": 4, "num_heads": 2, "d_ff": 32, "num_layers": 2}
    )
    assert relu["shared.weight"] == (100, 16)
    assert relu["encoder.block.0.layer.0.SelfAttention.q.weight"] == (8, 16)
    assert relu["encoder.block.0.layer.0.SelfAttention.o.weight"] == (16, 8)
    assert relu["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] == (32, 2)
    assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in relu
    assert relu["encoder.block.1.layer.1.DenseReluDense.wi.weight"] == (32, 16)
    assert relu["decoder.block.1.layer.1.EncDecAttention.k.weight"] == (8, 16)
    assert relu["decoder.block.1.layer.2.DenseReluDense.wo.weight"] == (16, 32)
    assert "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight" not in relu
    assert "lm_head.weight" not in relu  # tied by default
    assert list(relu)[-1] == "decoder.final_layer_norm.weight"

    gated = t5_shapes(
        {
            "feed_forward_proj": "gated-silu",
            "tie_word_embeddings": False,
            "num_layers": 3,
            "num_decoder_layers": 1,
            "relative_attention_num_buckets": 8,
        }
    )
    assert gated["encoder.block.2.layer.1.DenseReluDense.wi_0.weight"] == (2048, 512)
    assert gated["encoder.block.2.layer.1.DenseReluDense.wi_1.weight"] == (2048, 512)
    assert "encoder.block.2.layer.1.DenseReluDense.wi.weight" not in gated
    assert "decoder.block.1.layer.0.SelfAttention.q.weight" not in gated
    assert gated["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] == (8, 8)
    assert list(gated)[-1] == "lm_head.weight" and gated["lm_head.weight"] == (32128, 512)


def test_architecture_refuses_other_models() -> None:
    with pytest.raises(ValueError, match="model_type 'bert'"):
        architecture({"model_type": "bert", "hidden_size": 768})
    with pytest.raises(ValueError, match="d_model"):
        architecture({"d_model": 0})
    assert architecture({"num_layers": 4})["num_decoder_layers"] == 4


def test_freezing_and_prompt_tuning() -> None:
    shapes = t5_shapes(known_config("google/t5-v1_1-small"))
    everything = trainable_names(shapes, [], False)
    assert everything == set(shapes)
    no_embeddings = trainable_names(shapes, ["embeddings"], False)
    assert set(shapes) - no_embeddings == {"shared.weight", "lm_head.weight"}
    decoder_only = trainable_names(shapes, ["embeddings", "encoder"], False)
    assert decoder_only == {n for n in shapes if n.startswith("decoder.")}
    assert "decoder.final_layer_norm.weight" in decoder_only

    shapes["prompt.weight"] = (20, 512)
    prompt_only = trainable_names(shapes, ["decoder"], True)
    assert prompt_only == {"prompt.weight"}
    rows = {r.module: r for r in module_rows(shapes, prompt_only, tied=False)}
    assert rows["prompt"].params == rows["prompt"].trainable == 20 * 512
    assert rows["encoder"].trainable == 0 and rows["lm_head"].params == 32128 * 512

    tied = {r.module: r for r in module_rows(t5_shapes(known_config("t5-small")), set(), tied=True)}
    assert tied["lm_head"].params == 0 and "tied" in tied["lm_head"].note


def test_optimizer_state() -> None:
    from tpuft.model.fsdp_plan import plan

    layout = plan({"w": (1024, 4096), "v": (1024,)}, 8)
    w, v = layout.params["w"], layout.params["v"]
    assert w.local_shape == (1024, 512) and v.local_shape == (1024,)
    assert optimizer_bytes(w, "adamw", None) == 2 * 1024 * 512 * 4
    assert optimizer_bytes(w, "adafactor", None) == (1024 + 512) * 4  # factored: rows + columns of the shard
    assert optimizer_bytes(w, "adafactor", 0.9) == (1024 + 512) * 4 + 1024 * 512 * 4  # + the first moment
    assert optimizer_bytes(v, "adafactor", None) == 1024 * 4  # a vector: its full second moment


def test_activation_estimate_moves_the_right_way() -> None:
    config = architecture(known_config("t5-base"))
    full = activation_bytes(config, 512, 128, "float32", False)
    assert activation_bytes(config, 512, 128, "bf16", False) < full
    assert activation_bytes(config, 512, 128, "float32", True) < full / 4
    assert activation_bytes(config, 1024, 128, "float32", False) > full
    assert 0.5 * GiB < full < 4 * GiB  # t5-base at 512 tokens: on the order of a GiB per example


def test_fmt_bytes() -> None:
    assert (fmt_bytes(32 * GiB), fmt_bytes(1.5 * GiB), fmt_bytes(512), fmt_bytes(-3 * 2**20)) == (
        "32 GiB",
        "1.50 GiB",
        "512 B",
        "-3 MiB",
    )


# ----------------------------------------------------------------------------------------------------------
# The command


RECIPE = """\
name: sum
backend:
  kind: torch_xla
model:
  name_or_path: {model}
data:
  train: train.jsonl
train:
  steps: 10
  batch_size: 64
"""


def write(tmp_path: Path, model: str = "google/mt5-base", text: str = RECIPE) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text.format(model=model))
    return path


def test_summary_table(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "recipes",
        "show",
        "--summary",
        str(write(tmp_path)),
        "--accelerator",
        "v4-8",
        "--set",
        "model.freeze=[embeddings]",
    )
    assert result.code == 0, result.err
    out = result.out
    assert "google/mt5-base (known config)" in out and "vocab 250112, separate lm_head" in out
    assert "582,401,280" in out and "198,229,248" in out  # total; trainable: encoder + decoder
    assert "Memory per chip: v4-8, 4 chips of 32 GiB HBM; sharding data, adafactor, float32" in out
    assert "fits" in out and "gradient_checkpointing: true" in out


def test_summary_json_and_the_cluster_file(cli, tmp_path: Path, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "recipes",
        "show",
        "--summary",
        str(write(tmp_path)),
        "--json",
        "--config",
        str(cluster_file),
        "--set",
        "train.sharding=fsdp",
        "--set",
        "train.optimizer=adamw",
    )
    assert result.code == 0, result.err
    found = json.loads(result.out)
    # the local cluster's accelerator: 8 chips
    assert found["accelerator"] == "v4-16" and found["devices"] == 8
    assert found["parameters"]["total"] == 582_401_280 == found["parameters"]["trainable"]
    assert found["training"]["sharding"] == "fsdp" and found["training"]["examples_per_device"] == 8
    memory = found["memory_per_device"]
    assert memory["optimizer"]["bytes"] == 2 * memory["weights"]["bytes"]
    assert found["sharding_plan"]["mesh_size"] == 8
    assert found["total_bytes_per_device"] == sum(row["bytes"] for row in memory.values())
    assert found["fits"] is (found["margin_bytes"] >= 0)


def test_a_local_folder_and_random_init(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "t5",
                "d_model": 64,
                "d_kv": 16,
                "num_heads": 4,
                "d_ff": 128,
                "num_layers": 2,
                "vocab_size": 1000,
            }
        )
    )
    result = cli("recipes", "show", "--summary", str(write(tmp_path, "./my-model")), "--json")
    assert result.code == 0, result.err
    found = json.loads(result.out)
    assert found["model"]["origin"] == str(folder / "config.json")
    assert found["parameters"]["total"] == count(t5_shapes(json.loads((folder / "config.json").read_text())))

    result = cli("recipes", "show", "--summary", "quickstart", "--json")  # random init, the byt5 tokenizer
    assert result.code == 0, result.err
    found = json.loads(result.out)
    assert found["model"]["origin"] == "model.config" and found["model"]["config"]["vocab_size"] == 384


def test_prompt_tuning_trains_the_prompt_only(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "recipes",
        "show",
        "--summary",
        str(write(tmp_path, "t5-small")),
        "--json",
        "--set",
        "model.prompt_tuning={tokens: 20}",
    )
    assert result.code == 0, result.err
    found = json.loads(result.out)
    assert found["parameters"]["trainable"] == 20 * 512
    assert found["parameters"]["total"] == 60_506_624 + 20 * 512
    assert found["training"]["source_len"] == 128 + 20


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--set", "model.name_or_path=someone/t5-custom"],
            "neither a local folder nor a model the summary knows",
        ),
        (["--set", "model.name_or_path=./missing"], "folder not found"),
        (["--accelerator", "v4-30"], "unknown accelerator type 'v4-30'"),
        (["--set", "train.steps=0"], "train.steps"),
    ],
)
def test_bad_input_is_exit_2(cli, tmp_path: Path, args: list[str], expected: str) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "--summary", str(write(tmp_path)), *args)
    assert result.code == 2, (result.out, result.err)
    assert expected in result.err


def test_an_unknown_model_says_what_the_summary_needs(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "--summary", str(write(tmp_path, "someone/t5-custom")))
    assert result.code == 2
    assert "r.yaml:5: model.name_or_path:" in result.err  # located at the key to change
    assert "needs the model's config" in result.err and "t5-11b" in result.err


def test_summary_options_need_summary(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "quickstart", "--json")
    assert (
        result.code == 2 and "--json only goes with --summary" in result.out + result.err
    )  # --json: as JSON
    # every problem at once, and the hint is a command that runs: the type's nearest valid one
    sized = cli("recipes", "show", "quickstart", "-a", "v5e-9", "-s", "train.steps=3")
    assert sized.code == 2 and "--set, --accelerator only go with --summary" in sized.err
    assert "--accelerator: unknown accelerator type 'v5e-9'. Did you mean v5e-8 or v5e-16?" in sized.err
    assert "tpuft recipes show quickstart --summary --set train.steps=3 --accelerator v5e-8" in sized.err
    summary = cli("recipes", "show", "quickstart", "--summary", "-a", "v5e-9")
    assert summary.code == 2 and "Did you mean v5e-8 or v5e-16?" in summary.err
    plain = cli("recipes", "show", "quickstart")
    assert plain.code == 0 and plain.out.startswith("#")


def test_an_encoder_classifier_counts_embeddings_layers_pooler_and_head(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "--summary", "sst2_bert_base_keras", "--json")
    assert result.code == 0, result.err
    found = json.loads(result.out)
    modules = {row["module"]: row["params"] for row in found["parameters"]["modules"]}
    assert modules["classifier"] == 768 * 2 + 2 and modules["pooler"] == 768 * 768 + 768
    # BertModel's published 109.5M + the head
    assert found["parameters"]["total"] == 109_482_240 + 768 * 2 + 2
    assert found["model"]["config"]["num_labels"] == 2 and found["training"]["target_len"] == 0


def test_encoders_the_summary_cannot_count_are_refused_at_their_key(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = (REPO / "tpuft" / "recipes" / "keras_classification_quickstart.yaml").read_text()
    path = tmp_path / "c.yaml"
    path.write_text(
        source.replace("model_type: bert", "model_type: roberta").replace(
            "data/", str(REPO / "tpuft" / "recipes" / "data") + "/"
        )
    )
    result = cli("recipes", "show", "--summary", str(path))
    assert result.code == 2 and "backend.encoder.model_type:" in result.err
    assert "cannot size this encoder: model_type 'roberta'" in result.err


T5X_SMALL = {
    "vocab_size": 384,
    "d_model": 128,
    "d_kv": 32,
    "num_heads": 4,
    "d_ff": 256,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False,
}


def test_t5x_gin_overrides_resize_the_family_model() -> None:
    from tpuft.model.gin_network import family_hub_id, network_config

    small = known_config(family_hub_id("byt5", "small"))
    overrides = {
        "network.T5Config.emb_dim": 128,
        "network.T5Config.num_heads": 4,
        "T5Config.head_dim": 32,
        "network.T5Config.mlp_dim": 256,
        "network.T5Config.num_encoder_layers": 2,
        "network.T5Config.num_decoder_layers": 2,
        "network.T5Config.dropout_rate": 0.0,
        "TRAIN_STEPS": 10,
        "utils.SaveCheckpointConfig.period": 5,
        "train/utils.DatasetConfig.seed": 3,
    }
    assert (
        count(t5_shapes(network_config("byt5", "small", small, overrides)))
        == count(t5_shapes(T5X_SMALL))
        == 886_528
    )
    relu = network_config(
        "t5_1_1",
        "tiny",
        None,
        {"network.T5Config.mlp_activations": ["relu"], "network.T5Config.logits_via_embedding": True},
    )
    assert relu["feed_forward_proj"] == "relu" and relu["tie_word_embeddings"] and relu["d_model"] == 8
    assert family_hub_id("t5_1_0", "xxl") == "t5-11b" and family_hub_id("umt5", "base") is None


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("network.T5Config.emb_dim", "%EMB_DIM", "not a positive whole number"),
        ("network.T5Config.num_experts", 8, "no field 'num_experts'"),
        ("encoder/network.T5Config.num_heads", 2, "scoped binding"),
        ("network.Transformer.config", "@my.Config()", "builds the network"),
        ("models.EncoderDecoderModel.module", "@my.Net()", "builds the network"),
        ("MODEL", "@my.Model()", "MODEL rebound"),
        ("network", {"T5Config": {"emb_dim": 8}}, "neither a MACRO"),
        ("network.T5Config.mlp_activations", ["gelu", "linear", "relu"], "one activation"),
    ],
)
def test_a_binding_the_summary_cannot_read_says_so(cli, key: str, value: object, reason: str) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "recipes",
        "show",
        "--summary",
        "t5x_quickstart",
        "--set",
        f"backend.gin_overrides={json.dumps({key: value})}",
    )
    assert result.code == 2, result.out
    assert (
        f"backend.gin_overrides.{key}: the summary cannot size this model" in result.err
        and reason in result.err
    )


SHIPPED_SIZES: dict[str, int | str] = {
    # BERT 128 x 2 layers over ByT5's 384 ids, 256 positions, 2 labels
    "keras_classification_quickstart": 364_162,
    "keras_quickstart": 837_376,
    "quickstart": 837_376,
    "question_quality_t5_base_keras": 222_903_552,  # t5-base: 222.9M
    "ro_diacritics_mt5_base": "so its size is unknown",  # a hub model the summary does not know offline
    "ro_mt5x_base_pretrain": 582_401_280,  # mT5 base: 582M
    "ro_t5x_base_pretrain": 247_577_856 + 2 * (64128 - 32128) * 768,  # T5 v1.1 base 247.6M, vocab 64,128
    "sst2_bert_base_keras": 109_482_240 + 2 * 768 + 2,  # bert-base 109.5M + a 2-label head
    "sst2_bert_large_keras": 335_141_888 + 2 * 1024 + 2,  # bert-large 335.1M + a 2-label head
    "sst2_t5_base_keras": 222_903_552,
    "sst2_t5_small_keras": 60_506_624,  # t5-small: 60.5M
    "t2t_translation": 60_506_624,
    "t5_11b_fsdp": 11_307_321_344,  # t5-11b: 11.3B
    # byt5 small resized by its gin_overrides (the T5X e2e test counts the checkpoint)
    "t5x_quickstart": 886_528,
    "t5x_span_corruption": 886_528,
}


def test_every_shipped_recipe_is_sized_right_or_says_it_cannot() -> None:
    from tpuft.core.errors import ConfigError
    from tpuft.core.paths import recipes_dir
    from tpuft.ops.recipes import summary

    shipped = sorted(p.stem for p in recipes_dir().glob("*.yaml"))
    assert shipped == sorted(SHIPPED_SIZES)
    for name in shipped:
        expected = SHIPPED_SIZES[name]
        if isinstance(expected, int):
            found = summary(recipes_dir() / f"{name}.yaml", accelerator="v4-8")
            assert found.total_params == expected, name
        else:
            with pytest.raises(ConfigError, match=expected):
                summary(recipes_dir() / f"{name}.yaml", accelerator="v4-8")


# ----------------------------------------------------------------------------------------------------------
# The real model

REAL_SHAPES = r"""
import json, os, sys, tempfile

import torch
import transformers
from transformers import MT5Config, MT5ForConditionalGeneration, T5Config, T5ForConditionalGeneration


def build(cfg):
    model_type = cfg.pop("model_type", "t5")
    Config, Model = (MT5Config, MT5ForConditionalGeneration) if model_type == "mt5" else (T5Config, T5ForConditionalGeneration)
    model = Model(Config(**cfg))
    if cfg.get("tie_word_embeddings", True) is False and model.lm_head.weight is model.shared.weight:
        # transformers 5 builds every fresh T5 tied; a checkpoint with its own lm_head (T5 v1.1, mT5, ByT5) loads
        # untied. Load one, as from_pretrained("google/t5-v1_1-base") does.
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory() as folder:
            state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
            state["lm_head.weight"] = torch.randn_like(state["shared.weight"])
            save_file(state, os.path.join(folder, "model.safetensors"))
            config = model.config.to_dict()
            config["tie_word_embeddings"] = False
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(config, f)
            model = Model.from_pretrained(folder)
    return {name: list(p.shape) for name, p in model.named_parameters()}


configs = json.loads(sys.argv[1])
print(json.dumps({"version": transformers.__version__, "shapes": [build(dict(c)) for c in configs]}))
"""  # noqa: E501 (a script run in another interpreter)

TINY_CONFIGS = [
    {
        "vocab_size": 64,
        "d_model": 16,
        "d_kv": 4,
        "num_heads": 4,
        "d_ff": 32,
        "num_layers": 2,
    },  # T5 v1.0: tied, relu
    {
        "vocab_size": 64,
        "d_model": 16,
        "d_kv": 4,
        "num_heads": 2,
        "d_ff": 24,
        "num_layers": 3,
        "num_decoder_layers": 1,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    },  # v1.1 / ByT5 shape: untied, gated, shallower decoder
    {
        "vocab_size": 50,
        "d_model": 10,
        "d_kv": 3,
        "num_heads": 4,
        "d_ff": 20,
        "num_layers": 1,
        "num_decoder_layers": 3,
        "feed_forward_proj": "gated-silu",
        "relative_attention_num_buckets": 8,
    },  # inner 12 != d_model
    {
        "model_type": "mt5",
        "vocab_size": 96,
        "d_model": 8,
        "d_kv": 4,
        "num_heads": 2,
        "d_ff": 16,
        "num_layers": 2,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    },
]


@pytest.mark.slow
def test_shapes_match_the_real_models(torch_python: str) -> None:
    proc = subprocess.run(
        [torch_python, "-c", REAL_SHAPES, json.dumps(TINY_CONFIGS)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for config, real in zip(TINY_CONFIGS, found["shapes"]):
        expected = {name: list(shape) for name, shape in t5_shapes(config).items()}
        assert list(real) == list(expected), (found["version"], config)  # the same names, in the same order
        assert real == expected, (found["version"], config)
