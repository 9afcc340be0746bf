"""Training streams: a Hugging Face dataset split over replicas x data-loader processes (disjoint parts that cover
it, epoch after epoch), resumed exactly from a saved position; and the JSON-lines stream's position. Real
``datasets`` over real files (the controller's venv has it for these tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuft.config import DataConfig
from tpuft.worker.data import DataError
from tpuft.worker.streams import load_eval_examples, open_train_stream

SIZES = [7, 3, 11, 5, 9, 4]  # uneven files; 39 examples


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("hf")
    out, index = [], 0
    for number, size in enumerate(SIZES):
        path = root / f"part-{number}.jsonl"
        with path.open("w") as handle:
            for _ in range(size):
                handle.write(json.dumps({"id": f"ex{index}", "text": f"text {index}"}) + "\n")
                index += 1
        out.append(str(path))
    return out


def config(files: list[str], **hf: Any) -> DataConfig:
    settings = {"path": "json", "data_files": files, "shuffle_buffer": 4, **hf}
    return DataConfig.model_validate({"hf": settings, "source_field": "id", "target_field": "text"},
                                     context={"check_files": False})


def one_epoch(cfg: DataConfig, world: int) -> list[list[str]]:
    """What each replica draws in epoch 0 (batches of one example, so the boundary is exact)."""
    seen = []
    for rank in range(world):
        stream = open_train_stream(cfg, rank=rank, world=world, local_batch=1, seed=3, position=None)
        mine = []
        while True:
            (example,) = next(stream)
            if stream.epoch > 0:
                break
            mine.append(example.source)
        stream.close()
        seen.append(mine)
    return seen


@pytest.mark.parametrize("files_used", [6, 5], ids=["whole-files", "every-nth-example"])
@pytest.mark.parametrize("world,loader_workers", [(1, 0), (2, 0), (3, 0), (2, 1), (3, 2)])
def test_replicas_and_loader_processes_read_disjoint_parts_that_cover_the_split(
    files: list[str], files_used: int, world: int, loader_workers: int
) -> None:
    """6 files split whole over 1, 2, 3 or 6 readers; 5 files cannot, so readers take every n-th example."""
    cfg = config(files[:files_used], loader_workers=loader_workers)
    seen = one_epoch(cfg, world)
    every = [source for part in seen for source in part]
    expected = {f"ex{i}" for i in range(sum(SIZES[:files_used]))}
    assert len(every) == len(set(every)) == len(expected) and set(every) == expected
    assert all(seen)  # every replica got a share


def test_a_downloaded_not_streamed_split_is_shared_out_the_same_way(files: list[str]) -> None:
    seen = one_epoch(config(files, streaming=False), 2)
    every = [source for part in seen for source in part]
    assert sorted(every) == sorted(f"ex{i}" for i in range(39)) and all(seen)


def test_the_next_epoch_is_reshuffled_and_covers_the_split_again(files: list[str]) -> None:
    cfg = config(files, shuffle_buffer=8)
    stream = open_train_stream(cfg, rank=0, world=1, local_batch=1, seed=0, position=None)
    first = [next(stream)[0].source for _ in range(39)]
    second = [next(stream)[0].source for _ in range(39)]
    stream.close()
    assert sorted(first) == sorted(second) == sorted(f"ex{i}" for i in range(39))
    assert first != second and stream.epoch == 1


@pytest.mark.parametrize("loader_workers", [0, 2])
@pytest.mark.parametrize("files_used", [6, 5])
def test_a_stream_reopened_from_its_position_goes_on_exactly(files: list[str], files_used: int,
                                                             loader_workers: int) -> None:
    """Positions after 4 batches (mid-epoch) and after 13 (past the epoch boundary, 39 examples per epoch on one
    replica of two: about 20 each)."""
    cfg = config(files[:files_used], loader_workers=loader_workers)
    for rank in (0, 1):
        stream = open_train_stream(cfg, rank=rank, world=2, local_batch=3, seed=7, position=None)
        drawn = [[e.source for e in next(stream)] for _ in range(20)]
        stream.close()
        for cut in (4, 13):
            replay = open_train_stream(cfg, rank=rank, world=2, local_batch=3, seed=7, position=None)
            for _ in range(cut):
                next(replay)
            position = json.loads(json.dumps(replay.position()))  # as trainer_state.json keeps it
            replay.close()
            resumed = open_train_stream(cfg, rank=rank, world=2, local_batch=3, seed=7, position=position)
            assert [[e.source for e in next(resumed)] for _ in range(20 - cut)] == drawn[cut:]
            resumed.close()


def test_a_changed_number_of_loader_processes_cannot_resume_exactly(files: list[str]) -> None:
    with pytest.raises(ValueError, match="loader_workers changed"):
        open_train_stream(config(files, loader_workers=2), rank=0, world=1, local_batch=1, seed=0,
                          position={"epoch": 0, "taken": [3], "turn": 0})


def test_too_few_examples_for_the_readers_is_a_located_error(files: list[str]) -> None:
    cfg = config(files[1:2])  # 3 examples in one file
    stream = open_train_stream(cfg, rank=3, world=4, local_batch=1, seed=0, position=None)
    with pytest.raises(DataError, match="got no examples"):
        next(stream)


def test_eval_examples_are_shared_out_and_limited(files: list[str]) -> None:
    cfg = DataConfig.model_validate(
        {"hf": {"path": "json", "data_files": {"train": files[:1], "validation": files[2:3]},
                "eval_split": "validation"}, "source_field": "id", "target_field": "text"},
        context={"check_files": False})
    parts = [load_eval_examples(cfg, rank=r, world=2, limit=5) for r in (0, 1)]
    assert [e.source for e in parts[0]] == ["ex10", "ex12", "ex14"] and [e.source for e in parts[1]] == ["ex11", "ex13"]


def test_the_json_lines_stream_keeps_todays_order_and_resumes_from_its_count(tmp_path: Path) -> None:
    from tpuft.worker import data as data_mod

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"source": f"s{i}", "target": "t"}) + "\n" for i in range(10)))
    cfg = DataConfig.model_validate({"train": str(path)}, context={"check_files": False})
    stream = open_train_stream(cfg, rank=1, world=2, local_batch=2, seed=5, position=None)
    shard = data_mod.load_shard(path, 1, 2)
    expected = data_mod.batches(shard, 2, 5 + 7919 * 1)
    assert [[e.source for e in next(stream)] for _ in range(6)] == [[e.source for e in next(expected)] for _ in range(6)]
    assert stream.position() == {"consumed": 12}
    resumed = open_train_stream(cfg, rank=1, world=2, local_batch=2, seed=5, position=stream.position())
    assert [e.source for e in next(resumed)] == [e.source for e in next(stream)]
