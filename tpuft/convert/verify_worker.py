"""Runs inside a Python with torch + transformers (see :mod:`tpuft.convert.verify`); prints one JSON line.

Loads the converted dir with ``output_loading_info`` (so a weight the model did not take, or one it had to
initialise, is reported rather than silently random), runs one forward pass on fixed token ids, and compares
the logits with the source model where its framework is importable here: the torch checkpoint itself, or the
TF model of a Keras checkpoint when TensorFlow is installed. T5X's own framework (JAX + t5x) is not expected
here; tpuft's golden tests compare T5X conversions with T5X's logits instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

import numpy as np


def _inputs(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(2, min(vocab, 1000), size=(2, 11))
    ids[:, -1] = 1  # EOS
    mask = np.ones_like(ids)
    ids[1, 8:], mask[1, 8:] = 0, 0  # a padded row
    decoder = rng.integers(2, min(vocab, 1000), size=(2, 5))
    decoder[:, 0] = 0  # decoder start
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder}


def _model_class(transformers: Any, config: Any, framework_prefix: str = "") -> Any:
    names = list(getattr(config, "architectures", None) or []) or ["T5ForConditionalGeneration"]
    return getattr(transformers, framework_prefix + names[0].removeprefix("TF"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--source-kind", required=True)
    args = parser.parse_args(argv)

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(args.model)
    cls = _model_class(transformers, config)
    model, info = cls.from_pretrained(args.model, output_loading_info=True, dtype=torch.float32)
    model.eval()
    inputs = _inputs(config.vocab_size)
    with torch.no_grad():
        logits = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.float().numpy()
    report: dict[str, Any] = {
        "model_class": cls.__name__,
        "transformers": transformers.__version__,
        "missing": sorted(info.get("missing_keys", [])),
        "unexpected": sorted(info.get("unexpected_keys", [])),
        "mismatched": [list(map(str, m)) for m in info.get("mismatched_keys", [])],
        "logits_shape": list(logits.shape),
        "finite": bool(np.isfinite(logits).all()),
        "compared_with": None,
        "max_abs_diff": None,
    }
    reference, label, reason = _source_logits(args.source_kind, args.source, inputs, transformers, torch)
    if reference is not None:
        report["compared_with"] = label
        report["max_abs_diff"] = float(np.abs(reference - logits).max())
    else:
        report["not_compared"] = reason
    print(json.dumps(report), flush=True)
    return 0


def _source_logits(
    kind: str, source: str, inputs: dict[str, np.ndarray], transformers: Any, torch: Any
) -> tuple[np.ndarray | None, str, str]:
    if kind == "torch":
        config = transformers.AutoConfig.from_pretrained(source)
        model = _model_class(transformers, config).from_pretrained(source, dtype=torch.float32).eval()
        with torch.no_grad():
            return (
                model(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits.float().numpy(),
                "the torch checkpoint",
                "",
            )
    if kind.startswith("keras"):
        try:
            importlib.import_module("tensorflow")
            config = transformers.AutoConfig.from_pretrained(source)
            tf_class = _model_class(transformers, config, framework_prefix="TF")
        except (ImportError, AttributeError):
            return None, "", "TensorFlow (with transformers 4.x TF models) is not importable in this Python"
        tf_model = tf_class.from_pretrained(source)
        return tf_model(**inputs).logits.numpy(), "the TF model (transformers TF)", ""
    return (
        None,
        "",
        "T5X (JAX + t5x) is not importable here; the golden tests compare T5X conversions with T5X's own "
        "logits",
    )


if __name__ == "__main__":
    sys.exit(main())
