"""Training batches for the PyTorch/XLA trainer, from JSON lines or a Hugging Face dataset, with a position
that a checkpoint keeps and that a resumed run continues from exactly.

What the trainer calls::

    stream = open_train_stream(data_cfg, rank=r, world=W, local_batch=b, seed=train.seed,
    position=saved_or_None) batch = next(stream)                  # b Examples, endlessly, epoch after epoch
    state["data_position"] = stream.position()
    stream.close()                        # data-loader processes
    load_eval_examples(data_cfg, rank=r, world=W, limit=eval.max_examples)

**The position is the same on every replica**: ``{"consumed": n, ...}``, the examples each replica has drawn
(every replica draws ``local_batch`` a batch), so the chief's copy in ``trainer_state.json`` is right for all
of them. A JSON-lines position and a Hugging Face one have the same meaning, and ``{"consumed": step *
local_batch}`` (what a checkpoint from before positions were saved implies) is a valid position of both.

JSON lines (``data.train``): today's path unchanged. Each replica keeps its shard in memory (line i goes to
replica i mod W) and draws reshuffled epochs from it (:func:`tpuft.data.batches`; resuming is
arithmetic).

A Hugging Face dataset (``data.hf``) is read as a stream, never held whole (the reading of a split and its
parts: :mod:`tpuft.worker.hf_read`):

* Readers. The split is cut into ``readers = W x max(1, loader_workers)`` disjoint parts that together cover
  it; replica r owns readers ``r*k .. r*k+k-1``. Whole files when the split's files (its shards) can be dealt
  out evenly: their number is a multiple of the readers, or at least 16 per reader (each reader then opens
  only its own files); else every ``readers``-th example of the split (each reader scans the whole split and
  keeps its own). A dataset folder written by ``save_to_disk`` (or a split downloaded with ``streaming:
  false``) is on disk with random access: each reader takes a contiguous range of rows.
* Order. Each epoch each reader reads its files (or 64 slices of its rows) in an order drawn from (seed,
  epoch, reader), through a bounded shuffle buffer (``shuffle_buffer`` records, drawn from the same
  generator); with ``data.shuffle: false``, in file order without the buffer. The replica takes one example
  from each of its readers in turn (reader 0 first each epoch), skipping those whose part of the epoch is
  over; the epoch ends when all are. The readers' parts do not change from epoch to epoch, only their order.
* Resume from ``consumed = n``. The interleaving above is a function of the parts' sizes alone, so the place
  of every reader after n examples is arithmetic once they are known. Each reader counts its part (examples,
  after ``data.preprocess`` drops, capped at n + 1: a run early in its first epoch counts only that far), then
  the epoch ``n // epoch_length`` is opened and each reader skips what it had given of it. The cost, once, at
  start-up: at most one epoch read to count, plus the current epoch up to the position; nothing is held.
* Data-loader processes (``loader_workers`` > 0): each reader is a process (from a fork server: the trainer's
  XLA runtime threads must not be forked) that reads its part epoch after epoch into a bounded queue, in
  chunks. Not ``torch.utils.data.DataLoader``: the examples are Python strings, not tensors, so it would add
  nothing but its own worker scheduling, and this module's exact resume needs to place each reader itself.
  ``loader_workers`` 0 and 1 are both one reader per replica (in the trainer's process, or in one loader
  process) and give the same order; 2 or more cut the replica's part further, another order: a position saved
  with another number of readers per replica is refused, as the examples would not continue.
* Locations. A bad record is reported as ``hf:PATH[SPLIT] FILE:N``, N the 1-based record number in that file
  (for a builder over data files and for the hub's files), or ``hf:PATH[SPLIT]:N``, N the 1-based row of the
  split (a dataset folder).
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import signal
from abc import abstractmethod
from collections import deque
from collections.abc import Iterator
from typing import Any

from tpuft import data as data_mod
from tpuft.data import DataError, Example
from tpuft.worker.hf_read import (
    EPOCH_END,
    count_examples,
    load_split,
    part_records,
    reader_examples,
    split_label,
)

CHUNK = 256
"""Examples per message from a data-loader process (one message per example would cost more than the
reading)."""
QUEUE_CHUNKS = 8
"""Messages a data-loader process keeps ready: bounded, so a fast reader cannot fill the host's memory."""


class TrainStream(Iterator[list[Example]]):
    """Endless batches of ``local_batch`` examples of one replica."""

    epoch: int
    """The epoch of the last example drawn (0 before any)."""
    consumed: int
    """Examples drawn, from the start of training."""

    @abstractmethod
    def __next__(self) -> list[Example]: ...

    @abstractmethod
    def position(self) -> dict[str, Any]:
        """After the batches drawn so far; JSON-able, the same on every replica."""

    def close(self) -> None:
        """Stop the data-loader processes (if any)."""


def open_train_stream(
    data_cfg: Any, *, rank: int, world: int, local_batch: int, seed: int, position: dict[str, Any] | None
) -> TrainStream:
    """This replica's training batches (``seed``: ``train.seed``, the same on every replica), from
    ``position`` (None: the start)."""
    if not 0 <= rank < world:
        raise ValueError(f"replica {rank} out of range for {world} replicas")
    if local_batch < 1:
        raise ValueError(f"local_batch must be >= 1, got {local_batch}")
    kind = JsonlStream if data_cfg.hf is None else HfStream
    return kind(data_cfg, rank=rank, world=world, local_batch=local_batch, seed=seed, position=position)


def load_eval_examples(data_cfg: Any, *, rank: int, world: int, limit: int | None) -> list[Example]:
    """This replica's share of the held-out examples (the i-th goes to replica i mod W), of the first
    ``limit`` of the set overall; eval-sized, so held in memory. Every replica reads the set (up to ``limit``)
    in order."""
    return [example for _, example in held_out(data_cfg, "eval", rank=rank, world=world, limit=limit)]


def has_held_out(data_cfg: Any, role: str) -> bool:
    """Whether the recipe has a ``role`` set ("eval" or "test"): its file, or its split of ``data.hf``."""
    if data_cfg.hf is None:
        return getattr(data_cfg, role) is not None
    return getattr(data_cfg.hf, f"{role}_split") is not None


def held_out(
    data_cfg: Any, role: str, *, rank: int, world: int, limit: int | None = None
) -> list[tuple[int, Example]]:
    """``(position, example)`` of this replica's share of the ``role`` set ("eval": ``data.eval`` or
    ``data.hf.eval_split``; "test": ``data.test`` or ``data.hf.test_split``), as :func:`load_eval_examples`
    deals it. The position is the example's 0-based place in its source (a file's line index, a split's row in
    order): the ``id`` of its prediction, which puts every replica's predictions back in input order."""
    fields = data_mod.Fields.of(data_cfg)
    if data_cfg.hf is None:
        path = getattr(data_cfg, role)
        if path is None:
            return []
        examples = [(example.line - 1, example) for example in data_mod.iter_shard(path, rank, world, fields)]
        return examples[: len(range(rank, limit, world))] if limit is not None else examples
    split = getattr(data_cfg.hf, f"{role}_split")
    return [] if split is None else list(_dealt(data_cfg, split, rank=rank, world=world, limit=limit))


def _consumed(position: dict[str, Any] | None) -> int:
    if not position:
        return 0
    if "consumed" not in position:
        raise ValueError(f"unrecognised data position {position!r}: expected {{'consumed': n, ...}}")
    consumed = int(position["consumed"])
    if consumed < 0:
        raise ValueError(f"data position: consumed must be >= 0, got {consumed}")
    return consumed


# ----------------------------------------------------------------------------------------------------------
# JSON lines


class JsonlStream(TrainStream):
    """Today's JSON-lines stream: the replica's shard in memory, reshuffled every epoch."""

    def __init__(
        self, cfg: Any, *, rank: int, world: int, local_batch: int, seed: int, position: dict[str, Any] | None
    ) -> None:
        self.consumed = _consumed(position)
        shard = data_mod.load_shard(cfg.train, rank, world, data_mod.Fields.of(cfg))
        self.examples = len(shard)
        self._batches = data_mod.batches(
            shard, local_batch, seed + 7919 * rank, cfg.shuffle, consumed=self.consumed
        )

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return max(self.consumed - 1, 0) // self.examples

    def __next__(self) -> list[Example]:
        batch = next(self._batches)
        self.consumed += len(batch)
        return batch

    def position(self) -> dict[str, Any]:
        return {"consumed": self.consumed}


# ----------------------------------------------------------------------------------------------------------
# Hugging Face datasets: where each reader is


def round_robin(sizes: list[int], drawn: int) -> tuple[list[int], int]:
    """Where readers with parts of ``sizes`` examples are after ``drawn`` examples of an epoch taken from them
    in turn (each in order, skipping those whose part is over): how many each has given, and whose turn is
    next."""
    low, high = 0, max(sizes, default=0)
    while low < high:  # the most full rounds that fit: sum(min(size, rounds)) <= drawn
        middle = (low + high + 1) // 2
        if sum(min(size, middle) for size in sizes) <= drawn:
            low = middle
        else:
            high = middle - 1
    taken = [min(size, low) for size in sizes]
    left, turn = drawn - sum(taken), 0
    for index, size in enumerate(
        sizes
    ):  # the round under way: one each from the first readers that still have some
        if left and size > low:
            taken[index] += 1
            left -= 1
            turn = (index + 1) % len(sizes)
    if left:
        raise ValueError(f"{drawn} examples drawn from parts of {sizes} examples: more than an epoch")
    return taken, turn


# ----------------------------------------------------------------------------------------------------------
# Readers: in the trainer's process, or data-loader processes


class _InProcessReader:
    def __init__(self, cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int) -> None:
        self._items = reader_examples(cfg, reader, readers, seed, epoch, skip)

    def get(self) -> Example | str:
        return next(self._items)

    def close(self) -> None:
        self._items.close()


def _loader_main(
    cfg_json: dict[str, Any],
    reader: int,
    readers: int,
    seed: int,
    epoch: int,
    skip: int,
    cap: int | None,
    out: Any,
) -> None:
    """A data-loader process: its part (epoch after epoch, in chunks; None ends an epoch's part) into ``out``,
    or its count up to ``cap``; a failure as ("error", ...). It leaves when the trainer's process is gone."""
    parent = multiprocessing.parent_process()

    def stop(signum: int, frame: Any) -> None:  # close(): leave through the normal exit, which releases what
        out.cancel_join_thread()  # datasets' locks hold, without waiting for the trainer to read
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)

    def send(message: Any) -> None:
        while True:
            try:
                out.put(message, timeout=5)
                return
            except queue_mod.Full:
                if (
                    parent is not None and not parent.is_alive()
                ):  # nobody will read: no flushing of the queue either
                    os._exit(0)

    chunk: list[tuple[str, str, int] | None] = []
    try:
        from tpuft.config import DataConfig

        cfg = DataConfig.model_validate(cfg_json, context={"check_files": False})
        if cap is not None:
            send(("count", count_examples(cfg, reader, readers, cap)))
            return
        for item in reader_examples(cfg, reader, readers, seed, epoch, skip):
            chunk.append(None if isinstance(item, str) else (item.source, item.target, item.line))
            if len(chunk) >= CHUNK:
                send(chunk)
                chunk = []
    except Exception as exc:  # noqa: BLE001 - the trainer reports it; a reader that dies silently would hang it
        if (
            chunk
        ):  # the examples before the failure first, as a reader in the trainer's process would give them
            send(chunk)
        if isinstance(exc, DataError):  # located at its record: the trainer raises it as it is
            send(("error", "DataError", exc.where, exc.message))
        else:
            send(("error", type(exc).__name__, "", str(exc)))


def _process_context() -> Any:
    """Processes forked from a fork server that has imported this module and ``datasets`` (a new one starts in
    milliseconds, not the second a fresh interpreter takes): never forked from the trainer, whose XLA runtime
    threads must not be."""
    context = multiprocessing.get_context("forkserver")
    # before it first starts
    context.set_forkserver_preload(["tpuft.worker.hf_data", "tpuft.config", "datasets"])
    return context


class _ProcessReader:
    def __init__(
        self, cfg: Any, reader: int, readers: int, seed: int, epoch: int, skip: int, cap: int | None = None
    ) -> None:
        context = _process_context()
        self.reader = reader
        self._queue = context.Queue(QUEUE_CHUNKS)
        self._ready: deque[tuple[str, str, int] | None] = deque()
        self._process = context.Process(
            target=_loader_main,
            name=f"tpuft-data-{reader}",
            daemon=True,
            args=(cfg.model_dump(mode="json"), reader, readers, seed, epoch, skip, cap, self._queue),
        )
        self._process.start()

    def _receive(self) -> Any:
        while True:
            try:
                message = self._queue.get(timeout=30)
                break
            except queue_mod.Empty:
                if not self._process.is_alive():
                    raise RuntimeError(
                        f"the data-loader process of reader {self.reader} died "
                        f"(exit code {self._process.exitcode})"
                    ) from None
        if isinstance(message, tuple) and message[0] == "error":
            _, kind, where, text = message
            if kind == "DataError":
                raise DataError(where, text)
            raise RuntimeError(f"data-loader process of reader {self.reader}: {kind}: {text}")
        return message

    def count(self) -> int:
        return int(self._receive()[1])

    def get(self) -> Example | str:
        if not self._ready:
            self._ready.extend(self._receive())
        item = self._ready.popleft()
        return EPOCH_END if item is None else Example(*item)

    def close(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
        self._process.join(timeout=10)
        self._queue.cancel_join_thread()
        self._queue.close()


# ----------------------------------------------------------------------------------------------------------
# Hugging Face datasets: the replica's stream


class HfStream(TrainStream):
    """Endless batches from this replica's readers; see the module's docstring."""

    def __init__(
        self, cfg: Any, *, rank: int, world: int, local_batch: int, seed: int, position: dict[str, Any] | None
    ) -> None:
        self.cfg, self.rank, self.local_batch, self.seed = cfg, rank, local_batch, seed
        self.per_replica = max(1, cfg.hf.loader_workers)
        self.readers = world * self.per_replica
        self.mine = [rank * self.per_replica + j for j in range(self.per_replica)]
        self._processes = cfg.hf.loader_workers > 0
        self._live: list[_InProcessReader | _ProcessReader] = []
        saved = (position or {}).get("readers_per_replica")
        if saved is not None and int(saved) != self.per_replica:
            raise ValueError(
                f"the data position was saved with {saved} readers per replica and this run "
                f"has {self.per_replica} (data.hf.loader_workers changed): the examples would not continue "
                f"exactly; set it back to {saved} to resume"
            )
        self.consumed = _consumed(position)
        epoch, taken, turn = self._place(self.consumed)
        self.epoch = epoch - 1 if self.consumed and not any(taken) else epoch  # at a boundary: the last one's
        kind = _ProcessReader if self._processes else _InProcessReader
        try:
            for reader, skip in zip(self.mine, taken):
                self._live.append(kind(cfg, reader, self.readers, seed, epoch, skip))
        except BaseException:
            self.close()
            raise
        self._reading, self.turn = epoch, turn
        self._done = [False] * self.per_replica
        self._epoch_examples = sum(taken)

    def _empty(self) -> DataError:
        return DataError(
            split_label(self.cfg.hf, self.cfg.hf.split),
            f"replica {self.rank}'s readers ({self.mine} of {self.readers}: replicas x "
            "data.hf.loader_workers) got no examples: the split has too few",
        )

    def _place(self, consumed: int) -> tuple[int, list[int], int]:
        """(epoch, examples each reader has given of it, whose turn) after ``consumed`` examples."""
        if consumed == 0:
            return 0, [0] * self.per_replica, 0
        cap = consumed + 1  # a part with more than consumed examples: still in the first epoch
        if self._processes:
            counters: list[_ProcessReader] = []
            try:  # the readers count in parallel
                for reader in self.mine:
                    counters.append(_ProcessReader(self.cfg, reader, self.readers, self.seed, 0, 0, cap=cap))
                sizes = [counter.count() for counter in counters]
            finally:
                for counter in counters:
                    counter.close()
        else:
            sizes = [count_examples(self.cfg, reader, self.readers, cap) for reader in self.mine]
        epoch, drawn = 0, consumed
        if all(size < cap for size in sizes):  # every part counted whole: the epoch's length is known
            if not sum(sizes):
                raise self._empty()
            epoch, drawn = divmod(consumed, sum(sizes))
        taken, turn = round_robin(sizes, drawn)
        return epoch, taken, turn

    def _next_example(self) -> Example:
        while True:
            if all(self._done):  # the epoch is over: the next one, in a new order
                if not self._epoch_examples:
                    raise self._empty()
                self._reading += 1
                self._done = [False] * self.per_replica
                self._epoch_examples = 0
                self.turn = 0
            index = self.turn
            self.turn = (index + 1) % self.per_replica
            if self._done[index]:
                continue
            item = self._live[index].get()
            if isinstance(item, str):
                self._done[index] = True
                continue
            self._epoch_examples += 1
            self.consumed += 1
            self.epoch = self._reading
            return item

    def __next__(self) -> list[Example]:
        return [self._next_example() for _ in range(self.local_batch)]

    def position(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "readers_per_replica": self.per_replica}

    def close(self) -> None:
        for reader in self._live:
            reader.close()
        self._live = []


# ----------------------------------------------------------------------------------------------------------
# One pass over a split, for a trainer that writes its examples once (the Keras trainer's TFRecords)


def split_examples(data_cfg: Any, split: str, *, rank: int, world: int) -> Iterator[Example]:
    """This replica's share of ``split`` of ``data.hf``, read once as a stream (nothing held), dealt as
    :func:`held_out` deals a held-out set. For a trainer that writes its examples to files once and shuffles
    them itself."""
    return (example for _, example in _dealt(data_cfg, split, rank=rank, world=world))


def _dealt(
    data_cfg: Any, split: str, *, rank: int, world: int, limit: int | None = None
) -> Iterator[tuple[int, Example]]:
    """``(position, example)`` of this replica's share of ``split``, streamed: the i-th example kept after
    ``data.preprocess`` goes to replica i mod W, in the split's order, of the first ``limit`` kept overall."""
    hf = data_cfg.hf
    fields = data_mod.Fields.of(data_cfg)
    kept = 0
    for position, (where, line, record) in enumerate(
        part_records(load_split(hf, split), split_label(hf, split), 0, 1, None)
    ):
        if limit is not None and kept >= limit:
            return
        example = data_mod.make_example(record, line=line, path=where, fields=fields)
        if example is None:
            continue
        if kept % world == rank:
            yield position, example
        kept += 1
