"""T5X's engine parts beside its trainer (:mod:`tpuft.worker.t5x.train`): JAX's start on the local pod, the
numbers T5X reports turned into tpuft's (batch counts, the per-token loss, the device layout's line), and its
checkpoint folders (the manifest, pruning, the export), local or gs:// through TensorFlow's gfile as T5X
writes them. Split from the trainer so that it reads as the run's adapter alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tpuft.backends.spec import LOCAL_DEVICES_ENV
from tpuft.backends.t5x_schema import LAYOUT
from tpuft.config import RecipeConfig
from tpuft.run import rundir
from tpuft.worker.compile_cache import start_jax_cache
from tpuft.worker.context import WorkerContext
from tpuft.worker.export import export_hf


def start_jax(ctx: WorkerContext, recipe: RecipeConfig) -> None:
    """What every T5X process does before JAX starts (a training, a ``tpuft predict`` job). The local pod: as
    many CPU devices in this process as the slice's hosts have chips (the launch plan's count, in the
    XLA_FLAGS that JAX's CPU client reads), and JAX's coordination service on worker 0 with gloo collectives
    between the processes, waiting up to ``train.startup_timeout`` for every host of every slice to join. TPU
    hosts need nothing: the TPU runtime finds its peers (and, on several slices, the MEGASCALE variables'
    coordinator). Then JAX's persistent compilation cache (:mod:`tpuft.worker.compile_cache`), on either."""
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        start_cpu_pod(ctx, recipe)
    start_jax_cache(chief=ctx.worker_id == 0)


def start_cpu_pod(ctx: WorkerContext, recipe: RecipeConfig) -> None:
    """The local pod's JAX: its CPU devices and, on several workers, the coordination service."""
    count = os.environ.get(LOCAL_DEVICES_ENV)
    if count:
        os.environ["XLA_FLAGS"] = with_host_device_count(os.environ.get("XLA_FLAGS", ""), int(count))
    if ctx.num_workers > 1:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=ctx.coordinator,
            num_processes=ctx.num_workers,
            process_id=ctx.worker_id,
            initialization_timeout=int(recipe.train.startup_timeout),
        )


def batch_counts(batch: Any) -> tuple[int, int, int]:
    """(rows, examples, real tokens) of this host's part of a T5X batch. A packed row holds one example per
    decoder segment id (1, 2, ...; 0 is padding); an unpacked one, one example if its targets are not all
    padding."""
    import numpy as np

    def local(array: Any) -> Any:
        """This host's rows: on a pod the batch is a global jax.Array whose other shards live on other
        hosts."""
        shards = getattr(array, "addressable_shards", None)
        if shards is None:
            return np.asarray(array)
        unique = {str(shard.index): shard.data for shard in shards}
        return np.concatenate([np.asarray(data) for data in unique.values()])

    targets = local(batch["decoder_target_tokens"])
    tokens = int((targets > 0).sum())
    if "encoder_input_tokens" in batch:
        tokens += int((local(batch["encoder_input_tokens"]) > 0).sum())
    segments = batch.get("decoder_segment_ids")
    if segments is not None:
        examples = int(local(segments).max(axis=-1).sum())
    else:
        examples = int((targets > 0).any(axis=-1).sum())
    return int(targets.shape[0]), examples, tokens


def with_host_device_count(flags: str, count: int) -> str:
    """``XLA_FLAGS`` with XLA's host-platform device count set to ``count`` (replacing one already there), the
    other flags kept as they were."""
    kept = [flag for flag in flags.split() if not flag.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={count}"])


def layout_line(layout: dict[str, Any]) -> str:
    """``device layout: 2 host(s) x 2 device(s), mesh data 2 x model 2 (2 replicas x 2 partitions); ...``; on
    several slices the mesh's ``replica`` axis is the slices (``replica 2 x data 1 x model 2``)."""
    mesh = layout["mesh"]
    replicas = mesh.get("replica", 1) * mesh.get("data", 1)
    line = (
        f"device layout: {layout['hosts']} host(s) x {layout['devices_per_host']} device(s), mesh "
        + " x ".join(f"{axis} {size}" for axis, size in mesh.items())
        + f" ({replicas} replicas x {mesh.get('model', 1)} partitions); "
        f"{layout['params_sharded']} of {layout['params']} parameter arrays split over "
        + " and ".join(f"'{axis}'" for axis in layout.get("sharded_over") or ["model"])
    )
    example = layout.get("example")
    if example:
        line += (
            f", e.g. {example['name']} {tuple(example['shape'])} as {example['spec']}: "
            f"{tuple(example['per_device'])} per device"
        )
    return line


def remove_checkpoint(folder: str) -> None:
    """A checkpoint folder pruned, local or gs:// (through TensorFlow's gfile, which T5X writes with)."""
    import tensorflow as tf

    tf.io.gfile.rmtree(folder)


def write_manifest(folder: str) -> None:
    """tpuft's manifest for a checkpoint folder, local or gs:// (listed through TensorFlow's gfile)."""
    if not folder.startswith("gs://"):
        LAYOUT.write_manifest(Path(folder))
        return
    import tensorflow as tf

    from tpuft.backends.spec import manifest_text

    files: dict[str, int] = {}
    for root, _, names in tf.io.gfile.walk(folder):
        for name in names:
            path = f"{root.rstrip('/')}/{name}"
            rel = path[len(folder) + 1 :]
            if rel != LAYOUT.manifest:
                files[rel] = tf.io.gfile.stat(path).length
    with tf.io.gfile.GFile(f"{folder}/{LAYOUT.manifest}", "w") as handle:
        handle.write(manifest_text(files))


def export_checkpoint(ctx: WorkerContext, model_dir: str, step: int, dtype: str) -> Path:
    """T5X's checkpoint of ``step`` (fetched first from a gs:// MODEL_DIR) through the one export."""
    if model_dir.startswith("gs://"):
        from tpuft.convert.remote import fetch_checkpoint

        checkpoint = fetch_checkpoint(model_dir, step)
    else:
        checkpoint = Path(model_dir) / LAYOUT.checkpoint_format.format(step=step)
    return export_hf(ctx, checkpoint, dtype)


def write_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def per_token_loss(numbers: dict[str, float]) -> float | None:
    """The mean loss per real target token, comparable across backends (T5X's own ``loss`` is a sum over the
    batch's tokens divided by the loss normalising factor, kept in TensorBoard as ``t5x/loss``)."""
    for name in ("loss_per_nonpadding_target_token", "loss"):
        if name in numbers:
            return numbers[name]
    return None


def is_number(value: Any) -> bool:
    try:
        return not isinstance(value, (bool, str, bytes)) and float(value) == float(value)
    except (TypeError, ValueError):
        return False


def logged_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (none when there is no file; a torn line is skipped)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [row for line in lines if (row := rundir.read_json_text(line)) is not None]
