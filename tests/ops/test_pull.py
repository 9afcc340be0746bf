"""``tpuft pull``'s operation: a synthetic run dir pulled from a local folder and from GCS (the real
google-cloud-storage client against the in-process emulator of tests/rigs/gcs_emulator.py; nothing is mocked
except where a test says it corrupts a listing on purpose)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.rigs.gcs_emulator import GcsEmulator, _Handler
from tests.rundirs import write_run
from tpuft.core.errors import TpuftError, UsageError
from tpuft.ops.pull import PullResult, choose_checkpoints, pull
from tpuft.storage import PARTIAL_SUFFIX, GcsStorage, open_storage

REPO = Path(__file__).resolve().parents[2]
BUCKET = "tpuft-pull-test"
RUN_ID = "t5-small-20250101-090000-0042"
MiB = 1024 * 1024
CKPT = "checkpoints"
BIG = f"{CKPT}/step_00000020/state/shard-0.bin"
"""The biggest file of the run (3 MiB): where tests break or corrupt a transfer."""


# ---- a synthetic run dir ---------------------------------------------------------------------------------


def make_run(root: Path, *, metrics: list[dict[str, Any]] | None = None) -> dict[str, bytes]:
    """A run dir as docs/ARCHITECTURE.md lays it out, with checkpoints at steps 10 and 20 and a half-written
    one at 30; returns relpath -> bytes of every file."""
    rows = (
        metrics
        if metrics is not None
        else [
            {"step": 5, "loss": 3.0, "lr": 1e-3},
            {"step": 10, "loss": 2.0, "lr": 1e-3},
            {"step": 10, "eval_loss": 2.1, "eval_exact_match": 0.30},
            {"step": 15, "loss": 1.5, "lr": 1e-3},
            {"step": 15, "eval_loss": 1.6, "eval_exact_match": 0.55},  # best, but no checkpoint at step 15
            {"step": 20, "loss": 1.2, "lr": 1e-3},
            {"step": 20, "eval_loss": 1.3, "eval_exact_match": 0.50},
        ]
    )
    info = {"run_id": RUN_ID, "recipe": "t5-small", "started": 1735722000.0, "status": "succeeded"}
    files = {
        "recipe.yaml": b"name: t5-small\ntrain:\n  steps: 20\n",
        "run.json": json.dumps(info).encode(),
        "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()
        + b'{"step": 21, "lo',  # killed mid-line
        "heartbeat/worker-0.json": b'{"step": 20}',
        "logs/worker-0.log": b"2025-01-01T09:00:01.000Z step 5 loss 3.0\n" * 50,
        "logs/worker-1.log": b"",
        "tb/events.out.tfevents.1735722000.host": os.urandom(20_000),
        f"{CKPT}/step_00000010/meta.json": b'{"step": 10}',
        f"{CKPT}/step_00000010/state/shard-0.bin": os.urandom(2 * MiB + 17),
        f"{CKPT}/step_00000020/meta.json": b'{"step": 20}',
        BIG: os.urandom(3 * MiB + 5),
        f"{CKPT}/step_00000020/state/shard-1.bin": os.urandom(300_000),
        f"{CKPT}/step_00000030.tmp/state/shard-0.bin": os.urandom(1000),  # still being written: never pulled
        "export/hf/config.json": b'{"model_type": "t5"}',
        "export/hf/model.safetensors": os.urandom(MiB),
        "export/hf/tokenizer_config.json": b"{}",
    }
    return write_run(root, files=files)


def expected(files: dict[str, bytes], steps: list[int]) -> dict[str, bytes]:
    """The files a pull of ``steps`` brings: everything outside checkpoint step dirs, and those step dirs."""
    dirs = {f"{CKPT}/step_{s:08d}/" for s in steps}
    return {
        rel: data for rel, data in files.items() if not rel.startswith(CKPT) or any(map(rel.startswith, dirs))
    }


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under its final name (partial files, ``.NAME.tpuft-part``, are counted by
    :func:`partials`)."""
    found = [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(PARTIAL_SUFFIX)]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in found}


def partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]


@pytest.fixture
def local_run(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    run = tmp_path / "store" / "runs" / RUN_ID
    return run, make_run(run)


@pytest.fixture
def gcs_run(gcs: GcsEmulator, tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """The synthetic run uploaded to ``gs://BUCKET/team/runs/RUN_ID`` (a storage root with a prefix)."""
    gcs.reset()
    files = make_run(tmp_path / "upload")
    storage = open_storage(f"gs://{BUCKET}/team")
    storage.ensure_bucket(None)
    storage.upload_tree(tmp_path / "upload", f"runs/{RUN_ID}")
    gcs.requests.clear()
    return storage.run_dir(RUN_ID), files


def media_gets(gcs: GcsEmulator, contains: str = "") -> int:
    return sum(
        1 for m, path in gcs.requests if m == "GET" and path.startswith("/download/") and contains in path
    )


# ---- choosing checkpoints --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "steps"), [("latest", [20]), ("best", [10]), ("all", [10, 20]), ("none", [])]
)
def test_local_pull_takes_the_chosen_checkpoints(
    mode: str, steps: list[int], local_run, tmp_path: Path
) -> None:
    run, files = local_run
    dest = tmp_path / "home" / RUN_ID

    result = pull(run, dest, checkpoints=mode)

    assert result.checkpoints == steps
    assert read_tree(dest) == expected(files, steps)  # never the half-written step_00000030.tmp
    assert (result.files_total, result.files_fetched, result.files_skipped) == (
        len(expected(files, steps)),
    ) * 2 + (0,)
    assert result.bytes_total == result.bytes_fetched == sum(map(len, expected(files, steps).values()))
    assert (result.run_id, result.source, result.dest) == (RUN_ID, str(run), dest)
    assert (result.run_started, result.run_status) == ("2025-01-01T09:00:00Z", "succeeded")
    if mode == "best":  # eval_exact_match is best at step 15; the checkpoint before it is step 10
        assert result.notes == [
            "best eval: eval_exact_match = 0.55 at step 15",
            "no checkpoint at step 15: pulled step 10, the closest before it",
        ]
    json.dumps(result.as_json())


def test_best_prefers_exact_match_then_loss_and_falls_back_to_latest() -> None:
    steps = [10, 20, 30]
    by_match = [
        {"step": 10, "eval_exact_match": 0.2, "eval_loss": 0.1},
        {"step": 20, "eval_exact_match": 0.4, "eval_loss": 0.9},
    ]
    assert choose_checkpoints("best", steps, by_match)[0] == [20]  # exact match wins over a lower loss
    by_loss = [{"step": 10, "eval_loss": 0.5}, {"step": 30, "eval_loss": 0.7}]
    assert choose_checkpoints("best", steps, by_loss) == ([10], ["best eval: eval_loss = 0.5 at step 10"])
    early = [{"step": 5, "eval_loss": 0.5}]
    # nothing at or before step 5: the closest after
    assert choose_checkpoints("best", steps, early)[0] == [10]

    chosen, notes = choose_checkpoints("best", steps, [])
    assert chosen == [30]
    assert notes == ["no eval metrics in metrics.jsonl: pulled the latest checkpoint (step 30)"]
    assert choose_checkpoints("latest", [], []) == (
        [],
        ["the run has no checkpoints (none saved yet, or checkpointing is off)"],
    )


def test_best_is_ranked_by_the_recipes_eval_metric(tmp_path: Path) -> None:
    """A run that kept its best checkpoint by BLEU: pull (and predict) take that one, not the best exact
    match's."""
    rows = [
        {"step": 10, "eval_exact_match": 0.6, "eval_bleu": 20.0},
        {"step": 20, "eval_exact_match": 0.4, "eval_bleu": 31.5},
    ]
    assert choose_checkpoints("best", [10, 20], rows)[0] == [10]
    assert choose_checkpoints("best", [10, 20], rows, "bleu") == (
        [20],
        ["best eval: eval_bleu = 31.5 at step 20"],
    )
    run = tmp_path / "runs" / RUN_ID
    make_run(run, metrics=rows)
    (run / "recipe.yaml").write_text("name: t5-small\neval:\n  metric: bleu\ntrain:\n  steps: 20\n")
    assert pull(run, tmp_path / "dest", checkpoints="best").checkpoints == [20]


def test_best_without_eval_rows_pulls_the_latest(tmp_path: Path) -> None:
    run = tmp_path / "runs" / RUN_ID
    make_run(run, metrics=[{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.0}])
    result = pull(run, tmp_path / "dest", checkpoints="best")
    assert result.checkpoints == [20]
    assert "no eval metrics" in result.notes[0]


def test_bad_arguments_are_usage_errors(local_run, tmp_path: Path) -> None:
    run, _ = local_run
    with pytest.raises(
        UsageError, match="--checkpoints 'first': expected one of latest, best, all, none"
    ) as err:
        pull(run, tmp_path / "dest", checkpoints="first")
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="not a run directory"):
        pull(tmp_path / "runs" / "nope", tmp_path / "dest")
    with pytest.raises(UsageError, match="inside the run dir"):
        pull(run, run / "copy")
    assert not (tmp_path / "dest").exists()


# ---- resuming, verifying, progress -----------------------------------------------------------------------


def test_second_local_pull_fetches_nothing_and_a_corrupted_file_is_fetched_again(
    local_run, tmp_path: Path
) -> None:
    run, files = local_run
    dest = tmp_path / "dest"
    first = pull(run, dest, checkpoints="all")

    again = pull(run, dest, checkpoints="all")
    assert (again.files_fetched, again.files_skipped, again.bytes_fetched) == (0, first.files_total, 0)

    (dest / BIG).write_bytes(bytes(len(files[BIG])))  # same size, other bytes
    fixed = pull(run, dest, checkpoints="all")
    assert (fixed.files_fetched, fixed.bytes_fetched) == (1, len(files[BIG]))
    assert read_tree(dest) == expected(files, [10, 20])


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_progress_ends_at_total(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    run, _ = request.getfixturevalue("local_run" if where == "local" else "gcs_run")
    calls: list[tuple[int, int]] = []

    result = pull(
        run, tmp_path / "dest", checkpoints="all", workers=4, progress=lambda d, t: calls.append((d, t))
    )

    total = result.bytes_total
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert all(t == total for _, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)  # monotonic, though fed from worker threads
    assert len(calls) > 5  # moved while the 3 MiB file came in, not only at the end

    calls.clear()
    pull(run, tmp_path / "dest", checkpoints="all", progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (0, total) and calls[-1] == (total, total)  # skipped files count as done


def test_gcs_pull_is_byte_identical_and_a_second_pull_downloads_nothing(
    gcs: GcsEmulator, gcs_run, tmp_path: Path
) -> None:
    url, files = gcs_run
    dest = tmp_path / RUN_ID

    result = pull(url, dest, checkpoints="latest")

    assert url == f"gs://{BUCKET}/team/runs/{RUN_ID}"
    assert (result.run_id, result.source, result.checkpoints) == (RUN_ID, url, [20])
    assert read_tree(dest) == expected(files, [20])
    assert result.files_fetched == result.files_total == len(expected(files, [20]))
    assert media_gets(gcs) == result.files_fetched + 1  # and run.json, read first for the run's id and start
    assert media_gets(gcs, "step_00000010") == 0  # checkpoints not chosen are never read

    gcs.requests.clear()
    again = pull(url, dest, checkpoints="latest")
    assert (again.files_fetched, again.files_skipped, again.bytes_fetched) == (0, result.files_total, 0)
    # the rest compared by size and crc32c: no GET
    assert media_gets(gcs) == media_gets(gcs, "/run.json") == 1

    more = pull(url, dest, checkpoints="all")  # into a folder holding an older pull: only what is new
    assert (more.files_fetched, more.files_skipped) == (2, result.files_total)
    assert read_tree(dest) == expected(files, [10, 20])


def test_gcs_corrupted_local_file_is_fetched_again(gcs_run, tmp_path: Path) -> None:
    url, files = gcs_run
    dest = tmp_path / "dest"
    pull(url, dest)
    (dest / BIG).write_bytes(bytes(len(files[BIG])))  # same name and size, other content
    (dest / "recipe.yaml").write_bytes(b"short")  # a truncated copy
    assert pull(url, dest).files_fetched == 2
    assert read_tree(dest) == expected(files, [20])


def test_failed_gets_leave_no_file_and_a_rerun_fetches_only_those(
    gcs: GcsEmulator, gcs_run, tmp_path: Path
) -> None:
    url, files = gcs_run
    dest = tmp_path / "dest"
    gcs.fail("GET", f"/o/team/runs/{RUN_ID}/{BIG}", 403)
    gcs.fail("GET", f"/o/team/runs/{RUN_ID}/export/hf/model.safetensors", 403)

    with pytest.raises(TpuftError) as err:
        pull(url, dest, checkpoints="all")

    assert "2 of 15 downloads failed" in err.value.message
    assert f"{url}/{BIG}: download: permission denied" in err.value.message
    assert not (dest / BIG).exists() and not (dest / "export/hf/model.safetensors").exists()
    assert not partials(dest)
    assert len(read_tree(dest)) == 13
    gcs.reset_faults()
    resumed = pull(url, dest, checkpoints="all")
    assert (resumed.files_fetched, resumed.files_skipped) == (2, 13)
    assert read_tree(dest) == expected(files, [10, 20])


def test_connection_dropped_midway_resumes_from_the_byte_it_reached(
    gcs: GcsEmulator, gcs_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sends half of the big file and hangs up: the client asks for the rest with a ranged GET, and
    the whole file is still checked against the listed CRC32C before it gets its name."""
    url, files = gcs_run
    data = files[BIG]
    broken: list[str] = []
    ranges: list[str] = []
    original = _Handler._injected_fault

    def half_then_hang_up(handler: _Handler, method: str) -> bool:
        if (
            method != "GET"
            or not handler.path.startswith("/download/")
            or BIG not in handler.path.replace("%2F", "/")
        ):
            return original(handler, method)
        if handler.headers.get("Range"):
            ranges.append(handler.headers["Range"])
            return False
        if broken:
            return False
        broken.append(handler.path)
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Content-Type", "application/octet-stream")
        handler.end_headers()
        handler.wfile.write(data[: len(data) // 2])
        handler.close_connection = True
        return True

    monkeypatch.setattr(_Handler, "_injected_fault", half_then_hang_up)
    result = pull(url, tmp_path / "dest")

    assert broken
    assert media_gets(gcs, BIG) == 2  # the broken GET and the ranged one for the rest
    assert ranges == [f"bytes={len(data) // 2}-"]  # from the byte it reached, not from the start
    assert result.files_fetched == result.files_total
    assert read_tree(tmp_path / "dest") == expected(files, [20])


def test_checksum_mismatch_drops_the_file_and_names_the_object(
    gcs_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing whose CRC32C disagrees with the bytes (as if the object changed or the data were corrupted):
    the copy is discarded and the error names the object; with no CRC32C, MD5 is what is compared."""
    url, files = gcs_run
    listed = GcsStorage._objects
    damage: dict[str, dict[str, Any]] = {}

    def objects(self: GcsStorage, relprefix: str) -> dict[str, Any]:
        found = listed(self, relprefix)
        for rel, changes in damage.items():
            if rel in found:  # keys are relative to relprefix: the run dir's listing (pull's) names BIG so
                found[rel]._properties.update(changes)
        return found

    monkeypatch.setattr(GcsStorage, "_objects", objects)
    dest = tmp_path / "dest"
    damage[BIG] = {"crc32c": "AAAAAA=="}
    with pytest.raises(TpuftError) as err:
        pull(url, dest)
    assert f"{url}/{BIG}: download: checksum mismatch (crc32c " in err.value.message
    assert "the copy was discarded" in err.value.message
    assert not (dest / BIG).exists() and not partials(dest)

    damage[BIG] = {"crc32c": None, "md5Hash": "AAAAAAAAAAAAAAAAAAAAAA=="}
    with pytest.raises(TpuftError, match=r"checksum mismatch \(md5 "):
        pull(url, dest)
    assert not (dest / BIG).exists() and not partials(dest)

    damage.clear()
    damage[BIG] = {"crc32c": None}  # the real md5 remains: verified and skipped by md5
    assert pull(url, dest).files_fetched == 1
    assert pull(url, dest).files_fetched == 0
    assert read_tree(dest) == expected(files, [20])


_KILLED_PULL = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from tpuft.ops.pull import pull

    def progress(done, total):
        if done >= total // 2:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind, as a power cut or OOM kill

    pull(sys.argv[1], Path(sys.argv[2]), checkpoints="all", workers=2, progress=progress)
    """
)


def test_killed_pull_leaves_only_whole_files_and_a_rerun_fetches_the_rest(
    gcs: GcsEmulator, gcs_run, tmp_path: Path
) -> None:
    url, files = gcs_run
    dest = tmp_path / "dest"
    env = {**os.environ, **gcs.env(), "PYTHONPATH": str(REPO)}

    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_PULL, url, str(dest)], env=env, capture_output=True, timeout=120
    )

    assert killed.returncode == -9, killed.stderr.decode()
    want = expected(files, [10, 20])
    landed = read_tree(dest)
    assert landed, "killed before any file was complete"
    assert len(landed) < len(want), "killed after every file was complete"
    for rel, data in landed.items():  # a file under its final name is whole
        assert data == want[rel], rel

    resumed = pull(url, dest, checkpoints="all")

    assert (resumed.files_fetched, resumed.files_skipped) == (len(want) - len(landed), len(landed))
    assert read_tree(dest) == want
    assert not partials(dest)


def test_sliced_download_reports_progress(gcs: GcsEmulator, tmp_path: Path) -> None:
    """Files over ``sliced_threshold`` come down in ranged GETs; their bytes count when the file is
    complete."""
    gcs.reset()
    storage = GcsStorage(BUCKET, "team", sliced_threshold=6 * MiB, slice_size=5 * MiB)
    storage.ensure_bucket(None)
    (tmp_path / "src").mkdir()
    big = os.urandom(11 * MiB + 3)
    (tmp_path / "src" / "model.safetensors").write_bytes(big)
    (tmp_path / "src" / "config.json").write_text("{}")
    storage.upload_tree(tmp_path / "src", "runs/r/export/hf")
    calls: list[tuple[int, int]] = []

    transfer = storage.fetch_tree(
        "runs/r/export/hf", tmp_path / "dst", workers=3, progress=lambda d, t: calls.append((d, t))
    )

    assert (transfer.files, transfer.fetched, transfer.total_bytes) == (2, 2, len(big) + 2)
    assert calls[0] == (0, len(big) + 2) and calls[-1] == (len(big) + 2,) * 2
    assert (tmp_path / "dst" / "model.safetensors").read_bytes() == big


def test_result_as_json_round_trips(local_run, tmp_path: Path) -> None:
    run, _ = local_run
    result = pull(run, tmp_path / "dest", checkpoints="none")
    data = json.loads(json.dumps(result.as_json()))
    assert set(data) >= {f for f in PullResult.__dataclass_fields__} | {"bytes_per_s"}
    assert data["checkpoints"] == [] and data["dest"] == str(tmp_path / "dest")


def test_ctrl_c_stops_a_pull_at_once_and_leaves_no_partial_file(
    gcs: GcsEmulator, gcs_run, tmp_path: Path, sigint_raises: None
) -> None:
    """Ctrl-C reaches the caller while downloads run (transfer_manager alone would first finish its whole
    queue): the downloads in flight stop, their partial files are removed, and the next pull fetches only the
    rest."""
    url, files = gcs_run
    dest = tmp_path / "dest"
    interrupted: list[int] = []

    def ctrl_c_early(done: int, total: int) -> None:
        if done >= total // 4 and not interrupted:
            interrupted.append(done)
            os.kill(os.getpid(), signal.SIGINT)  # from a worker thread; Python raises it in the main thread

    with pytest.raises(KeyboardInterrupt):
        pull(url, dest, checkpoints="all", workers=2, progress=ctrl_c_early)

    want = expected(files, [10, 20])
    landed = read_tree(dest)
    # without stopping, all but one file went on to land
    assert interrupted and 0 < len(landed) < len(want) // 2
    assert all(data == want[rel] for rel, data in landed.items())
    assert not partials(dest)
    resumed = pull(url, dest, checkpoints="all")
    assert (resumed.files_fetched, resumed.files_skipped) == (len(want) - len(landed), len(landed))
    assert read_tree(dest) == want
