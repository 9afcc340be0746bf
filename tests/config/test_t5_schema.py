"""tpuft's own T5 schema (tpuft/model/t5_config.py) against the T5Config of the transformers that the backends
install: the same fields and defaults, the same activation functions. If transformers adds, drops or renames a
key, this fails, and the schema is updated instead of silently refusing a valid key or accepting a dead
one."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from tpuft.model.t5_config import ACTIVATIONS, GENERAL_KEYS, TRANSFORMERS_DEFAULTS, T5Settings

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    """
    import inspect, json
    import transformers
    from transformers import T5Config
    try:
        from transformers.activations import ACT2FN
    except ImportError:  # a TensorFlow-only stack (transformers 4): the TF activations
        from transformers.activations_tf import ACT2FN
    base = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig
    own = inspect.signature(T5Config.__init__).parameters
    inherited = inspect.signature(base.__init__).parameters
    fields = {}
    for name, param in own.items():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL) or name == "self":
            continue
        if name not in inherited or inherited[name].default != param.default:
            fields[name] = param.default
    general = {}
    for key, value in {"tie_word_embeddings": False, "decoder_start_token_id": 5}.items():
        config = T5Config(**{key: value})
        general[key] = key in config.to_dict() or hasattr(config, key)
    typo = T5Config(d_modle=128)  # what the schema protects against: kept silently, the model stays 512 wide
    print(json.dumps({"version": transformers.__version__, "fields": fields, "activations": sorted(ACT2FN),
                      "general": general, "typo_kept": getattr(typo, "d_modle", None), "d_model": typo.d_model}))
    """  # noqa: E501 (a script run in another interpreter)
)


def probe(python: str) -> dict:
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_fields(found: dict, *, inherited: tuple[str, ...] = ()) -> None:
    """``inherited``: fields that this transformers keeps on its base config instead of T5Config's own
    signature."""
    expected = {key: value for key, value in TRANSFORMERS_DEFAULTS.items() if key not in inherited}
    assert found["fields"] == expected, found["version"]
    schema_keys = set(T5Settings.model_fields)
    assert schema_keys == set(TRANSFORMERS_DEFAULTS) | set(GENERAL_KEYS)
    assert all(found["general"].values()), found["general"]
    assert (found["typo_kept"], found["d_model"]) == (128, 512)


def test_schema_matches_the_torch_backends_transformers(torch_python: str) -> None:
    found = probe(torch_python)
    check_fields(found)
    assert tuple(found["activations"]) == ACTIVATIONS, found["version"]


def test_schema_matches_transformers_4_of_the_keras_stack(keras_python: str) -> None:
    found = probe(keras_python)
    check_fields(found, inherited=("is_decoder",))  # 4.x: a PretrainedConfig keyword, same default
    missing = set(ACTIVATIONS) - set(found["activations"])
    print(f"\ntransformers {found['version']} lacks these activations of 5.x: {sorted(missing)}")
