"""convert: a training checkpoint (T5X, torch, Keras) -> a Hugging Face model directory, local or in a
bucket."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.config import ClusterConfig
from tpuft.convert.hf_writer import ExportResult, Progress, parse_size, write_hf_model
from tpuft.convert.model_source import ConvertError
from tpuft.core.errors import UsageError
from tpuft.run import rundir


@dataclass
class ConvertReport:
    result: ExportResult
    source: str
    """What the user named (a path or a gs:// URL)."""
    out: str
    step: int | None
    verify: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "source": self.source,
            "checkpoint": str(r.checkpoint),
            "kind": r.kind,
            "step": self.step,
            "out": self.out,
            "tensors": r.tensors,
            "weight_bytes": r.weight_bytes,
            "shards": r.shards,
            "dtype": r.dtype,
            "model_type": r.config.get("model_type"),
            "notes": list(r.notes),
            "verify": self.verify,
        }


def parse_overrides(pairs: list[str], config_file: Path | None) -> dict[str, Any]:
    """``--hf-config FILE`` then ``--hf-set KEY=VALUE`` (VALUE read as JSON when it parses, else as a
    string)."""
    overrides: dict[str, Any] = {}
    if config_file is not None:
        from tpuft.core.safe_yaml import YamlProblem, read_config_text

        try:
            loaded = json.loads(read_config_text(config_file, "file"))  # a regular file of at most 1 MiB
        except YamlProblem as exc:
            raise UsageError(f"--hf-config {config_file}: {exc.message}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"--hf-config {config_file}:{exc.lineno}: not JSON: {exc.msg}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--hf-config {config_file}: expected a JSON object (an HF config.json)")
        overrides.update(loaded)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--hf-set {pair!r}: expected KEY=VALUE, e.g. --hf-set dropout_rate=0.0")
        try:
            overrides[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key.strip()] = raw
    return overrides


def convert(
    checkpoint: str | None,
    out: str | None,
    *,
    run_id: str | None = None,
    config: ClusterConfig | None = None,
    step: int | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
    overrides: dict[str, Any] | None = None,
    tokenizer: Path | None = None,
    max_shard_size: str | None = None,
    verify: bool = False,
    verify_python: str | None = None,
    progress: Progress | None = None,
) -> ConvertReport:
    if run_id is not None:
        if config is None:
            raise UsageError("--run needs a cluster file to find the run's storage")
        from tpuft.readers.runs import resolve_run

        run = resolve_run(config, run_id)
        run_dir = run.url
        checkpoint = f"{run_dir}/{run.layout().checkpoints}"
        if out is None:
            out = f"{run_dir}/{rundir.EXPORT_HF}"
            overwrite = True
    elif checkpoint is None or out is None:
        raise UsageError("give CHECKPOINT and OUT_DIR, or --run RUN_ID [OUT_DIR]")
    assert checkpoint is not None and out is not None
    project = config.gcp.project if config is not None else None
    try:
        max_shard_bytes = parse_size(max_shard_size) if max_shard_size else None
        local_source = _local_checkpoint(checkpoint, step, project)
        from tpuft.convert.sources import apply_tokenizer, open_source

        source = open_source(local_source, step=step, overrides=overrides)
        if tokenizer is not None:
            apply_tokenizer(source, tokenizer)
        remote_out = out.startswith("gs://")
        local_out = _staging_dir(out) if remote_out else Path(out).expanduser()
        verified: dict[str, Any] | None = None

        def check(written: Path) -> None:
            nonlocal verified
            from tpuft.convert.verify import verify_model

            verified = verify_model(source, written, python=verify_python)

        result = write_hf_model(
            source,
            local_out,
            dtype=dtype,
            max_shard_bytes=max_shard_bytes,
            overwrite=overwrite or remote_out,
            progress=progress,
            check=check if verify else None,
        )
        if remote_out:
            from tpuft.convert.remote import upload_model

            try:
                upload_model(local_out, out, overwrite=overwrite, project=project)
            finally:
                shutil.rmtree(local_out, ignore_errors=True)
        if checkpoint.startswith("gs://"):
            from tpuft.convert.remote import cache_dir

            # kept only while a download may need resuming
            shutil.rmtree(cache_dir(checkpoint), ignore_errors=True)
    except ConvertError as exc:
        raise UsageError(str(exc)) from None
    return ConvertReport(result=result, source=checkpoint, out=out, step=source.step, verify=verified)


def _local_checkpoint(checkpoint: str, step: int | None, project: str | None) -> Path:
    if checkpoint.startswith("gs://"):
        from tpuft.convert.remote import fetch_checkpoint

        return fetch_checkpoint(checkpoint, step, project=project)
    return Path(checkpoint).expanduser()


def _staging_dir(url: str) -> Path:
    from tpuft.convert.remote import cache_dir

    cache = cache_dir(url)
    return cache.with_name(cache.name + "-out") / "hf"
