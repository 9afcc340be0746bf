"""What a backend supports is stated in its own schema module (``CAPABILITIES``) and checked once, in the
recipe's validation: a shared key some backend declares, set on a backend that does not, is a located error
naming the backends that have it; giving a backend the key is one entry in its own file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.conftest import MINIMAL_RECIPE
from tpuft.backends import keras_schema, torch_xla_schema
from tpuft.backends.base import get_backend
from tpuft.backends.registry import capabilities, kinds
from tpuft.config import RecipeConfig, load_recipe
from tpuft.core.errors import ConfigError

KERAS = MINIMAL_RECIPE.replace("kind: torch_xla", "kind: keras").replace("batch_size: 4", "batch_size: 16")


def refused(path: Path, overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()[1:]


def test_every_declared_key_is_a_recipe_key_with_a_default() -> None:
    """A declared key that the recipe does not have would never be checked: each must resolve to a field."""
    for kind, declared in capabilities().items():
        for key in declared.keys:
            model: type = RecipeConfig
            for part in key[:-1]:
                model = model.model_fields[str(part)].annotation  # type: ignore[assignment]
            field = model.model_fields[str(key[-1])]
            assert not field.is_required(), (kind, key)
        assert declared.metrics, kind


def test_the_planner_states_the_same_capabilities_as_its_schema() -> None:
    for kind in kinds():
        assert get_backend(kind).capabilities is capabilities()[kind]


def without(monkeypatch: pytest.MonkeyPatch, key: tuple[str, str], why: str) -> None:
    """The Keras backend as if it could not do ``key``, for ``why``: the refusal's shape, whatever Keras
    implements."""
    less = dataclasses.replace(
        keras_schema.CAPABILITIES,
        keys=keras_schema.CAPABILITIES.keys - {key},
        why_not={**keras_schema.CAPABILITIES.why_not, ".".join(key): why},
    )
    monkeypatch.setattr(keras_schema, "CAPABILITIES", less)


def test_an_unsupported_key_is_located_names_who_supports_it_and_says_why(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without(monkeypatch, ("train", "precision"), "the engine has no bfloat16 here")
    others = sorted(kind for kind, c in capabilities().items() if ("train", "precision") in c.keys)
    who = (
        f"the {others[0]} backend supports it"
        if len(others) == 1
        else f"the {' and '.join(others)} backends support it"
    )
    path = recipe_dir / "r.yaml"
    path.write_text(KERAS.replace("  batch_size: 16\n", "  batch_size: 16\n  precision: bf16\n"))
    (problem,) = refused(path, [])
    assert problem.strip() == (
        f"{path}:11: train.precision: not supported by the keras backend: the engine has no bfloat16 "
        f"here ({who}); remove it"
    )
    path.write_text(KERAS)
    (problem,) = refused(path, ["train.precision=bf16"])
    assert problem.strip().startswith(
        "--set train.precision=bf16: train.precision: not supported by the keras backend"
    )
    assert (
        load_recipe(path, ["train.precision=float32", "data.preprocess=m:f"]).value.data.preprocess == "m:f"
    )


def test_every_refused_key_and_metric_says_why() -> None:
    """A refusal names its reason, and the matrix shows it: every shared key or metric another backend has and
    this one lacks must be in this one's why_not (and nothing there is a key it implements)."""
    every = capabilities()
    keys = set().union(*(c.keys for c in every.values()))
    metrics = set().union(*(c.metrics for c in every.values()))
    for kind, own in every.items():
        lacking = {".".join(map(str, key)) for key in keys - own.keys} | (metrics - own.metrics)
        assert sorted(lacking - set(own.why_not)) == [], f"{kind} refuses these without a reason"
        implemented = {".".join(map(str, key)) for key in own.keys} | own.metrics
        assert sorted(implemented & set(own.why_not)) == [], f"{kind} gives a reason for what it implements"


def test_a_key_several_backends_support_names_them_all(recipe_dir: Path) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(KERAS)
    problems = refused(path, ["train.sharding=fsdp"])
    assert any(
        "train.sharding: not supported by the keras backend" in p
        and p.endswith("(the t5x and torch_xla backends support it); remove it")
        for p in problems
    ), problems


def test_an_unsupported_metric_names_who_computes_it(recipe_dir: Path) -> None:
    path = recipe_dir / "r.yaml"
    path.write_text(MINIMAL_RECIPE)
    problems = refused(path, ["eval.metric=accuracy"])
    assert problems == [
        "  --set eval.metric=accuracy: eval.metric: accuracy is not computed by the torch_xla "
        f"backend: {torch_xla_schema.CAPABILITIES.why_not['accuracy']} (the keras and t5x backends compute "
        "it); use bleu, exact_match, loss, rouge_l, token_accuracy"
    ]


def test_giving_a_backend_a_feature_is_one_entry_in_its_own_file(
    recipe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a one-line edit of ``backends/keras_schema.py``'s CAPABILITIES does: the key is then accepted
    there."""
    path = recipe_dir / "r.yaml"
    path.write_text(KERAS)
    without(monkeypatch, ("train", "label_smoothing"), "no smoothing")
    assert any(
        "train.label_smoothing: not supported by the keras backend: no smoothing" in p
        for p in refused(path, ["train.label_smoothing=0.1"])
    )
    more = dataclasses.replace(
        keras_schema.CAPABILITIES, keys=keras_schema.CAPABILITIES.keys | {("train", "label_smoothing")}
    )
    monkeypatch.setattr(keras_schema, "CAPABILITIES", more)
    assert load_recipe(path, ["train.label_smoothing=0.1"]).value.train.label_smoothing == 0.1
