"""TensorBoard event files written the way T5X (clu / tf.summary) and tpuft's worker write them, and a PNG's
size: shared by the monitor tests (TensorBoard reading, plots, ``runs`` and ``logs``)."""

from __future__ import annotations

import struct
from pathlib import Path

WALL0 = 1_000_000.0
"""Wall time of the first written event: far in the past, so it is the earliest (each file's own header is
now)."""


def write_events(
    logdir: Path, points: list[tuple[int, dict[str, float]]], *, tensor: bool = True, wall_step: float = 10.0
) -> Path:
    """One event file in ``logdir``: an event per (step, {tag: value}); returns its path.

    ``tensor``: a float32 tensor summary whose ``scalars`` plugin metadata rides on a tag's first event only
    (as TF2's writer does); else a legacy ``simple_value``. Event ``i`` has wall time ``WALL0 + i *
    wall_step``."""
    import numpy as np
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.scalar import metadata as scalar_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    writer = EventFileWriter(str(logdir))
    seen: set[str] = set()
    for index, (step, values) in enumerate(points):
        summary = summary_pb2.Summary()
        for tag, number in values.items():
            if not tensor:
                summary.value.add(tag=tag, simple_value=number)
                continue
            value = summary.value.add(tag=tag, tensor=tensor_util.make_tensor_proto(np.float32(number)))
            if tag not in seen:
                value.metadata.CopyFrom(
                    scalar_metadata.create_summary_metadata(display_name=tag, description="")
                )
                seen.add(tag)
        writer.add_event(event_pb2.Event(wall_time=WALL0 + index * wall_step, step=step, summary=summary))
    writer.close()
    files = sorted(logdir.glob("*tfevents*"), key=lambda p: p.stat().st_mtime_ns)
    return files[-1]


def write_text_summary(logdir: Path, tag: str, text: str) -> None:
    """A text-plugin tensor (T5X logs its gin config so): not a scalar, must be ignored."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto([text.encode()]))
    value.metadata.plugin_data.plugin_name = "text"
    writer = EventFileWriter(str(logdir))
    writer.add_event(event_pb2.Event(wall_time=WALL0 + 5, step=0, summary=summary_pb2.Summary(value=[value])))
    writer.close()


T5X_TRAIN = {
    "loss": 4.5,
    "learning_rate": 0.002,
    "learning_rate/current": 0.001,
    "accuracy": 0.25,
    "cross_ent_loss": 4.25,
    "z_loss": 0.25,
    "timing/seqs_per_second": 128.0,
    "timing/target_tokens_per_second": 8192.0,
    "timing/steps_per_second": 2.0,
    "timing/seconds": 50.0,
}


def t5x_tb(tb: Path, *, tasks: tuple[str, ...] = ("mytask",)) -> Path:
    """``tb/train/`` logging steps 100, 200, 300 and ``tb/training_eval/<task>/`` at 200 and 300, as T5X lays
    them out."""
    write_events(
        tb / "train", [(s, {k: v / (s // 100) for k, v in T5X_TRAIN.items()}) for s in (100, 200, 300)]
    )
    write_text_summary(tb / "train", "config", "model_dir = 'gs://x'")
    for offset, task in enumerate(tasks):
        points = [
            (s, {"loss": 3.0 / (s // 100) + offset, "accuracy": 0.5 + 0.125 * (s // 100)}) for s in (200, 300)
        ]
        write_events(tb / "training_eval" / task, points)
    return tb


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, which must come first after the 8-byte signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height
