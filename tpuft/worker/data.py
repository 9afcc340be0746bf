"""Text-to-text examples from JSON lines, sharded by worker.

Sharding is by line number (line i goes to worker i mod N) while streaming the file, so each worker reads the file
once, holds only its own shard, and the shards are disjoint and together cover every example. Framework-free: the
trainer tokenizes.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Example:
    source: str
    target: str
    line: int
    """1-based line number in the file, for error messages and for checking shards."""


class DataError(ValueError):
    """A data file problem, located as file:line."""


def _lookup(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(dotted)
        value = value[part]
    return value


class _TemplateFormatter(string.Formatter):
    """``{a.b}`` reaches into nested JSON objects (not attributes); a missing field raises KeyError by name."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        return _lookup(kwargs, field_name), field_name


_FORMATTER = _TemplateFormatter()


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def make_example(
    record: Any,
    *,
    line: int,
    path: Path,
    source_field: str = "source",
    target_field: str = "target",
    source_template: str | None = None,
    target_template: str | None = None,
    prefix: str = "",
) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{path}:{line}: expected a JSON object, got {type(record).__name__}")

    def build(template: str | None, field: str, what: str) -> str:
        try:
            if template is not None:
                return _FORMATTER.vformat(template, (), record)
            value = _lookup(record, field)
        except KeyError as exc:
            raise DataError(
                f"{path}:{line}: {what}: no field {exc.args[0]!r} (fields: {', '.join(map(str, record))})"
            ) from None
        return value if isinstance(value, str) else json.dumps(value) if not isinstance(value, (int, float)) else str(value)

    return Example(
        source=prefix + build(source_template, source_field, "source"),
        target=build(target_template, target_field, "target"),
        line=line,
    )


def iter_shard(path: Path, worker: int, num_workers: int, **fields: Any) -> Iterator[Example]:
    """Stream ``path`` and yield this worker's examples (non-blank lines whose index i has i % N == worker)."""
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} out of range for {num_workers} workers")
    index = 0
    with path.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            mine = index % num_workers == worker
            index += 1
            if not mine:
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON: {exc.msg}") from None
            yield make_example(record, line=number, path=path, **fields)


def load_shard(path: Path, worker: int, num_workers: int, **fields: Any) -> list[Example]:
    shard = list(iter_shard(path, worker, num_workers, **fields))
    if not shard:
        raise DataError(f"{path}: worker {worker} of {num_workers} got no examples (the file has too few lines)")
    return shard


def batches(examples: list[Example], batch_size: int, seed: int, shuffle: bool = True) -> Iterator[list[Example]]:
    """Endless batches over the shard, reshuffled every epoch; a batch may wrap into the next epoch."""
    order: list[Example] = []
    epoch = 0
    while True:
        batch: list[Example] = []
        while len(batch) < batch_size:
            if not order:
                order = list(examples)
                if shuffle:
                    random.Random(seed * 1_000_003 + epoch).shuffle(order)
                epoch += 1
            batch.append(order.pop())
        yield batch
