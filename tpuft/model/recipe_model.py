"""Which model a recipe trains, offline, for the summary: its architecture from a known hub id, a local
folder's config.json, the recipe's ``model.config`` (random init), a T5X family and size with the
``T5Config`` bindings of ``gin_overrides`` (:mod:`tpuft.model.gin_network`), or a BERT classifier's encoder
(``backend.encoder``, or a pretrained checkpoint's config). A model it cannot tell is a :class:`ModelUnknown`
located at the recipe key to change, never the size of another model.

Apart from :mod:`tpuft.model.summary` because it is about finding the architecture (the recipe's keys, this
machine's folders and files), not about counting it: the summary takes the :class:`ModelSource` and works out
parameters and memory from it alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpuft.core.errors import UsageError
from tpuft.model import gin_network
from tpuft.model import shapes as model_shapes

if TYPE_CHECKING:
    from tpuft.config import KeyPath, RecipeConfig

CONFIG_JSON_MAX_BYTES = 1 << 20


class ModelUnknown(UsageError):
    """The summary cannot tell the model's architecture; ``path`` is the recipe key to change."""

    def __init__(self, path: KeyPath, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


@dataclass
class ModelSource:
    name: str
    """What the recipe names: a hub id, a folder, ``random init``, or a T5X family and size."""
    origin: str
    """Where the architecture came from, for people: ``known config``, a config.json path,
    ``model.config``."""
    config: dict[str, Any]
    """The architecture keys (:func:`tpuft.model.shapes.architecture`, or ``encoder_architecture`` +
    num_labels)."""
    kind: str = "t5"
    """``t5`` (an encoder-decoder) or ``bert`` (an encoder with a classification head)."""

    def describe(self) -> str:
        c = self.config
        if self.kind == "bert":
            return (
                f"BERT encoder: hidden {c['hidden_size']}, {c['num_hidden_layers']} "
                f"layers, {c['num_attention_heads']} heads, intermediate {c['intermediate_size']}, "
                f"vocab {c['vocab_size']}, {c['max_position_embeddings']} positions; pooler and "
                f"a {c['num_labels']}-label classifier head"
            )
        ff = f"{c['feed_forward_proj']} d_ff {c['d_ff']}"
        tied = "tied output layer" if c["tie_word_embeddings"] else "separate lm_head"
        return (
            f"d_model {c['d_model']}, {c['num_layers']}+{c['num_decoder_layers']} layers, {ff}, "
            f"{c['num_heads']} heads x {c['d_kv']}, vocab {c['vocab_size']}, {tied}"
        )


def resolve_model(recipe: RecipeConfig, recipe_dir: Path | None = None) -> ModelSource:
    """The recipe's model architecture, offline; :class:`ModelUnknown` (exit 2) when only the hub could
    tell."""
    backend = recipe.backend
    if getattr(backend, "task", None) == "classification":
        return _encoder_model(recipe, recipe_dir)
    model = recipe.model
    if model.name_or_path is None and model.config is None and hasattr(backend, "family"):
        return _gin_model(recipe)
    if model.config is not None:
        settings = model.config.kwargs()
        vocab = settings.get("vocab_size") or model_shapes.tokenizer_size(model.tokenizer)
        if vocab is None:
            raise ModelUnknown(
                ("model", "config", "vocab_size"),
                f"a random-init model takes its vocabulary size from the tokenizer {model.tokenizer!r}, "
                "which the summary cannot load offline: set model.config.vocab_size",
            )
        config = {**settings, "vocab_size": vocab}
        return ModelSource("random init", "model.config", _architecture(config, ("model", "config")))
    if model.name_or_path is None:
        raise ModelUnknown(("model",), "the recipe names no model: give model.name_or_path or model.config")
    name = model.name_or_path
    folder = _local_folder(name, recipe_dir)
    if folder is not None:
        path = _config_json(folder)
        return ModelSource(name, str(path), _architecture(_read_config(path), ("model", "name_or_path")))
    known = model_shapes.known_config(name)
    if known is None:
        raise ModelUnknown(
            ("model", "name_or_path"),
            f"{name!r} is neither a local folder nor a model the summary knows offline, so its size is "
            "unknown",
            hint="The summary needs the model's config: download the model to a folder (config.json is "
            "enough) and "
            f"--set model.name_or_path=FOLDER, or use one of: {', '.join(model_shapes.KNOWN_CONFIGS)}",
        )
    return ModelSource(name, "known config", _architecture(known, ("model", "name_or_path")))


def _gin_model(recipe: RecipeConfig) -> ModelSource:
    """The network the generated gin builds: the example gin of ``backend.family`` + ``backend.size``, then
    the ``T5Config`` bindings of ``backend.gin_overrides`` (:mod:`tpuft.model.gin_network`)."""
    backend: Any = recipe.backend
    family, size = getattr(backend, "family", None), getattr(backend, "size", None)
    if family is None or size is None:
        raise ModelUnknown(
            ("backend", "gin_files"),
            "the summary cannot size a model of your own gin files: it knows "
            "the models named by backend.family and backend.size",
        )
    overrides = dict(getattr(backend, "gin_overrides", None) or {})
    hub_id = gin_network.family_hub_id(family, size)
    known = model_shapes.known_config(hub_id) if hub_id else None
    try:
        config = gin_network.network_config(family, size, known, overrides)
    except gin_network.GinUnreadable as exc:
        where: KeyPath = ("backend", "gin_overrides", exc.key) if exc.key else ("backend", "family")
        raise ModelUnknown(where, f"the summary cannot size this model: {exc}") from None
    changed = [key for key in overrides if gin_network.binding_effect(key, overrides[key])]
    origin = f"T5X's {family}/{size}.gin" + (f" + {len(changed)} gin_overrides" if changed else "")
    return ModelSource(f"{family} {size}", origin, _architecture(config, ("backend", "gin_overrides")))


def _encoder_model(recipe: RecipeConfig, recipe_dir: Path | None) -> ModelSource:
    """An encoder classifier (``backend.task: classification``): a BERT from ``backend.encoder`` (random init,
    the tokenizer's length as its vocabulary, as the trainer builds it) or from a pretrained checkpoint's
    config."""
    backend: Any = recipe.backend
    labels = len(recipe.data.labels or ())
    encoder, model = getattr(backend, "encoder", None), recipe.model
    if encoder is not None:
        vocab = model_shapes.tokenizer_size(model.tokenizer)
        if vocab is None:
            raise ModelUnknown(
                ("model", "tokenizer"),
                f"a random-init encoder takes its vocabulary size from the "
                f"tokenizer {model.tokenizer!r}, which the summary cannot load offline",
            )
        name, origin, config, where = (
            "random init",
            "backend.encoder",
            {**encoder, "vocab_size": vocab},
            ("backend", "encoder"),
        )
    elif model.name_or_path is not None:
        name, where = model.name_or_path, ("model", "name_or_path")
        folder = _local_folder(name, recipe_dir)
        known = model_shapes.known_encoder(name)
        if folder is not None:
            origin = str(_config_json(folder))
            config = _read_config(Path(origin))
        elif known is not None:
            origin, config = "known config", known
        else:
            raise ModelUnknown(
                where,
                f"{name!r} is neither a local folder nor an encoder the summary knows offline, "
                "so its size is unknown",
                hint="Known encoders: " + ", ".join(model_shapes.KNOWN_ENCODERS),
            )
    else:
        raise ModelUnknown(
            ("model",), "the recipe names no encoder: give model.name_or_path or backend.encoder"
        )
    try:
        arch = model_shapes.encoder_architecture(config)
    except ValueError as exc:
        if encoder is not None and str(exc).startswith("model_type"):
            where = ("backend", "encoder", "model_type")
        raise ModelUnknown(where, f"the summary cannot size this encoder: {exc}") from None
    return ModelSource(name, origin, {**arch, "num_labels": labels}, kind="bert")


def _config_json(folder: Path) -> Path:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelUnknown(
            ("model", "name_or_path"),
            f"{folder} has no config.json: the summary reads the model's architecture from it",
        )
    return path


def _local_folder(name: str, recipe_dir: Path | None) -> Path | None:
    """The folder ``name`` means on this machine, if there is one (transformers looks for a folder first
    too)."""
    path = Path(os.path.expanduser(name))
    candidates = (
        [path] if path.is_absolute() else [*([recipe_dir / path] if recipe_dir else []), Path.cwd() / path]
    )
    found = next((c for c in candidates if c.is_dir()), None)
    if found is None and name.startswith((".", "/", "~")):
        raise ModelUnknown(("model", "name_or_path"), f"folder not found: {candidates[0]}")
    return found


def _read_config(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > CONFIG_JSON_MAX_BYTES:
            raise ValueError(f"larger than {CONFIG_JSON_MAX_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelUnknown(("model", "name_or_path"), f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelUnknown(("model", "name_or_path"), f"{path} is not a JSON object")
    return data


def _architecture(config: dict[str, Any], where: KeyPath) -> dict[str, Any]:
    try:
        return model_shapes.architecture(config)
    except ValueError as exc:
        raise ModelUnknown(where, f"not a T5 model the summary can size: {exc}") from None
