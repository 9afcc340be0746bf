"""Training batches for the PyTorch/XLA trainer, from JSON lines or a Hugging Face dataset, with a resumable position.

JSON lines (``data.train``): each replica keeps its shard in memory (line i goes to replica i mod N) and draws endless
reshuffled epochs from it (:func:`tpuft.worker.data.batches`); the position is the number of examples drawn.

A Hugging Face dataset (``data.hf``) is read as a stream and never held whole. The split is cut into ``readers =
replicas x max(1, loader_workers)`` disjoint parts that together cover it: whole files when the split has a multiple
of ``readers`` files (each reader opens only its own), else every ``readers``-th example (each reader scans the
stream and keeps its own). A replica's readers are its data-loader processes (``loader_workers``; 0 reads in the
trainer's process); the replica takes one example from each reader in turn, in a fixed order, skipping readers that
are done, and an epoch ends when all are. Each reader shuffles its part per epoch from (seed, epoch, reader): file
order plus a bounded buffer (``shuffle_buffer``), so memory stays flat whatever the dataset's size.

The position (saved in each checkpoint's ``trainer_state.json``) is the epoch, how many examples each reader has
given in it, and whose turn is next. A resumed stream restarts every reader at the start of that epoch and skips
what it had given: the same examples follow, in the same order, at the cost of reading the epoch up to there again.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_mod
import random
from collections.abc import Iterator
from typing import Any

from tpuft.worker import data as data_mod

END = "__end__"
"""What a reader process sends after its part of an epoch (then it exits)."""
QUEUE_DEPTH = 2048
"""Examples a reader process keeps ready; bounded, so a fast reader cannot fill the host's memory."""


# ----------------------------------------------------------------------------------------------------------------
# JSON lines


class JsonlStream:
    """Today's JSON-lines stream (a replica's shard in memory, reshuffled per epoch) with a position."""

    def __init__(self, cfg: Any, *, rank: int, world: int, local_batch: int, seed: int, position: dict | None) -> None:
        shard = data_mod.load_shard(cfg.train, rank, world, data_mod.Fields.of(cfg))
        self.consumed = int((position or {}).get("consumed", 0))
        self._batches = data_mod.batches(shard, local_batch, seed + 7919 * rank, cfg.shuffle, consumed=self.consumed)
        self.examples = len(shard)

    def __iter__(self) -> JsonlStream:
        return self

    def __next__(self) -> list[data_mod.Example]:
        batch = next(self._batches)
        self.consumed += len(batch)
        return batch

    def position(self) -> dict[str, Any]:
        return {"consumed": self.consumed}

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face datasets


def load_split(hf: Any, split: str) -> Any:
    """The split as an (iterable) dataset: a ``save_to_disk`` folder, or ``load_dataset`` of a hub id, a folder of
    data files or a builder (json, csv, parquet, text) over ``data_files``."""
    import os

    import datasets

    datasets.disable_progress_bars()
    if os.path.isdir(hf.path) and os.path.isfile(os.path.join(hf.path, "dataset_dict.json")) or (
        os.path.isdir(hf.path) and os.path.isfile(os.path.join(hf.path, "state.json"))
    ):
        loaded = datasets.load_from_disk(hf.path)
        dataset = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return dataset.to_iterable_dataset(num_shards=max(1, min(64, len(dataset)))) if hf.streaming else dataset
    files: Any = hf.data_files or None
    if isinstance(files, list):
        files = {split: files}
    return datasets.load_dataset(hf.path, hf.name, split=split, data_files=files, streaming=hf.streaming,
                                 revision=hf.revision)


def _records(dataset: Any, reader: int, readers: int, seed: int, epoch: int, shuffle: bool, buffer: int
             ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, record) of ``reader``'s part of the split for one epoch; the index numbers the part's records in the
    part's file order (the split's example index when parts are every ``readers``-th example)."""
    import datasets

    if not isinstance(dataset, datasets.IterableDataset):
        dataset = dataset.to_iterable_dataset(num_shards=max(1, min(64, len(dataset))))
    shards = dataset.num_shards
    rng = random.Random((seed * 1_000_003 + epoch * 7919 + reader) % 2**32)  # (seed, epoch, reader)
    if shards >= readers and shards % readers == 0:  # whole files: each reader opens only its own
        part = dataset.shard(num_shards=readers, index=reader, contiguous=False)
        if shuffle:  # its files in a new order (the partition above does not depend on it)
            part = part.shuffle(seed=rng.randrange(2**32), buffer_size=1)
        numbered: Iterator[tuple[int, dict[str, Any]]] = enumerate(part)
    else:  # every readers-th example, in the dataset's order: each reader scans the stream, keeps its own
        numbered = ((i, r) for i, r in enumerate(dataset) if i % readers == reader)
    yield from _buffer_shuffle(numbered, buffer, rng) if shuffle else numbered


def _buffer_shuffle(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A bounded shuffle: keep ``size`` items, give a random one for each new one (memory: ``size`` records)."""
    if size <= 1:
        yield from items
        return
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


def _examples(cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int) -> Iterator[data_mod.Example]:
    hf = cfg.hf
    fields = data_mod.Fields.of(cfg)
    dataset = load_split(hf, hf.split)
    where = f"hf:{hf.path}[{hf.split}]"
    taken = 0
    buffer = hf.shuffle_buffer if cfg.shuffle else 0
    for index, record in _records(dataset, reader, readers, seed, epoch, cfg.shuffle, buffer):
        example = data_mod.make_example(dict(record), line=index + 1, path=where, fields=fields)
        if example is None:
            continue
        taken += 1
        if taken <= skip:
            continue
        yield example


def _reader_process(cfg_json: dict[str, Any], reader: int, readers: int, seed: int, epoch: int, skip: int,
                    out: Any) -> None:
    """A data-loader process: its part of one epoch into ``out``, then END (or the error, as text)."""
    from tpuft.config import DataConfig

    try:
        cfg = DataConfig.model_validate(cfg_json, context={"check_files": False})
        for example in _examples(cfg, reader, readers, seed, epoch, skip):
            out.put(example)
        out.put(END)
    except data_mod.DataError as exc:  # located at its record: the trainer re-raises it as it is
        out.put(("DataError", exc.where, exc.message))
    except BaseException as exc:  # the trainer reports it; a reader that dies silently would hang the replica
        out.put(f"{type(exc).__name__}: {exc}")


class _InProcessReader:
    def __init__(self, cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int) -> None:
        self._it = _examples(cfg, reader, readers, seed, epoch, skip)

    def get(self) -> data_mod.Example | None:
        return next(self._it, None)

    def close(self) -> None:
        pass


class _ProcessReader:
    def __init__(self, cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int) -> None:
        context = multiprocessing.get_context("spawn")  # the trainer's XLA runtime threads must not be forked
        self._queue = context.Queue(QUEUE_DEPTH)
        self._process = context.Process(
            target=_reader_process, daemon=True,
            args=(cfg.model_dump(mode="json"), reader, readers, seed, epoch, skip, self._queue),
        )
        self._process.start()
        self.reader = reader

    def get(self) -> data_mod.Example | None:
        while True:
            try:
                item = self._queue.get(timeout=60)
                break
            except queue_mod.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(f"data-loader process of reader {self.reader} died "
                                       f"(exit code {self._process.exitcode})") from None
        if isinstance(item, data_mod.Example):
            return item
        if item == END:
            self._process.join(timeout=30)
            return None
        if isinstance(item, tuple) and item[0] == "DataError":
            raise data_mod.DataError(item[1], item[2])
        raise RuntimeError(f"data-loader process of reader {self.reader}: {item}")

    def close(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=10)
        self._queue.cancel_join_thread()
        self._queue.close()


class HfStream:
    """Endless batches of ``local_batch`` examples from this replica's readers; see the module's docstring."""

    def __init__(self, cfg: Any, *, rank: int, world: int, local_batch: int, seed: int, position: dict | None) -> None:
        self.cfg, self.local_batch, self.seed = cfg, local_batch, seed
        self.per_replica = max(1, cfg.hf.loader_workers)
        self.readers = world * self.per_replica
        self.mine = [rank * self.per_replica + j for j in range(self.per_replica)]
        self.processes = cfg.hf.loader_workers > 0
        position = position or {}
        self.epoch = int(position.get("epoch", 0))
        self.taken = [int(x) for x in position.get("taken", [0] * self.per_replica)]
        self.turn = int(position.get("turn", 0))
        if len(self.taken) != self.per_replica:
            raise ValueError(f"the saved data position has {len(self.taken)} readers per replica and this run "
                             f"{self.per_replica} (data.hf.loader_workers changed): it cannot continue exactly")
        self._open()

    def _open(self) -> None:
        kind = _ProcessReader if self.processes else _InProcessReader
        self._live = [kind(self.cfg, reader, self.readers, self.seed, self.epoch, skip)
                      for reader, skip in zip(self.mine, self.taken)]
        self._done = [False] * self.per_replica
        self._epoch_examples = sum(self.taken)

    def __iter__(self) -> HfStream:
        return self

    def _next_example(self) -> data_mod.Example:
        while True:
            if all(self._done):  # the epoch is over: the next one, reshuffled
                if self._epoch_examples == 0:
                    raise data_mod.DataError(f"hf:{self.cfg.hf.path}[{self.cfg.hf.split}]",
                                             f"readers {self.mine} of {self.readers} got no examples (the split has "
                                             "too few for the replicas x data.hf.loader_workers)")
                self.close()
                self.epoch, self.taken, self.turn = self.epoch + 1, [0] * self.per_replica, 0
                self._open()
            index = self.turn
            self.turn = (self.turn + 1) % self.per_replica
            if self._done[index]:
                continue
            example = self._live[index].get()
            if example is None:
                self._done[index] = True
                continue
            self.taken[index] += 1
            self._epoch_examples += 1
            return example

    def __next__(self) -> list[data_mod.Example]:
        return [self._next_example() for _ in range(self.local_batch)]

    def position(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "taken": list(self.taken), "turn": self.turn}

    def close(self) -> None:
        for reader in getattr(self, "_live", []):
            reader.close()


def open_train_stream(cfg: Any, *, rank: int, world: int, local_batch: int, seed: int,
                      position: dict | None) -> JsonlStream | HfStream:
    """This replica's training batches (``seed``: ``train.seed``, the same on every replica)."""
    kind = JsonlStream if cfg.hf is None else HfStream
    return kind(cfg, rank=rank, world=world, local_batch=local_batch, seed=seed, position=position)


def load_eval_examples(cfg: Any, *, rank: int, world: int, limit: int | None) -> list[data_mod.Example]:
    """This replica's share of the held-out examples (example i goes to replica i mod N), the first ``limit`` of the
    set overall; eval-sized, so held in memory."""
    fields = data_mod.Fields.of(cfg)
    if cfg.hf is None:
        examples = list(data_mod.iter_shard(cfg.eval, rank, world, fields))
        return examples[: len(range(rank, limit, world))] if limit is not None else examples
    hf = cfg.hf
    where = f"hf:{hf.path}[{hf.eval_split}]"
    out = []
    kept = 0
    for index, record in enumerate(load_split(hf, hf.eval_split)):
        example = data_mod.make_example(dict(record), line=index + 1, path=where, fields=fields)
        if example is None:
            continue
        if limit is not None and kept >= limit:
            break
        if kept % world == rank:
            out.append(example)
        kept += 1
    return out
