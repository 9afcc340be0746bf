"""Text-to-text examples from data files (JSON lines, CSV, TSV, Parquet; local or ``gs://``): checked on the
controller, sharded by worker on the workers.

One reader for both sides and every backend, so a bad record is reported the same way wherever it is met:
``file:line: problem``. Files are read by :mod:`tpuft.data.files` (:func:`~tpuft.data.files.read_rows`); this
module turns their records into examples (fields, templates, transforms, the text checks), shards them, checks
a whole file, batches a shard and encodes its texts.
The controller streams the whole file before anything is created or launched (``check_file``: seconds for a
big file, memory for one line at a time); a worker streams it again and keeps only its own shard.

Sharding is by record (non-blank line or row i goes to worker i mod N) while streaming, so each worker reads
the file once, holds only its own shard, and the shards are disjoint and together cover every example.

What counts as text: a JSON string, or a number (``"label": 1`` becomes ``"1"``). ``null``,
``true``/``false``, ``NaN``, lists and objects are refused: training on the text ``"null"`` or ``"nan"`` is
never what was meant. Framework-free: the trainer tokenizes.
"""

from __future__ import annotations

import math
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuft.data.files import DataError, json_kind, local_copy, read_rows

MAX_PROBLEMS = 10
"""A file with a systematic problem would repeat it on every line: show the first few, then count."""


@dataclass(frozen=True, slots=True)
class Example:
    source: str
    target: str
    line: int
    """1-based line number in the file, for error messages and for checking shards."""


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
        from tpuft.data.text_transforms import load_preprocess, text_transform

        # classification: the label is the target text
        label_field = getattr(data_config, "label_field", None)
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
        raise DataError(f"{path}:{line}", f"expected a JSON object, got {json_kind(record)}")
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
        # a copy: a hook that edits in place cannot change the caller's record
        out = fields.preprocess(dict(record))
    except Exception as exc:  # noqa: BLE001 - the user's hook may raise anything: located, not a traceback
        raise DataError(
            f"{path}:{line}", f"data.preprocess {fields.preprocess_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    if out is not None and type(out) is not dict:
        raise DataError(
            f"{path}:{line}",
            f"data.preprocess {fields.preprocess_name} returned "
            f"{json_kind(out)}; expected a record (a dict) or None to drop the example",
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
                note_problem(check, exc)
                continue
            if example is None:
                check.dropped += 1
            else:
                check.examples += 1
    except DataError as exc:  # the whole file: its format, a byte-order mark, broken quoting, not Parquet
        note_problem(check, exc)
    except OSError as exc:
        note_problem(check, DataError(str(path), f"cannot read: {exc.strerror or exc}"))
    return check


def note_problem(check: FileCheck, problem: DataError) -> None:
    """Count one problem of a file check: the first :data:`MAX_PROBLEMS` are listed, the rest counted, and a
    missing field is remembered (every line lacking it means the recipe names the wrong field)."""
    if problem.missing is not None:
        check.missing.add(problem.missing)
    if len(check.problems) < MAX_PROBLEMS:
        check.problems.append(problem)
    else:
        check.more_problems += 1


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
