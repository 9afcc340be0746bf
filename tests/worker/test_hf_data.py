"""tpuft.worker.hf_data: a Hugging Face dataset split over replicas x data-loader processes into disjoint
parts that cover it, epoch after epoch in a new order, and resumed exactly from the position the chief saves
(the same for every replica); errors located at their file and record; the JSON-lines stream behind the same
API. Real ``datasets`` over real files in the controller's venv (the data-loader processes are spawned Python
processes, not torch's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tpuft import data as data_mod
from tpuft.config import DataConfig
from tpuft.data import DataError
from tpuft.worker.hf_data import (
    has_held_out,
    held_out,
    load_eval_examples,
    open_train_stream,
    round_robin,
)
from tpuft.worker.hf_read import whole_files

SIZES = [7, 3, 11, 5, 9, 4]  # uneven files, 39 examples; ids are unique over all of them


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


def ids(count: int) -> list[str]:
    return [f"ex{i}" for i in range(count)]


def config(files: list[str] | dict[str, list[str]], **hf: Any) -> DataConfig:
    settings = {"path": "json", "data_files": files, "shuffle_buffer": 4, **hf}
    return DataConfig.model_validate(
        {"hf": settings, "source_field": "id", "target_field": "text"}, context={"check_files": False}
    )


def draw(
    cfg: DataConfig,
    rank: int,
    world: int,
    count: int,
    batch: int = 1,
    position: dict | None = None,
) -> tuple[list[list[str]], list[int], dict]:
    """``count`` batches of one replica: their sources, the epoch of each batch's last example, the
    position."""
    stream = open_train_stream(cfg, rank=rank, world=world, local_batch=batch, seed=3, position=position)
    try:
        batches, epochs = [], []
        for _ in range(count):
            batches.append([example.source for example in next(stream)])
            epochs.append(stream.epoch)
        return batches, epochs, stream.position()
    finally:
        stream.close()


# 6 files: whole files for 1, 2, 3 and 6 readers; 5 files (and 2, fewer than the readers): every n-th example
LAYOUTS = {"whole-files": 6, "every-nth-example": 5, "fewer-files-than-readers": 2}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("loader_workers", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_replicas_x_loaders_cover_each_epoch_once_and_resume_exactly_from_the_chiefs_position(
    files: list[str], layout: str, world: int, loader_workers: int
) -> None:
    """Every replica draws two epochs and a bit (batches of one: epochs end exactly); the union of their first
    epochs is the split without duplicates, so is the union of their second epochs, in a new order. Then every
    replica is reopened from the position replica 0 had after k batches, mid first epoch and later ones, and
    goes on with exactly the batches it drew."""
    used = files[: LAYOUTS[layout]]
    total = sum(SIZES[: LAYOUTS[layout]])
    cfg = config(used, loader_workers=loader_workers)
    readers = world * max(1, loader_workers)
    assert whole_files(len(used), readers) == (len(used) % readers == 0)
    steps = 2 * total + 3  # past the end of every replica's second epoch
    drawn = [draw(cfg, rank, world, steps) for rank in range(world)]
    for epoch in (0, 1):  # the union of the replicas' epoch: the split, each example once
        every = [s for batches, epochs, _ in drawn for (s,), e in zip(batches, epochs) if e == epoch]
        assert sorted(every) == sorted(ids(total)), epoch
    reshuffled = []
    for rank, (batches, epochs, _) in enumerate(
        drawn
    ):  # each replica's second epoch: its part again, reshuffled
        mine = [s for (s,), e in zip(batches, epochs) if e == 0]
        again = [s for (s,), e in zip(batches, epochs) if e == 1]
        assert mine and sorted(again) == sorted(mine), rank  # every replica has a share
        reshuffled.append(again != mine)
    assert any(reshuffled)
    for cut in (3, total // world + 5, total + 4):  # mid epoch 0; past its end for most replicas; later
        chief = draw(cfg, 0, world, cut)[2]
        saved = json.loads(json.dumps(chief))  # as trainer_state.json keeps it
        assert saved == {"consumed": cut, "readers_per_replica": max(1, loader_workers)}
        for rank in range(world):
            resumed = draw(cfg, rank, world, steps - cut, position=saved)[0]
            assert resumed == drawn[rank][0][cut:], (rank, cut)


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_bigger_batches_straddle_epochs_and_resume_exactly(files: list[str], loader_workers: int) -> None:
    cfg = config(files[:5], loader_workers=loader_workers, shuffle_buffer=3)
    # 60 of replica 1's ~18 a epoch: three epoch boundaries, inside batches
    full = draw(cfg, 1, 2, 12, batch=5)[0]
    for cut in (1, 4, 7, 11):
        position = draw(cfg, 1, 2, cut, batch=5)[2]
        assert position["consumed"] == 5 * cut
        assert draw(cfg, 1, 2, 12 - cut, batch=5, position=position)[0] == full[cut:]


def test_the_order_is_a_function_of_the_seed_and_unshuffled_keeps_file_order(files: list[str]) -> None:
    cfg = config(files[:2], shuffle_buffer=100)
    one, two = draw(cfg, 0, 1, 10)[0], draw(cfg, 0, 1, 10)[0]
    assert one == two
    plain = DataConfig.model_validate({**cfg.model_dump(), "shuffle": False}, context={"check_files": False})
    assert [s for (s,) in draw(plain, 0, 1, 10)[0]] == ids(10)  # files in order, 7 then 3, then again
    assert [s for (s,) in draw(plain, 0, 1, 20)[0][10:]] == ids(10)


def test_loader_processes_give_the_order_of_a_reader_in_the_trainer(files: list[str]) -> None:
    """0 and 1 loader processes are both one reader per replica: the same examples in the same order."""
    assert (
        draw(config(files, loader_workers=0), 1, 2, 30, batch=2)[0]
        == draw(config(files, loader_workers=1), 1, 2, 30, batch=2)[0]
    )


def test_a_changed_number_of_readers_cannot_resume_exactly(files: list[str]) -> None:
    with pytest.raises(ValueError, match="loader_workers changed"):
        open_train_stream(
            config(files, loader_workers=2),
            rank=0,
            world=1,
            local_batch=1,
            seed=0,
            position={"consumed": 3, "readers_per_replica": 1},
        )
    with pytest.raises(ValueError, match="unrecognised data position"):
        open_train_stream(config(files), rank=0, world=1, local_batch=1, seed=0, position={"epoch": 1})


def test_a_plain_count_from_an_old_checkpoint_is_a_position(files: list[str]) -> None:
    full = draw(config(files), 0, 2, 30, batch=2)[0]
    assert draw(config(files), 0, 2, 20, batch=2, position={"consumed": 20})[0] == full[10:]


def test_round_robin_places_readers_of_uneven_parts() -> None:
    assert round_robin([3, 1, 2], 0) == ([0, 0, 0], 0)
    assert round_robin([3, 1, 2], 2) == ([1, 1, 0], 2)
    assert round_robin([3, 1, 2], 4) == ([2, 1, 1], 1)  # round 2: readers 0 and 2 only
    assert round_robin([3, 1, 2], 5) == ([2, 1, 2], 0)
    assert round_robin([0, 4], 3) == ([0, 3], 0)
    with pytest.raises(ValueError):
        round_robin([1, 1], 3)


def test_too_few_examples_for_the_readers_is_a_located_error(files: list[str]) -> None:
    cfg = config(files[1:2])  # 3 examples in one file, 4 replicas
    stream = open_train_stream(cfg, rank=3, world=4, local_batch=1, seed=0, position=None)
    with pytest.raises(DataError, match="got no examples"):
        next(stream)
    with pytest.raises(DataError, match="got no examples"):
        open_train_stream(cfg, rank=3, world=4, local_batch=1, seed=0, position={"consumed": 2})


HOOK = """
def odd_only(record):
    number = int(record["id"][2:])
    if number == 20:
        raise ValueError("no twenty")
    return record if number % 2 else None
"""


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_preprocess_transforms_and_located_errors_apply_to_hf_records(
    tmp_path: Path, files: list[str], loader_workers: int
) -> None:
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    cfg = DataConfig.model_validate(
        {
            "hf": {"path": "json", "data_files": files[:2], "loader_workers": loader_workers},
            "source_field": "text",
            "target_field": "id",
            "source_transforms": ["lowercase"],
            "target_transforms": ["strip"],
            "preprocess": f"{hook}:odd_only",
            "prefix": "Q: ",
            "shuffle": False,
        },
        context={"check_files": False},
    )
    batches = draw(cfg, 0, 1, 5)[0]
    # unshuffled: one reader reads both files in order; two take a file each (ex0-6, ex7-9) and alternate
    order = [1, 3, 5, 7, 9] if loader_workers < 2 else [1, 7, 3, 9, 5]
    assert [b[0] for b in batches] == [f"Q: text {i}" for i in order]
    # the count of a part leaves dropped records out
    resumed = draw(cfg, 0, 1, 3, position={"consumed": 2})[0]
    assert resumed == batches[2:]
    bad = DataConfig.model_validate(
        {**cfg.model_dump(), "hf": {**cfg.hf.model_dump(), "data_files": files[2:3]}},
        context={"check_files": False},
    )
    with pytest.raises(DataError) as caught:  # ex20 is the 11th record of part-2.jsonl (ex10 .. ex20)
        draw(bad, 0, 1, 10)
    assert caught.value.where == f"hf:json[train] {files[2]}:11"
    assert "data.preprocess" in caught.value.message and "no twenty" in caught.value.message


def test_every_nth_example_errors_name_the_file_and_record(files: list[str]) -> None:
    bad = Path(files[0]).parent / "bad" / "part-x.jsonl"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text('{"id": "a", "text": "t"}\n{"id": "b", "text": "t"}\n{"id": "c", "text": null}\n')
    cfg = config([files[1], str(bad)])  # 2 files, 3 readers: every 3rd example, scanned by every reader
    with pytest.raises(DataError) as caught:
        for rank in range(3):
            draw(cfg, rank, 3, 3)
    assert caught.value.where == f"hf:json[train] {bad}:3" and "is null" in caught.value.message


def test_a_dataset_folder_is_read_in_row_ranges(tmp_path: Path, files: list[str]) -> None:
    """save_to_disk: random access, each reader a contiguous range of rows, located by the split's row
    (1-based)."""
    import datasets

    rows = [json.loads(line) for f in files for line in Path(f).read_text().splitlines()]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "validation": datasets.Dataset.from_list(rows[:4])}
    ).save_to_disk(str(tmp_path / "ds"))
    cfg = DataConfig.model_validate(
        {
            "hf": {
                "path": str(tmp_path / "ds"),
                "shuffle_buffer": 4,
                "loader_workers": 0,
                "eval_split": "validation",
            },
            "source_field": "id",
            "target_field": "text",
        },
        context={"check_files": False},
    )
    seen = []
    for rank in range(3):
        batches, epochs, _ = draw(cfg, rank, 3, 20)
        seen += [s for (s,), e in zip(batches, epochs) if e == 0]
        assert draw(cfg, rank, 3, 12, position={"consumed": 8})[0] == batches[8:]
    assert sorted(seen) == sorted(ids(39))
    assert [e.source for e in load_eval_examples(cfg, rank=1, world=2, limit=None)] == ["ex1", "ex3"]


def test_eval_examples_are_shared_out_and_limited(files: list[str]) -> None:
    cfg = config({"train": files[:1], "validation": files[2:4]}, eval_split="validation")
    parts = [load_eval_examples(cfg, rank=r, world=2, limit=5) for r in (0, 1)]
    assert [e.source for e in parts[0]] == ["ex10", "ex12", "ex14"] and [e.source for e in parts[1]] == [
        "ex11",
        "ex13",
    ]
    whole = [load_eval_examples(cfg, rank=r, world=3, limit=None) for r in range(3)]
    assert sorted(e.source for part in whole for e in part) == [f"ex{i}" for i in range(10, 26)]
    assert load_eval_examples(config(files[:1]), rank=0, world=1, limit=None) == []  # no eval_split


def test_the_test_split_is_dealt_like_eval_with_each_example_s_position_as_its_id(
    tmp_path: Path, files: list[str]
) -> None:
    """data.hf.test_split and data.test: replica r gets the examples i % W == r, each with its 0-based place
    in the split or file (a blank line keeps its number), so the predictions of all replicas merge back in
    order."""
    cfg = config({"train": files[:1], "test": files[2:4]}, test_split="test")
    assert has_held_out(cfg, "test") and not has_held_out(cfg, "eval")
    parts = [held_out(cfg, "test", rank=r, world=2) for r in (0, 1)]
    assert [(i, e.source) for i, e in parts[1]] == [(i, f"ex{10 + i}") for i in range(1, 16, 2)]
    assert (
        sorted(i for part in parts for i, _ in part) == list(range(16))
        and held_out(cfg, "eval", rank=0, world=1) == []
    )
    path = tmp_path / "test.jsonl"
    path.write_text(
        '{"source": "a", "target": "1"}\n\n{"source": "b", "target": "2"}\n{"source": "c", "target": "3"}\n'
    )
    plain = DataConfig.model_validate({"train": str(path), "test": str(path)}, context={"check_files": False})
    assert [(i, e.source) for i, e in held_out(plain, "test", rank=1, world=2)] == [(2, "b")]
    assert [(i, e.source) for i, e in held_out(plain, "test", rank=0, world=2)] == [(0, "a"), (3, "c")]
    assert not has_held_out(plain, "eval") and held_out(plain, "eval", rank=0, world=1) == []


def test_an_eval_split_needs_its_own_files(files: list[str]) -> None:
    """A list of data_files is the train split's: evaluating on it would silently measure the training
    data."""
    with pytest.raises(ValueError, match="data_files is a list, the files of split 'train'"):
        config(files, eval_split="validation")
    with pytest.raises(ValueError, match="eval_split 'test' has no files"):
        config({"train": files}, eval_split="test")
    with pytest.raises(ValueError, match="split 'train' has no files"):
        config({"validation": files})


def test_the_json_lines_stream_keeps_todays_order_and_resumes_from_its_count(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"source": f"s{i}", "target": "t"}) + "\n" for i in range(10)))
    eval_path = tmp_path / "eval.jsonl"
    eval_path.write_text("".join(json.dumps({"source": f"e{i}", "target": "t"}) + "\n" for i in range(7)))
    cfg = DataConfig.model_validate(
        {"train": str(path), "eval": str(eval_path)}, context={"check_files": False}
    )
    stream = open_train_stream(cfg, rank=1, world=2, local_batch=2, seed=5, position=None)
    # what the trainer did before
    expected = data_mod.batches(data_mod.load_shard(path, 1, 2), 2, 5 + 7919 * 1)
    assert [[e.source for e in next(stream)] for _ in range(6)] == [
        [e.source for e in next(expected)] for _ in range(6)
    ]
    assert stream.position() == {"consumed": 12} and stream.epoch == 2  # 5 examples a epoch on this replica
    resumed = open_train_stream(cfg, rank=1, world=2, local_batch=2, seed=5, position=stream.position())
    assert [[e.source for e in next(resumed)] for _ in range(3)] == [
        [e.source for e in next(stream)] for _ in range(3)
    ]
    assert [e.source for e in load_eval_examples(cfg, rank=1, world=2, limit=5)] == ["e1", "e3"]
