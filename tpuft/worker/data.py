"""Text-to-text examples from data files (JSON lines, CSV, TSV, Parquet; local or ``gs://``): checked on the
controller, sharded by worker on the workers.

One reader (:func:`read_rows`) for both sides and every backend, so a bad record is reported the same way
wherever it is met: ``file:line: problem``.
The controller streams the whole file before anything is created or launched (``check_file``: seconds for a
big file, memory for one line at a time); a worker streams it again and keeps only its own shard.

Sharding is by record (non-blank line or row i goes to worker i mod N) while streaming, so each worker reads
the file once, holds only its own shard, and the shards are disjoint and together cover every example.

What counts as text: a JSON string, or a number (``"label": 1`` becomes ``"1"``). ``null``,
``true``/``false``, ``NaN``, lists and objects are refused: training on the text ``"null"`` or ``"nan"`` is
never what was meant. Framework-free: the trainer tokenizes.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import os
import random
import string
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

BOM = b"\xef\xbb\xbf"
MAX_PROBLEMS = 10
"""A file with a systematic problem would repeat it on every line: show the first few, then count."""
PARQUET_BATCH = 1024
"""Parquet rows converted to Python at a time (within one row group)."""


@dataclass(frozen=True, slots=True)
class Example:
    source: str
    target: str
    line: int
    """1-based line number in the file, for error messages and for checking shards."""


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


@dataclass(frozen=True)
class Fields:
    """How an example is built from a JSON object (the recipe's ``data`` keys)."""

    source_field: str = "source"
    target_field: str = "target"
    source_template: str | None = None
    target_template: str | None = None
    prefix: str = ""
    source_transform: Callable[[str], str] | None = None
    """``data.source_transforms`` in order (before the prefix is put in front)."""
    target_transform: Callable[[str], str] | None = None
    preprocess: Callable[[dict[str, Any]], Any] | None = None
    """``data.preprocess``: the record to use instead, or None to drop the example."""
    preprocess_name: str = ""
    data_format: str = "auto"
    """``data.format``: the files' format, or ``auto`` (by each file's suffix)."""

    @classmethod
    def of(cls, data_config: Any) -> Fields:
        from tpuft.worker.text_transforms import load_preprocess, text_transform

        label_field = getattr(
            data_config, "label_field", None
        )  # classification: the label is the target text
        hook = getattr(data_config, "preprocess", None)
        return cls(
            source_field=data_config.source_field,
            target_field=label_field or data_config.target_field,
            source_template=data_config.source_template,
            target_template=data_config.target_template,
            prefix=data_config.prefix,
            source_transform=text_transform(getattr(data_config, "source_transforms", [])),
            target_transform=text_transform(getattr(data_config, "target_transforms", [])),
            preprocess=load_preprocess(hook) if hook else None,
            preprocess_name=hook or "",
            data_format=getattr(data_config, "format", "auto"),
        )


def _lookup(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


def _text_problem(value: Any) -> str | None:
    if isinstance(value, str):
        return None
    if value is None:
        return "is null"
    if isinstance(value, bool):
        return f"is {str(value).lower()}, not text"
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value}, not text"
    if isinstance(value, (int, float)):
        return None
    return f"is a JSON {'list' if isinstance(value, list) else 'object'}, not text"


class _TemplateFormatter(string.Formatter):
    """``{a.b}`` reaches into nested JSON objects (not attributes); a missing field raises KeyError by
    name."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        value = _lookup(kwargs, field_name)
        problem = _text_problem(value)
        if problem:
            raise TypeError(f"field {field_name!r} {problem}")
        return value, field_name


_FORMATTER = _TemplateFormatter()


def make_example(record: Any, *, line: int, path: Path | str, fields: Fields = Fields()) -> Example | None:
    """The example of one JSON record; None when ``data.preprocess`` drops it."""
    if type(record) is not dict:
        raise DataError(f"{path}:{line}", f"expected a JSON object, got {_json_kind(record)}")
    if fields.preprocess is not None:
        record = _preprocessed(record, fields, path, line)
        if record is None:
            return None
    source = _build(record, fields.source_template, fields.source_field, "source", path, line)
    target = _build(record, fields.target_template, fields.target_field, "target", path, line)
    if fields.source_transform is not None:
        source = fields.source_transform(source)
    if fields.target_transform is not None:
        target = fields.target_transform(target)
    return Example(fields.prefix + source, target, line)


def _preprocessed(
    record: dict[str, Any], fields: Fields, path: Path | str, line: int
) -> dict[str, Any] | None:
    assert fields.preprocess is not None
    try:
        out = fields.preprocess(
            dict(record)
        )  # a copy: a hook that edits in place cannot change the caller's record
    except Exception as exc:
        raise DataError(
            f"{path}:{line}", f"data.preprocess {fields.preprocess_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    if out is not None and type(out) is not dict:
        raise DataError(
            f"{path}:{line}",
            f"data.preprocess {fields.preprocess_name} returned "
            f"{_json_kind(out)}; expected a record (a dict) or None to drop the example",
        )
    return out


def _build(record: dict[str, Any], template: str | None, name: str, what: str, path: Path, line: int) -> str:
    """One side of an example. The plain field is the hot path (every line of every file): no closure, no
    split for a name without dots, and a string returned as it is."""
    try:
        if template is not None:
            return _FORMATTER.vformat(template, (), record)
        value = record[name] if name in record else _lookup(record, name)
    except KeyError as exc:
        present = ", ".join(map(str, record)) or "none"
        message = f"{what}: no field {exc.args[0]!r} (fields: {present})"
        raise DataError(f"{path}:{line}", message, missing=(what, exc.args[0]), fields=present) from None
    except (TypeError, ValueError) as exc:  # a null field, or a format spec that does not fit the value
        raise DataError(f"{path}:{line}", f"{what} template: {exc}") from None
    if type(value) is str:
        return value
    problem = _text_problem(value)
    if problem:
        raise DataError(f"{path}:{line}", f"{what} field {name!r} {problem}")
    return str(value)


def _json_kind(value: Any) -> str:
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
            json.loads(
                raw.decode("utf-8").rstrip("\r\n")
            )  # the column as the line shows it, without its newline
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}", f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        raise DataError(f"{path}:{number}", "not valid JSON") from None
    except RecursionError:
        raise DataError(f"{path}:{number}", "not valid JSON: nested too deeply") from None


def iter_shard(
    path: Path | str, worker: int, num_workers: int, fields: Fields = Fields()
) -> Iterator[Example]:
    """Stream ``path`` and yield this worker's examples (records whose index i has i % N == worker)."""
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} out of range for {num_workers} workers")
    mine = (lambda index: index % num_workers == worker) if num_workers > 1 else None
    for row in read_rows(path, fields.data_format, keep=mine):
        if isinstance(row.record, DataError):
            raise row.record
        example = make_example(row.record, line=row.line, path=path, fields=fields)
        if example is not None:
            yield example


def load_shard(path: Path | str, worker: int, num_workers: int, fields: Fields = Fields()) -> list[Example]:
    shard = list(iter_shard(path, worker, num_workers, fields))
    if not shard:
        raise DataError(
            str(path), f"worker {worker} of {num_workers} got no examples (the file has too few records)"
        )
    return shard


@dataclass
class FileCheck:
    """What the controller found reading a whole data file."""

    path: Path
    examples: int = 0
    problems: list[DataError] = field(default_factory=list)
    more_problems: int = 0
    missing: set[tuple[str, str]] = field(default_factory=set)
    """(side, field) of every "no field" problem, listed or not."""
    """Problems beyond the first ``MAX_PROBLEMS``, counted but not listed."""
    bytes_read: int = 0
    dropped: int = 0
    """Records ``data.preprocess`` dropped."""


def check_file(path: Path | str, fields: Fields, *, progress: Any = None) -> FileCheck:
    """Read every record as a worker would, collecting located problems instead of stopping at the first.
    ``progress(bytes_done, bytes_total)`` is called now and then for a long file."""
    check = FileCheck(Path(path) if not str(path).startswith("gs://") else path)  # type: ignore[arg-type]
    next_report = 1 << 24
    try:
        total = local_copy(str(path)).stat().st_size
        for row in read_rows(path, fields.data_format):
            check.bytes_read += row.size
            if progress is not None and check.bytes_read >= next_report:
                progress(check.bytes_read, total)
                next_report += 1 << 24
            try:
                if isinstance(row.record, DataError):
                    raise row.record
                example = make_example(row.record, line=row.line, path=path, fields=fields)
            except DataError as exc:
                _note(check, exc)
                continue
            if example is None:
                check.dropped += 1
            else:
                check.examples += 1
    except DataError as exc:  # the whole file: its format, a byte-order mark, broken quoting, not Parquet
        _note(check, exc)
    except OSError as exc:
        _note(check, DataError(str(path), f"cannot read: {exc.strerror or exc}"))
    return check


def _note(check: FileCheck, problem: DataError) -> None:
    if problem.missing is not None:
        check.missing.add(problem.missing)
    if len(check.problems) < MAX_PROBLEMS:
        check.problems.append(problem)
    else:
        check.more_problems += 1


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


def batches(
    examples: list[Example], batch_size: int, seed: int, shuffle: bool = True, *, consumed: int = 0
) -> Iterator[list[Example]]:
    """Endless batches over the shard, reshuffled every epoch; a batch may wrap into the next epoch.

    ``consumed``: start after that many examples of the stream, as if they had been drawn (a resumed run
    continues where its checkpoint left the data). Each epoch's order is a function of the seed and the epoch
    alone, so the position is found by arithmetic, not by replaying the stream."""
    if not examples:
        raise ValueError("no examples to batch")
    if consumed < 0:
        raise ValueError(f"consumed must be >= 0, got {consumed}")
    epoch, done = divmod(consumed, len(examples))
    order = _epoch_order(examples, seed, epoch, shuffle)
    del order[len(order) - done :]  # examples are drawn from the end
    epoch += 1
    while True:
        batch: list[Example] = []
        while len(batch) < batch_size:
            if not order:
                order = _epoch_order(examples, seed, epoch, shuffle)
                epoch += 1
            batch.append(order.pop())
        yield batch


def _epoch_order(examples: list[Example], seed: int, epoch: int, shuffle: bool = True) -> list[Example]:
    """Epoch ``epoch``'s order of the shard, drawn from its end (:func:`batches` pops)."""
    order = list(examples)
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def keep_tokens(ids: list[int], limit: int, mode: str) -> list[int]:
    """At most ``limit`` of ``ids``: the first ones (``head``), the last ones (``tail``), or the first and the
    last half (``head+tail``; the head gets the odd one), as data.truncation says."""
    if len(ids) <= limit:
        return ids
    if mode == "tail":
        return ids[len(ids) - limit :] if limit else []
    if mode == "head+tail":
        tail = limit // 2
        return ids[: limit - tail] + (ids[len(ids) - tail :] if tail else [])
    return ids[:limit]


def encode_texts(
    tokenizer: Any, texts: list[str], limit: int, mode: str
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids and attention masks of ``texts`` padded to exactly ``limit`` (static shapes), the special
    tokens kept (T5's EOS, BERT's [CLS] and [SEP]) and the text truncated as ``mode`` says. ``tokenizer``: a
    Hugging Face tokenizer (any framework)."""
    if mode == "head":  # the tokenizer's own truncation keeps the head, and is faster
        enc = tokenizer(texts, max_length=limit, padding="max_length", truncation=True)
        return enc["input_ids"], enc["attention_mask"]
    room = max(limit - tokenizer.num_special_tokens_to_add(), 0)
    pad = tokenizer.pad_token_id or 0
    ids_out, masks = [], []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids = tokenizer.build_inputs_with_special_tokens(keep_tokens(ids, room, mode))[:limit]
        ids_out.append(ids + [pad] * (limit - len(ids)))
        masks.append([1] * len(ids) + [0] * (limit - len(ids)))
    return ids_out, masks


def load_tokenizer(name: str) -> Any:
    """The recipe's ``model.tokenizer``: ``byt5`` (bytes, no files) or a Hugging Face id / local dir."""
    if name == "byt5":
        from transformers import ByT5Tokenizer

        return ByT5Tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
