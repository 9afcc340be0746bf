"""Reading a data file, whatever its format: JSON lines, CSV, TSV (each may be ``.gz``) and Parquet, local or
``gs://`` (a cached, checked copy), one record at a time with its line, and every problem located as
``file:line: problem`` (:class:`DataError`).

The lower half of the one data reader (:mod:`tpuft.data.examples` turns records into examples): the
controller's check before launch, every backend's trainer and ``tpuft predict``'s input read files through
:func:`read_rows`, so a bad record is reported the same way wherever it is met.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

BOM = b"\xef\xbb\xbf"


PARQUET_BATCH = 1024
"""Parquet rows converted to Python at a time (within one row group)."""


class DataError(ValueError):
    """A data file problem, located as ``where`` (file:line) and told as ``message``. ``missing`` is (side,
    field) when the problem is a field the line lacks: when every line lacks it, the recipe names the wrong
    field."""

    def __init__(
        self, where: str, message: str, missing: tuple[str, str] | None = None, fields: str = ""
    ) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message
        self.missing = missing
        self.fields = fields


def json_kind(value: Any) -> str:
    """A JSON value's kind in words, for the message that refuses it."""
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _lines(path: Path, gzipped: bool = False, where: str | None = None) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines as bytes, numbered from 1; the file is read as a stream (never whole)."""
    with gzip.open(path, "rb") if gzipped else path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(BOM):
                raise DataError(
                    f"{where or path}:1",
                    "the file starts with a byte-order mark (U+FEFF); save it as UTF-8 without BOM",
                )
            if raw.strip():
                yield number, raw


def _not_utf8(raw: bytes, exc: UnicodeDecodeError, path: Path | str, number: int) -> DataError:
    bad = raw[exc.start] if exc.start < len(raw) else 0
    return DataError(
        f"{path}:{number}", f"not UTF-8: byte 0x{bad:02x} at column {exc.start + 1} (save the file as UTF-8)"
    )


def parse_line(path: Path | str, number: int, raw: bytes) -> Any:
    """One line's JSON value. The fast path hands the bytes to json (which decodes UTF-8 itself); the slow
    path, only for a bad line, finds the exact byte or column to report."""
    if b"\x00" in raw:
        raise DataError(f"{path}:{number}", "contains a NUL byte (is the file UTF-16? save it as UTF-8)")
    try:
        return json.loads(raw.decode("utf-8"))  # str, not bytes: json's encoding detection costs 15 %
    except UnicodeDecodeError as exc:
        raise _not_utf8(raw, exc, path, number) from None
    except json.JSONDecodeError:
        try:
            # the column as the line shows it, without its newline
            json.loads(raw.decode("utf-8").rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}", f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        raise DataError(f"{path}:{number}", "not valid JSON") from None
    except RecursionError:
        raise DataError(f"{path}:{number}", "not valid JSON: nested too deeply") from None


class Row(NamedTuple):
    """One record of a data file as read, before it becomes an example."""

    index: int
    """0-based among the file's records (non-blank lines, CSV/TSV rows after the header, Parquet rows)."""
    line: int
    """1-based line in the file (the header is line 1 of a CSV/TSV file); a Parquet file's 1-based row."""
    record: Any
    """The record (a dict for CSV, TSV and Parquet; any JSON value for a line), or the :class:`DataError` that
    says why this one cannot be read: a check goes on past it."""
    size: int
    """Bytes it took in the file (about, for CSV/TSV and Parquet): for progress."""


FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
"""File suffix -> format (``data.format: auto``); the text formats may also end in ``.gz``."""


FORMAT_NAMES = ("jsonl", "csv", "tsv", "parquet")


def file_format(name: Path | str, declared: str = "auto") -> tuple[str, bool]:
    """(format, gzipped) of a data file: ``declared`` (``data.format``) unless ``auto``, else by its
    suffix."""
    text = str(name).rstrip("/")
    base = text[:-3] if text.lower().endswith(".gz") else text
    gzipped = base != text
    if declared != "auto":
        kind = declared
    else:
        suffix = Path(base).suffix.lower()
        if suffix not in FORMATS:
            raise DataError(
                text,
                f"unknown data format {suffix or '(no suffix)'!r}: name the file .jsonl, .json, "
                ".csv, .tsv or .parquet (.gz for a compressed text file), or set data.format",
            )
        kind = FORMATS[suffix]
    if kind not in FORMAT_NAMES:
        raise DataError(text, f"unknown data format {kind!r} (expected one of {', '.join(FORMAT_NAMES)})")
    if gzipped and kind == "parquet":
        raise DataError(text, "a Parquet file compresses its own columns: do not gzip it")
    return kind, gzipped


def read_rows(
    path: Path | str, data_format: str = "auto", *, keep: Callable[[int], bool] | None = None
) -> Iterator[Row]:
    """Every record of a data file in order, streamed (JSON lines and CSV/TSV a line at a time, Parquet a
    batch of a row group at a time), whatever its format: the one reader of every backend's data files, the
    controller's check and ``tpuft predict``'s input. ``path`` may be ``gs://``: read from a cached copy
    (:func:`local_copy`), named by its URL in messages. ``keep(index)`` False skips a record unparsed (a
    worker's shard of a big JSON-lines file parses only its own lines). A problem with one record comes as its
    row's ``record``; a problem with the whole file (format, byte-order mark, broken quoting, not Parquet) is
    raised."""
    where = str(path)
    kind, gzipped = file_format(where, data_format)
    local = local_copy(where)
    if kind == "jsonl":
        yield from _json_rows(local, gzipped, where, keep)
    elif kind == "parquet":
        yield from _parquet_rows(local, where, keep)
    else:
        yield from _delimited_rows(local, kind, gzipped, where, keep)


def iter_records(path: Path | str, data_format: str = "auto") -> Iterator[tuple[int, Any]]:
    """(line, record) of every record of a data file; the first bad one raises its located
    :class:`DataError`."""
    for row in read_rows(path, data_format):
        if isinstance(row.record, DataError):
            raise row.record
        yield row.line, row.record


def _text_lines(handle: IO[bytes], where: str) -> Iterator[str]:
    """The file's lines decoded one by one, so that a byte that is not UTF-8 is located at its line (a
    text-mode file decodes ahead, in blocks); a byte-order mark (spreadsheets write one) is dropped."""
    for number, raw in enumerate(handle, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(raw, exc, where, number) from None
        yield text[1:] if number == 1 and text.startswith("\ufeff") else text


def _json_rows(path: Path, gzipped: bool, where: str, keep: Callable[[int], bool] | None) -> Iterator[Row]:
    for index, (number, raw) in enumerate(_lines(path, gzipped, where)):
        if keep is not None and not keep(index):
            continue
        try:
            record = parse_line(where, number, raw)
        except DataError as exc:
            record = exc
        yield Row(index, number, record, len(raw))


def _delimited_rows(
    path: Path, kind: str, gzipped: bool, where: str, keep: Callable[[int], bool] | None
) -> Iterator[Row]:
    """CSV (RFC 4180: quoted fields may hold commas, quotes doubled, newlines) or TSV as GLUE writes it: a tab
    between fields and no quoting at all, so a ``"`` is a character of the text (SST-2's sentences have them
    unpaired). The first row names the columns; every value is text."""
    tsv = kind == "tsv"
    quoting = csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL
    with gzip.open(path, "rb") if gzipped else path.open("rb") as handle:
        reader = csv.reader(
            _text_lines(handle, where), delimiter="\t" if tsv else ",", quoting=quoting, strict=not tsv
        )
        header: list[str] | None = None
        index, ended = 0, 0
        while True:
            start = ended + 1
            try:
                values = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise DataError(f"{where}:{reader.line_num}", f"not valid {kind.upper()}: {exc}") from None
            ended = reader.line_num
            if not values or values == [""]:  # a blank line, as in JSON lines
                continue
            if header is None:
                header = _header(values, where, start)
                continue
            if keep is not None and not keep(index):
                index += 1
                continue
            size = sum(len(value) + 1 for value in values)
            if len(values) != len(header):
                inside = "a tab inside a value" if tsv else "an unquoted comma inside a value"
                record: Any = DataError(
                    f"{where}:{start}", f"has {len(values)} column(s), the header {len(header)} ({inside}?)"
                )
            else:
                record = dict(zip(header, values))
            yield Row(index, start, record, size)
            index += 1


def _header(values: list[str], where: str, line: int) -> list[str]:
    seen: set[str] = set()
    for name in values:
        if name in seen:
            raise DataError(f"{where}:{line}", f"the header names column {name!r} twice")
        seen.add(name)
    return values


def _parquet_rows(path: Path, where: str, keep: Callable[[int], bool] | None) -> Iterator[Row]:
    """A row group at a time, in batches: never the whole file in memory. Nested columns (structs) are dicts
    that dotted fields reach into, as in JSON."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            where,
            f"reading Parquet needs pyarrow, which this Python ({sys.executable}) lacks: "
            "use JSON lines, CSV or TSV on this backend, or add pyarrow to its worker venv",
        ) from None
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(where, f"not a Parquet file: {exc}") from None
    index = 0
    with parquet:
        for group in range(parquet.num_row_groups):
            meta = parquet.metadata.row_group(group)
            stored = sum(meta.column(column).total_compressed_size for column in range(meta.num_columns))
            size = stored // max(meta.num_rows, 1)
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, row_groups=[group]):
                wanted = (
                    range(batch.num_rows)
                    if keep is None
                    else [i for i in range(batch.num_rows) if keep(index + i)]
                )
                chosen = batch if keep is None else batch.take(pa.array(list(wanted), pa.int64()))
                for offset, record in zip(wanted, chosen.to_pylist()):
                    yield Row(index + offset, index + offset + 1, record, size)
                index += batch.num_rows


def cache_folder(url: str) -> Path:
    """Where a ``gs://`` data file, predict input or model is downloaded to: ``$TPUFT_PREDICT_CACHE`` (default
    ``~/.cache/tpuft/predict``), one folder per URL, kept (an intact file is not fetched again: a resumed run
    or job, or the next read of the same file, costs a listing)."""
    root = Path(os.environ.get("TPUFT_PREDICT_CACHE", "~/.cache/tpuft/predict")).expanduser()
    return root / hashlib.sha256(url.encode()).hexdigest()[:16]


def local_copy(url: str) -> Path:
    """A data file as a file on this machine: itself, or a ``gs://`` object's cached download (checked against
    the bucket's size and CRC32C). A copy, not a stream of the object: a file is read more than once (the
    controller's check, a worker's shard, the eval and test sets, T5X's dataset), a dropped connection cannot
    cut a read short, and the text formats need no seekable remote reader."""
    if not url.startswith("gs://"):
        return Path(url).expanduser()
    from tpuft.storage import GcsStorage

    parent, _, name = url.rstrip("/").rpartition("/")
    if not name or parent == "gs:":
        raise DataError(url, "a gs:// data file must name an object (gs://bucket/path/file.jsonl)")
    folder = cache_folder(url)
    transfer = GcsStorage.from_url(parent).fetch_tree("", folder, include=lambda rel: rel == name)
    if transfer.files == 0:
        raise DataError(url, "no such object")
    return folder / name
