"""``tpuft convert --verify``: load the written model with transformers, run it, and compare with the source.

The CLI never imports torch, so the check runs in a Python that has torch and transformers: the one given with
``--verify-python``, this one if it has both, or the PyTorch/XLA backend venv that ``tpuft setup`` cached on
this machine. The worker (:mod:`tpuft.convert.verify_worker`) reports as JSON; a model that loads with missing
or unexpected weights, gives non-finite logits, or differs from the source beyond the tolerance fails the
command.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tpuft.convert.model_source import ConvertError, ModelSource
from tpuft.core.paths import environ_with_package, venv_cache

TOLERANCE = {"float32": 1e-4, "bfloat16": None}
"""Max |logit diff| against the source; bfloat16 output is reported, not judged (it rounds every weight)."""


def find_verify_python(explicit: str | None) -> str:
    if explicit:
        if not Path(explicit).exists():
            raise ConvertError(f"--verify-python {explicit}: no such file")
        return explicit
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return sys.executable
    cache = venv_cache()
    candidates = (
        sorted(cache.glob("torch_xla-*/.tpuft-complete"), key=lambda p: p.stat().st_mtime, reverse=True)
        if cache.is_dir()
        else []
    )
    for marker in candidates:
        python = marker.parent / "bin" / "python"
        if python.exists():
            return str(python)
    raise ConvertError(
        "--verify needs a Python with torch and transformers: pass --verify-python PATH, install them here, "
        f"or build the PyTorch/XLA venv once with `tpuft setup quickstart` (looked in {cache})"
    )


def verify_model(source: ModelSource, out_dir: Path, *, python: str | None = None) -> dict[str, Any]:
    interpreter = find_verify_python(python)
    argv = [
        interpreter,
        "-m",
        "tpuft.convert.verify_worker",
        "--model",
        str(out_dir),
        "--source-kind",
        source.kind,
        "--source",
        str(source.path),
    ]
    env = environ_with_package()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ConvertError(
            f"--verify: loading the converted model with transformers failed ({interpreter}), so nothing was "
            f"written:\n{tail}"
        )
    report: dict[str, Any] = json.loads(lines[-1])
    report["python"] = interpreter
    problems = []
    if report.get("missing") or report.get("unexpected") or report.get("mismatched"):
        problems.append(
            f"weights that do not fit the model: missing {report.get('missing')}, "
            f"unexpected {report.get('unexpected')}, mismatched {report.get('mismatched')}"
        )
    if not report.get("finite", False):
        problems.append("the logits are not all finite")
    limit = TOLERANCE.get(json.loads((out_dir / "config.json").read_text()).get("dtype", "float32"))
    diff = report.get("max_abs_diff")
    if limit is not None and diff is not None and diff > limit:
        problems.append(f"max |logit diff| against the source is {diff:.3g} (tolerance {limit:g})")
    report["ok"] = not problems
    if problems:
        raise ConvertError("--verify failed, so nothing was written: " + "; ".join(problems))
    return report
