"""The records of a ``tpuft predict`` input, streamed: JSON lines, CSV or TSV (by the file's suffix), local or
``gs://``, each turned into the source text the model was trained on.

The fields are the training data's (:class:`tpuft.worker.data.Fields`: ``source_field`` or ``source_template``,
``prefix``, ``source_transforms``, ``data.preprocess``), so an input that trains also predicts, and a bad line says
``file:line: problem`` exactly as the training data's check does. Unlike training, a target is optional: an input
with one is scored, an input without is only predicted. ``--field`` names the source field instead of the recipe's.

A CSV or TSV file has a header row naming its columns; its values are text. A ``gs://`` input is downloaded once to
a cache folder on this machine (kept, so a resumed job does not fetch it again; skipped when intact) and streamed
from there: never read whole into memory. Stdlib only (the storage client aside, for ``gs://``).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuft.worker import data as data_mod
from tpuft.worker.data import DataError, Fields

SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}


def cache_folder(url: str) -> Path:
    """Where a ``gs://`` input or model is downloaded to: ``$TPUFT_PREDICT_CACHE`` (default
    ``~/.cache/tpuft/predict``), one folder per URL, kept for a resumed job (intact files are not fetched again)."""
    root = Path(os.environ.get("TPUFT_PREDICT_CACHE", "~/.cache/tpuft/predict")).expanduser()
    return root / hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    """0-based position among the input's records (non-blank lines, or CSV rows after the header): the row's id."""
    line: int
    """1-based line number in the file, for messages."""
    source: str
    target: str | None
    """The processed target when the record has one (for scores), else None."""


def input_format(name: str) -> str:
    """``jsonl``, ``csv`` or ``tsv`` from the name's suffix (before a ``.gz`` would be, which is not supported)."""
    suffix = Path(name.rstrip("/")).suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(name, f"unknown input format {suffix or '(no suffix)'!r}: name it .jsonl, .json, .csv or .tsv")
    return SUFFIXES[suffix]


def fields_for(data_config: Any, field: str | None = None) -> Fields:
    """The recipe's fields; ``field`` (``--field``) reads the source from that field instead of the recipe's
    ``source_field`` or ``source_template``."""
    fields = Fields.of(data_config)
    if field:
        fields = dataclasses.replace(fields, source_field=field, source_template=None)
    return fields


def local_path(url: str) -> Path:
    """The input as a file on this machine: itself, or a ``gs://`` object's cached download."""
    if not url.startswith("gs://"):
        return Path(url).expanduser()
    from tpuft.storage import GcsStorage

    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent == "gs:":
        raise DataError(url, "a gs:// input must name an object (gs://bucket/path/file.jsonl)")
    folder = cache_folder(url)
    transfer = GcsStorage.from_url(parent).fetch_tree("", folder, include=lambda rel: rel == name)
    if transfer.files == 0:
        raise DataError(url, "no such object")
    return folder / name


def _raw_records(path: Path, kind: str, where: str) -> Iterator[tuple[int, Any, int]]:
    """(line number, record, bytes) of every non-blank line or CSV row, streamed. A line that cannot be read comes
    as its :class:`DataError` in the record's place, so a check can go on past it (a JSON line's problem is its
    own; a CSV reader cannot go on past a broken file, so that error is the last)."""
    if kind == "jsonl":
        for number, raw in data_mod._lines(path):
            try:
                yield number, data_mod.parse_line(where, number, raw), len(raw)  # type: ignore[arg-type]
            except DataError as exc:
                yield number, exc, len(raw)
        return
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t" if kind == "tsv" else ",")
        try:
            for row in reader:
                row.pop(None, None)  # values beyond the header's columns have no name to be read by
                yield reader.line_num, row, sum(len(value or "") + 1 for value in row.values())
        except UnicodeDecodeError as exc:
            where_line = f"{where}:{reader.line_num + 1}"
            yield reader.line_num + 1, DataError(where_line, f"not UTF-8: {exc.reason} (save the file as UTF-8)"), 0
        except csv.Error as exc:
            yield reader.line_num, DataError(f"{where}:{reader.line_num}", f"not valid {kind.upper()}: {exc}"), 0


def _target_less(fields: Fields) -> Fields:
    """Fields that build the source alone (the target side reads the source again, and is dropped)."""
    return dataclasses.replace(
        fields, target_field=fields.source_field, target_template=fields.source_template, target_transform=None
    )


def _label_name(target: str, labels: Sequence[str]) -> str:
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
    return Record(index, line, example.source, _label_name(example.target, labels))


def records(url: str, fields: Fields, labels: Sequence[str] = ()) -> Iterator[Record]:
    """Every record of the input, in order, streamed; a bad one raises its located :class:`DataError`. A record
    that ``data.preprocess`` drops keeps its index (ids stay input positions) but yields nothing."""
    kind = input_format(url)
    for index, (line, raw, _) in enumerate(_raw_records(local_path(url), kind, url)):
        if isinstance(raw, DataError):
            raise raw
        record = make_record(raw, index=index, line=line, where=url, fields=fields, labels=labels)
        if record is not None:
            yield record


@dataclass
class InputCheck(data_mod.FileCheck):
    """What the controller's preflight found reading a whole predict input."""

    records: int = 0
    """Records read (non-blank lines or CSV rows), dropped and bad ones included: the job's ``total_lines``."""
    targets: int = 0
    """Records that have a target (scores are printed when there are any)."""


def check(url: str, fields: Fields, labels: Sequence[str] = (), *, progress: Any = None) -> InputCheck:
    """Read every record as a worker would, collecting every located problem instead of stopping at the first
    (the first :data:`~tpuft.worker.data.MAX_PROBLEMS` listed, the rest counted). ``progress(bytes_done,
    bytes_total)`` is called now and then for a long file."""
    result = InputCheck(Path(url))
    try:
        kind = input_format(url)
        path = local_path(url)
        total = path.stat().st_size
        next_report = 1 << 24
        for index, (line, raw, size) in enumerate(_raw_records(path, kind, url)):
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
                data_mod._note(result, exc)
                continue
            if record is None:
                result.dropped += 1
                continue
            result.examples += 1
            result.targets += record.target is not None
    except DataError as exc:  # the format, a byte-order mark in a JSON-lines file, a gs:// object that is not there
        data_mod._note(result, exc)
    except OSError as exc:
        data_mod._note(result, DataError(url, f"cannot read: {exc.strerror or exc}"))
    return result
