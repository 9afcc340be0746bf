"""Reading a Hugging Face split for :mod:`tpuft.worker.hf_data`: loading it (a ``save_to_disk`` folder, a hub
id, a builder over data files), cutting it into the readers' disjoint parts (whole files, every
``readers``-th example, or row ranges of a dataset on disk), reading one reader's part in its epoch's order
through the bounded shuffle buffer, and counting a part for an exact resume.

Apart from :mod:`tpuft.worker.hf_data` because it is about a split and its files, one reader at a time: it
knows nothing of replicas, batches, positions or data-loader processes, which is what hf_data builds on it.
The design (who reads what, in which order, and why) is told in hf_data's docstring.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator
from typing import Any

from tpuft import data as data_mod
from tpuft.data import DataError, Example

EPOCH_END = "<epoch end>"
"""What a reader gives after its part of an epoch (the next epoch's part follows)."""
READ_BATCH = 1000
"""Rows per Arrow batch read from the dataset (one dict per row is built from it)."""
FILES_PER_READER = 16
"""With at least this many files per reader, whole files are dealt out even when they do not divide evenly."""
SLICES = 64
"""A reader's rows of an on-disk dataset are read in this many slices, in a new order every epoch."""


def split_label(hf: Any, split: str) -> str:
    """How messages name the split: ``hf:PATH/NAME[SPLIT]``."""
    return f"hf:{hf.path}{'/' + hf.name if hf.name else ''}[{split}]"


def load_split(hf: Any, split: str) -> Any:
    """The split: a ``save_to_disk`` folder (``load_from_disk``), or ``load_dataset`` of a hub id, a folder of
    data files or a builder (json, csv, parquet, text) over ``data_files`` (a list: the files of
    ``hf.split``)."""
    import datasets

    datasets.disable_progress_bars()
    if os.path.isdir(hf.path) and any(
        os.path.isfile(os.path.join(hf.path, name)) for name in ("dataset_dict.json", "state.json")
    ):
        loaded = datasets.load_from_disk(hf.path)
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(
                    split_label(hf, split),
                    f"the dataset folder has no split {split!r} (it has: {', '.join(loaded) or 'none'})",
                )
            return loaded[split]
        if split != hf.split:
            raise DataError(
                split_label(hf, split),
                "the dataset folder holds one split (saved from a Dataset, not a "
                f"DatasetDict): it is data.hf.split {hf.split!r}",
            )
        return loaded
    files: Any = hf.data_files or None
    if isinstance(files, list):
        files = {hf.split: files}
    return datasets.load_dataset(
        hf.path, hf.name, split=split, data_files=files, streaming=hf.streaming, revision=hf.revision
    )


def whole_files(shards: int, readers: int) -> bool:
    """Whether ``shards`` files are dealt out to ``readers`` whole (else every ``readers``-th example)."""
    return shards >= readers and (shards % readers == 0 or shards >= FILES_PER_READER * readers)


def part_records(
    dataset: Any, label: str, reader: int, readers: int, rng: random.Random | None
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(where, line, record) of ``reader``'s part of the split; its files (or slices) in ``rng``'s order, or
    in the split's order when ``rng`` is None."""
    import datasets

    if isinstance(dataset, datasets.Dataset):  # on disk, random access: a contiguous range of rows per reader
        rows = len(dataset)
        low, high = rows * reader // readers, rows * (reader + 1) // readers
        count = max(1, min(SLICES, high - low))
        slices = [
            (low + (high - low) * i // count, low + (high - low) * (i + 1) // count) for i in range(count)
        ]
        if rng is not None:
            rng.shuffle(slices)
        for start, stop in slices:
            if stop > start:
                yield from _rows(dataset.select(range(start, stop)), label, base=start)
        return
    shards = dataset.num_shards
    files = _shard_files(dataset, shards)

    def shard(index: int) -> tuple[Any, str]:
        where = f"{label} {files[index]}" if files else f"{label} shard {index + 1} of {shards}"
        return (dataset.shard(num_shards=shards, index=index) if shards > 1 else dataset), where

    if whole_files(shards, readers):
        mine = list(range(reader, shards, readers))
        if rng is not None:
            rng.shuffle(mine)
        for index in mine:
            yield from _rows(*shard(index))
        return
    # the split's example index of the next file's first record; the reader keeps seen % readers == reader
    seen = 0
    for index in range(shards):
        seen += yield from _rows(*shard(index), every=readers, first=(reader - seen) % readers)


def _rows(
    dataset: Any, where: str, *, base: int = 0, every: int = 1, first: int = 0
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Rows ``first``, ``first + every``, ... of ``dataset`` as (where, base + row + 1, record), read in Arrow
    batches; returns how many rows the dataset has."""
    rows = 0
    for batch in dataset.iter(batch_size=READ_BATCH):
        names = list(batch)
        columns = [batch[name] for name in names]
        size = len(columns[0]) if columns else 0
        start = first - rows if rows <= first else (first - rows) % every
        for i in range(start, size, every):
            yield where, base + rows + i + 1, dict(zip(names, [column[i] for column in columns]))
        rows += size
    return rows


def _shard_files(dataset: Any, shards: int) -> list[str] | None:
    """The file behind each shard of a builder's stream, for error messages (best effort: ``datasets`` keeps
    them in a private attribute; without them a record is located by shard number)."""
    try:
        kwargs = dataset._ex_iterable.kwargs
        for key in ("original_files", "files"):
            files = kwargs.get(key)
            if isinstance(files, list) and len(files) == shards and all(isinstance(f, str) for f in files):
                return files
    except Exception:  # noqa: BLE001 - only a nicer message is lost
        pass
    return None


def _buffer_shuffle(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A bounded shuffle: keep ``size`` items, give a random one of them for each new one (memory: ``size``
    records)."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        index = rng.randrange(size)
        buffer[index], item = item, buffer[index]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def reader_examples(
    cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int
) -> Iterator[Example | str]:
    """Reader ``reader``'s part, epoch after epoch from ``epoch`` (whose first ``skip`` examples are left
    out), with EPOCH_END after each epoch's part."""
    hf = cfg.hf
    fields = data_mod.Fields.of(cfg)
    dataset = load_split(hf, hf.split)
    label = split_label(hf, hf.split)
    for current in itertools.count(epoch):
        rng = random.Random(f"tpuft-data/{seed}/{current}/{reader}") if cfg.shuffle else None
        records: Iterator[tuple[str, int, dict[str, Any]]] = part_records(
            dataset, label, reader, readers, rng
        )
        if rng is not None and hf.shuffle_buffer > 1:
            records = _buffer_shuffle(records, hf.shuffle_buffer, rng)
        left = skip if current == epoch else 0
        for where, line, record in records:
            example = data_mod.make_example(record, line=line, path=where, fields=fields)
            if example is None:
                continue
            if left:
                left -= 1
                continue
            yield example
        yield EPOCH_END


def count_examples(cfg: Any, reader: int, readers: int, cap: int) -> int:
    """The examples of ``reader``'s part (after data.preprocess drops), counting no further than ``cap``."""
    hf = cfg.hf
    fields = data_mod.Fields.of(cfg)
    count = 0
    for where, line, record in part_records(
        load_split(hf, hf.split), split_label(hf, hf.split), reader, readers, None
    ):
        if data_mod.make_example(record, line=line, path=where, fields=fields) is not None:
            count += 1
            if count >= cap:
                break
    return count
