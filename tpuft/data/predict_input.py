"""The records of a ``tpuft predict`` input, streamed: JSON lines, CSV, TSV or Parquet (by the file's suffix),
local or ``gs://``, read by the training data's reader (:func:`tpuft.data.read_rows`), each turned into
the source text the model was trained on.

The fields are the training data's (:class:`tpuft.data.Fields`: ``source_field`` or
``source_template``, ``prefix``, ``source_transforms``, ``data.preprocess``), so an input that trains also
predicts, and a bad line says ``file:line: problem`` exactly as the training data's check does. Unlike
training, a target is optional: an input with one is scored, an input without is only predicted. ``--field``
names the source field instead of the recipe's.

A CSV or TSV file has a header row naming its columns; its values are text. A ``gs://`` input is downloaded
once to a cache folder on this machine (kept, so a resumed job does not fetch it again; skipped when intact)
and streamed from there: never read whole into memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft import data as data_mod
from tpuft.data import DataError, Fields

cache_folder = data_mod.cache_folder
"""Where a ``gs://`` input or model is downloaded to (predict's models use it too)."""


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    """0-based position among the input's records (non-blank lines, or CSV rows after the header): the row's
    id."""
    line: int
    """1-based line number in the file, for messages."""
    source: str
    target: str | None
    """The processed target when the record has one (for scores), else None."""


def input_format(name: str, declared: str = "auto") -> str:
    """The input's format: ``declared`` (``data.format``) or its name's suffix
    (:func:`tpuft.data.file_format`)."""
    return data_mod.file_format(name, declared)[0]


def fields_for(data_config: Any, field: str | None = None) -> Fields:
    """The recipe's fields; ``field`` (``--field``) reads the source from that field instead of the recipe's
    ``source_field`` or ``source_template``."""
    fields = Fields.of(data_config)
    if field:
        fields = dataclasses.replace(fields, source_field=field, source_template=None)
    return fields


def _target_less(fields: Fields) -> Fields:
    """Fields that build the source alone (the target side reads the source again, and is dropped)."""
    return dataclasses.replace(
        fields,
        target_field=fields.source_field,
        target_template=fields.source_template,
        target_transform=None,
    )


def label_name(target: str, labels: Sequence[str]) -> str:
    """A classification target as its label's name (the data may give the index, as training accepts)."""
    if labels and target not in labels and target.isdigit() and int(target) < len(labels):
        return labels[int(target)]
    return target


def make_record(
    raw: Any, *, index: int, line: int, where: str, fields: Fields, labels: Sequence[str] = ()
) -> Record | None:
    """One record's source and optional target; None when ``data.preprocess`` drops it."""
    try:
        example = data_mod.make_example(raw, line=line, path=where, fields=fields)
    except DataError as exc:
        if exc.missing is None or exc.missing[0] != "target":
            raise
        example = data_mod.make_example(raw, line=line, path=where, fields=_target_less(fields))
        return None if example is None else Record(index, line, example.source, None)
    if example is None:
        return None
    return Record(index, line, example.source, label_name(example.target, labels))


def records(url: str, fields: Fields, labels: Sequence[str] = ()) -> Iterator[Record]:
    """Every record of the input, in order, streamed; a bad one raises its located :class:`DataError`. A
    record that ``data.preprocess`` drops keeps its index (ids stay input positions) but yields nothing."""
    for index, line, raw, _ in data_mod.read_rows(url, fields.data_format):
        if isinstance(raw, DataError):
            raise raw
        record = make_record(raw, index=index, line=line, where=url, fields=fields, labels=labels)
        if record is not None:
            yield record


@dataclass
class InputCheck(data_mod.FileCheck):
    """What the controller's preflight found reading a whole predict input."""

    records: int = 0
    """Records read (non-blank lines or CSV rows), dropped and bad ones included: the job's
    ``total_lines``."""
    targets: int = 0
    """Records that have a target (scores are printed when there are any)."""


def check(url: str, fields: Fields, labels: Sequence[str] = (), *, progress: Any = None) -> InputCheck:
    """Read every record as a worker would, collecting every located problem instead of stopping at the first
    (the first :data:`~tpuft.data.MAX_PROBLEMS` listed, the rest counted). ``progress(bytes_done,
    bytes_total)`` is called now and then for a long file."""
    result = InputCheck(Path(url))
    try:
        input_format(url, fields.data_format)
        total = data_mod.local_copy(url).stat().st_size
        next_report = 1 << 24
        for index, line, raw, size in data_mod.read_rows(url, fields.data_format):
            result.records += 1
            result.bytes_read += size
            if progress is not None and result.bytes_read >= next_report:
                progress(result.bytes_read, total)
                next_report += 1 << 24
            try:
                if isinstance(raw, DataError):
                    raise raw
                record = make_record(raw, index=index, line=line, where=url, fields=fields, labels=labels)
            except DataError as exc:
                data_mod.note_problem(result, exc)
                continue
            if record is None:
                result.dropped += 1
                continue
            result.examples += 1
            result.targets += record.target is not None
    except (
        DataError
    ) as exc:  # the format, a byte-order mark in a JSON-lines file, a gs:// object that is not there
        data_mod.note_problem(result, exc)
    except OSError as exc:
        data_mod.note_problem(result, DataError(url, f"cannot read: {exc.strerror or exc}"))
    return result
