"""TensorBoard event files -> :class:`~tpuft.run.rundir.MetricsLog`, for backends that write no
``metrics.jsonl`` (T5X).

Events are read with TensorBoard's own reader (``event_file_loader.RawEventFileLoader``: TFRecord framing and
CRC32C checks) and decoded with TensorBoard's ``Event`` proto; scalar tensors are turned into numbers with
``tensor_util.make_ndarray``. ``tensorboard`` is imported inside :func:`read_tb_metrics` only: the CLI must
start fast.

Where the tags come from (checked against google-research/t5x at cc342d4 and google/seqio):

* ``t5x/trainer.py``: ``MetricsManager("train", summary_dir=model_dir)`` writes ``<tb>/train/`` and
  ``MetricsManager(f"training_eval/{task[:113]}", ...)`` writes ``<tb>/training_eval/<task>/``, through
  ``clu.metric_writers`` (``tf.summary.scalar``: *tensor* summaries with the ``scalars`` plugin metadata on
  the first event of a tag only, no ``simple_value``). The trainer adds ``learning_rate`` (mean over the log
  period) and ``learning_rate/current``; ``timing/compilation_seconds``, ``timing/uptime``.
* ``t5x/models.py`` (``compute_base_metrics``): ``loss``, ``accuracy`` (teacher-forced, per target token),
  ``loss_per_nonpadding_target_token``, ``loss_per_all_target_tokens``, ``timing/seqs_per_second``,
  ``timing/steps_per_second``, ``timing/seconds``, ``timing/seqs``, ``timing/target_tokens_per_second``
  (padded target tokens), ``..._per_core``, ``non_padding_fraction/loss_weights``; with z-loss also ``z_loss``
  and ``cross_ent_loss``. The same model metrics are written for every ``training_eval`` task.
* ``t5x/train.py``: ``timing/init_or_restore_seconds``, ``timing/evaluate_seconds``,
  ``timing/checkpoint_seconds`` (train dir). Inference evals (``seqio.Evaluator`` with ``log_dir=model_dir``)
  go to ``<tb>/inference_eval/<task>/`` with tags ``eval/<metric>`` (``seqio/loggers.py``
  ``TensorBoardLogger``; seqio metrics such as ``accuracy`` are usually in percent, 0-100).
* tpuft's own worker (``tpuft/worker/metrics.py``) writes ``simple_value`` scalars in ``<tb>/`` itself:
  ``train/<key>`` and ``eval/<key>`` for the ``<key>`` / ``eval_<key>`` columns of ``metrics.jsonl``.

The mapping into ``metrics.jsonl`` columns:

=========================================
===================================================================== tag (in a train dir: ``train/``,
``tb/``)  column
=========================================
===================================================================== ``loss``
``loss`` ``learning_rate/current``                  ``lr`` (the rate at that step, like tpuft's own ``lr``)
``learning_rate``                          ``lr`` when there is no ``learning_rate/current`` (older T5X)
``accuracy``                               ``accuracy``
``timing/seqs_per_second``                 ``examples_per_s``
``timing/target_tokens_per_second``        ``tokens_per_s``
``timing/steps_per_second``                ``steps_per_s``
``train/<key>`` (tpuft's own)              ``<key>``, then the rows above
``eval/<key>`` (tpuft's own)               ``eval_<key>``
anything else (``cross_ent_loss``, ...)    the tag unchanged (``cross_ent_loss``, ``timing/seqs``, ...)
=========================================
=====================================================================

In an eval dir (``training_eval/<task>/``, ``inference_eval/<task>/``, ``eval/``, ``validation/``) a tag is
first stripped of seqio's ``eval/`` prefix and renamed with the table above, then becomes ``eval_<name>``
(``eval_loss``, ``eval_accuracy``, ``eval_examples_per_s``). With more than one task name among the eval dirs
it becomes ``eval_<task>/<name>`` (``eval_mnli/loss``). When two eval dirs of one task give the same column
(T5X's teacher-forced ``training_eval`` ``accuracy`` and seqio's ``inference_eval`` ``eval/accuracy``), the
``inference_eval`` one keeps the plain column and the other is qualified by its folder:
``eval_training_eval/accuracy``. The same rule (qualify the loser by its folder) settles any other clash, so
no value silently overwrites another.

Every row also gets ``time`` (the event's wall time) and ``elapsed_s`` (seconds since the first event of any
file; from a train dir's events where the step has some) unless a tag already gave them. Rows are merged by
step (one row per step, train and eval columns together) and sorted by step. When a run was restarted and
logged a step again, the newer event file (by the time stamp in its name) wins.

A truncated or corrupt event file (a run killed mid-write, a half-copied file) is read up to the bad record;
the rest is skipped and said in :attr:`TbMetricsLog.notes`. Nothing here raises on bad files.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.run.rundir import MetricsLog
from tpuft.storage import PARTIAL_SUFFIX

log = logging.getLogger(__name__)

TRAIN_TAGS: dict[str, str] = {
    "loss": "loss",
    "learning_rate/current": "lr",
    "learning_rate": "lr",
    "accuracy": "accuracy",
    "timing/seqs_per_second": "examples_per_s",
    "timing/target_tokens_per_second": "tokens_per_s",
    "timing/steps_per_second": "steps_per_s",
}
"""T5X tag -> metrics.jsonl column. Where two tags give one column, the one listed first wins."""

EVAL_KINDS = ("inference_eval", "training_eval", "eval", "validation")
"""Folders under ``tb/`` that hold eval metrics, in the order that settles a clash (first wins)."""

_RECORD_OVERHEAD = 16
"""TFRecord framing around each record: 8-byte length, 4-byte length CRC, 4-byte data CRC."""
_EVENTS_STAMP = re.compile(r"tfevents\.(\d+)")


@dataclass
class TbMetricsLog(MetricsLog):
    """A :class:`MetricsLog` read from event files; ``skipped`` stays empty (event files have no lines)."""

    notes: list[str] = field(default_factory=list)
    """One line per event file that could not be read to its end (truncated, corrupt, unreadable)."""
    files: int = 0
    """How many event files were read."""


@dataclass
class _Point:
    value: float | int
    wall_time: float


@dataclass
class _Dir:
    """The scalars of one TensorBoard "run" (a folder under ``tb/``): tag -> step -> point."""

    rel: str
    kind: str
    """``train`` or one of :data:`EVAL_KINDS`."""
    task: str
    series: dict[str, dict[int, _Point]] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)
    """tag -> plugin name, from the first event of the tag that carried metadata (TF2 writers send it
    once)."""


def read_tb_metrics(tb_dir: Path) -> TbMetricsLog:
    """Every scalar under ``tb_dir`` (recursively), merged by step into rows shaped like ``metrics.jsonl``
    rows."""
    result = TbMetricsLog()
    tb_dir = Path(tb_dir)
    if not tb_dir.is_dir():
        result.notes.append(f"{tb_dir}: no such folder")
        return result
    dirs: dict[str, _Dir] = {}
    first_wall: float | None = None
    for path in _event_files(tb_dir):
        rel = path.parent.relative_to(tb_dir).as_posix()
        run = dirs[rel] if rel in dirs else dirs.setdefault(rel, _new_dir(rel))
        earliest = _read_file(path, run, result.notes, label=path.relative_to(tb_dir.parent).as_posix())
        result.files += 1
        if earliest is not None:
            first_wall = earliest if first_wall is None else min(first_wall, earliest)
    result.rows = _merge(list(dirs.values()), first_wall)
    for note in result.notes:
        log.info("tensorboard events: %s", note)
    return result


# ---- reading ---------------------------------------------------------------------------------------------


def _event_files(tb_dir: Path) -> list[Path]:
    """Event files under ``tb_dir``: by folder, then oldest first (the writer's time stamp is in the name)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(tb_dir):
        dirnames.sort()
        for name in filenames:
            if "tfevents" in name and not name.startswith(".") and not name.endswith(PARTIAL_SUFFIX):
                found.append(Path(dirpath) / name)
    return sorted(found, key=lambda p: (p.parent.as_posix(), _stamp(p.name), p.name))


def _stamp(name: str) -> int:
    match = _EVENTS_STAMP.search(name)
    return int(match.group(1)) if match else 0


def _new_dir(rel: str) -> _Dir:
    parts = [] if rel == "." else rel.split("/")
    if parts and parts[0] in EVAL_KINDS:
        return _Dir(rel, parts[0], "/".join(parts[1:]))
    return _Dir(rel, "train", "")


def _read_file(path: Path, run: _Dir, notes: list[str], *, label: str) -> float | None:
    """Add the file's scalars to ``run``; returns the earliest wall time seen. Never raises: problems become
    notes."""
    from google.protobuf.message import DecodeError
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    earliest: float | None = None
    consumed = records = bad = 0
    try:
        size = path.stat().st_size
        for record in RawEventFileLoader(str(path)).Load():
            consumed += len(record) + _RECORD_OVERHEAD
            records += 1
            try:
                event = event_pb2.Event.FromString(record)
            except DecodeError:
                bad += 1
                continue
            if event.wall_time and (earliest is None or event.wall_time < earliest):
                earliest = event.wall_time
            if event.HasField("summary"):
                _add_summary(run, event)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped with a note, never fatal
        notes.append(
            f"{label}: unreadable after {records} record(s) ({type(exc).__name__}: {exc}); the rest skipped"
        )
        return earliest
    if consumed < size:
        notes.append(
            f"{label}: truncated or corrupt after {records} record(s) (byte {consumed} of {size}); the rest "
            "skipped"
        )
    if bad:
        notes.append(f"{label}: {bad} record(s) are not TensorBoard events; skipped")
    return earliest


def _add_summary(run: _Dir, event: Any) -> None:
    for value in event.summary.value:
        plugin = value.metadata.plugin_data.plugin_name
        if plugin and value.tag not in run.plugins:
            run.plugins[value.tag] = plugin
        number = _scalar(value, run.plugins.get(value.tag, ""))
        if number is not None:
            run.series.setdefault(value.tag, {})[int(event.step)] = _Point(number, event.wall_time)


def _scalar(value: Any, plugin: str) -> float | int | None:
    """A ``simple_value``, or a one-element numeric tensor of the ``scalars`` plugin; None for anything
    else."""
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return _short_float32(value.simple_value)
    if kind != "tensor" or plugin != "scalars":
        return None
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(value.tensor)
    except Exception:  # noqa: BLE001 - a tensor TensorBoard itself cannot decode is not a scalar we can show
        return None
    if array.size != 1 or array.dtype.kind not in "fiub":
        return None
    item = array.reshape(()).item()
    if array.dtype.kind == "f":
        return _short_float32(item) if array.dtype.itemsize == 4 else float(item)
    return int(item)


def _short_float32(value: float) -> float:
    """The shortest decimal that is the same float32 (``2.3``, not ``2.299999952316284``): readable JSON
    rows."""
    import numpy as np

    return float(str(np.float32(value)))


# ---- naming and merging ----------------------------------------------------------------------------------


def _train_name(tag: str) -> str:
    return TRAIN_TAGS.get(tag, tag)


def _column(run: _Dir, tag: str, eval_prefix: str) -> str:
    """The column a tag lands in before clashes between folders are settled (see the module docstring)."""
    if run.kind == "train":
        if tag.startswith("eval/"):
            return "eval_" + _train_name(tag[len("eval/") :])
        return _train_name(tag.removeprefix("train/"))
    return f"eval_{eval_prefix}{_train_name(tag.removeprefix('eval/'))}"


def _tag_rank(tag: str) -> int:
    """Lower wins when two tags of one folder give the same column (``learning_rate/current`` over
    ``learning_rate``)."""
    stripped = tag.removeprefix("train/").removeprefix("eval/")
    order = list(TRAIN_TAGS)
    return order.index(stripped) if stripped in order else len(order)


def _kind_rank(kind: str) -> int:
    return EVAL_KINDS.index(kind) if kind in EVAL_KINDS else len(EVAL_KINDS)


def _columns(dirs: list[_Dir]) -> dict[tuple[str, str], str]:
    """(folder, tag) -> column, deterministic for a given set of folders and tags."""
    tasks = sorted({run.task for run in dirs if run.kind != "train"})
    wanted: dict[tuple[str, str], str] = {}
    for run in dirs:
        prefix = f"{run.task}/" if len(tasks) > 1 and run.task else ""
        for tag in run.series:
            wanted[(run.rel, tag)] = _column(run, tag, prefix)
    owners: dict[str, list[_Dir]] = {}
    by_rel = {run.rel: run for run in dirs}
    for (rel, _tag), column in wanted.items():
        group = owners.setdefault(column, [])
        if by_rel[rel] not in group:
            group.append(by_rel[rel])
    final = {}
    for (rel, tag), column in wanted.items():
        group = sorted(owners[column], key=lambda r: (_kind_rank(r.kind), r.rel))
        final[(rel, tag)] = column if group[0].rel == rel else _qualified(by_rel[rel], column)
    return final


def _qualified(run: _Dir, column: str) -> str:
    """``eval_accuracy`` from ``training_eval/t`` losing a clash -> ``eval_training_eval/accuracy``."""
    if column.startswith("eval_"):
        return f"eval_{run.kind}/{column[len('eval_') :]}"
    return f"{run.rel}/{column}"


def _merge(dirs: list[_Dir], first_wall: float | None) -> list[dict[str, Any]]:
    columns = _columns(dirs)
    rows: dict[int, dict[str, Any]] = {}
    walls: dict[int, tuple[bool, float]] = {}
    for run in dirs:
        for tag in sorted(
            run.series, key=lambda t: (-_tag_rank(t), t)
        ):  # preferred tags last: they overwrite
            column = columns[(run.rel, tag)]
            for step, point in run.series[tag].items():
                rows.setdefault(step, {"step": step})[column] = point.value
                _note_wall(walls, step, point.wall_time, train=run.kind == "train")
    ordered = []
    for step in sorted(rows):
        row = rows[step]
        wall = walls[step][1]
        row.setdefault("time", round(wall, 3))
        if first_wall is not None:
            row.setdefault("elapsed_s", round(max(0.0, wall - first_wall), 3))
        ordered.append(_in_column_order(row))
    return ordered


_FIRST_COLUMNS = ("step", "loss", "lr", "examples_per_s", "tokens_per_s", "steps_per_s", "accuracy")


def _in_column_order(row: dict[str, Any]) -> dict[str, Any]:
    """step, the metrics.jsonl columns, other train columns, eval columns, then time: rows that read like the
    file."""

    def rank(key: str) -> tuple[int, int, str]:
        if key in _FIRST_COLUMNS:
            return (0, _FIRST_COLUMNS.index(key), key)
        if key in ("time", "elapsed_s"):
            return (3, 0, key)
        return (2 if key.startswith("eval_") else 1, 0, key)

    return {key: row[key] for key in sorted(row, key=rank)}


def _note_wall(walls: dict[int, tuple[bool, float]], step: int, wall: float, *, train: bool) -> None:
    """The latest wall time of a step, from train folders when the step has any (an eval finishes later)."""
    current = walls.get(step)
    if current is None or (train and not current[0]) or (train == current[0] and wall > current[1]):
        walls[step] = (train, wall)
