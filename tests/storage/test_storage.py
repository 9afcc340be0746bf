"""Run storage behaves the same on a local folder and on GCS (the real google-cloud-storage client against the
in-process emulator of tests/rigs/gcs_emulator.py; nothing is mocked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rigs.gcs_emulator import GcsEmulator
from tpuft.core.errors import TpuftError, UsageError
from tpuft.storage import PARTIAL_SUFFIX, REGION_WARNING, GcsStorage, LocalStorage, open_storage

Storage = LocalStorage | GcsStorage
BUCKET = "tpuft-test-runs"
KINDS = ["local", "gcs", "gcs-prefix"]
"""A folder, a bare bucket, and a bucket whose storage root is a prefix inside it."""


def make_storage(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """A storage of ``kind`` whose bucket does not exist yet (the emulator starts empty for each test)."""
    if kind == "local":
        return LocalStorage(tmp_path / "bucket")
    emulator: GcsEmulator = request.getfixturevalue("gcs")
    emulator.reset()
    return open_storage(f"gs://{BUCKET}/team/a" if kind == "gcs-prefix" else f"gs://{BUCKET}")


@pytest.fixture(params=KINDS)
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return make_storage(request.param, request, tmp_path)


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    storage = make_storage(request.param, request, tmp_path)
    storage.ensure_bucket("us-central2")
    return storage


def make_tree(root: Path, count: int = 30) -> dict[str, bytes]:
    """``count`` files in nested folders: empty, text, binary, a few hundred KiB; returns relpath -> bytes."""
    files = {}
    for i in range(count):
        rel = f"step_{i % 3:08d}/shard-{i % 2}/part-{i:03d}.bin" if i % 5 else f"meta-{i}.json"
        data = b"" if i == 0 else os.urandom(37 * i * i)
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[rel] = data
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def media_gets(emulator: GcsEmulator) -> int:
    return sum(1 for method, path in emulator.requests if method == "GET" and path.startswith("/download/"))


# ---- buckets ---------------------------------------------------------------------------------------------


def test_ensure_bucket_creates_once(fresh: Storage) -> None:
    assert fresh.ensure_bucket("us-central2") == (True, None)
    assert fresh.ensure_bucket("us-central2") == (False, None)
    assert fresh.ensure_bucket(None) == (False, None)


def test_bucket_in_another_region_is_reused_with_a_warning(gcs: GcsEmulator) -> None:
    gcs.reset()
    storage = open_storage(f"gs://{BUCKET}")
    assert storage.ensure_bucket("us-east1") == (True, None)
    assert gcs.client().get_bucket(BUCKET).location == "US-EAST1"  # as GCS spells it

    created, warning = storage.ensure_bucket("us-central2")

    assert not created
    assert warning is not None
    assert "us-east1" in warning and "us-central2" in warning and REGION_WARNING in warning
    # GCS upper-cases locations; same region, no warning
    assert storage.ensure_bucket("US-EAST1") == (
        False,
        None,
    )


def test_created_bucket_is_private(gcs: GcsEmulator) -> None:
    gcs.reset()
    open_storage(f"gs://{BUCKET}").ensure_bucket("us-central2")
    iam = gcs.client().get_bucket(BUCKET).iam_configuration
    assert iam.uniform_bucket_level_access_enabled
    assert iam.public_access_prevention == "enforced"


# ---- single objects --------------------------------------------------------------------------------------


def test_write_read_exists_list(store: Storage) -> None:
    store.write_text("runs/a/run.json", '{"status": "running"}')
    store.write_text("runs/a/logs/worker-0.log", "step 1 — loss 2.5\n")
    store.write_text("runs/ab/run.json", "{}")

    assert store.read_text("runs/a/logs/worker-0.log") == "step 1 — loss 2.5\n"
    assert store.read_text("runs/a/missing.json") is None
    assert store.exists("runs/a/run.json")
    assert not store.exists("runs/a/missing.json")
    assert not store.exists("runs/a")  # folders are not things in GCS, so not here either
    assert store.list() == ["runs/a/logs/worker-0.log", "runs/a/run.json", "runs/ab/run.json"]
    # a folder, not a name prefix
    assert store.list("runs/a") == [
        "runs/a/logs/worker-0.log",
        "runs/a/run.json",
    ]
    assert store.list("runs/a/") == store.list("runs/a")
    assert store.list("runs/nope") == []
    assert store.list("runs/a/run.json") == []

    store.write_text("runs/a/run.json", '{"status": "done"}')
    assert store.read_text("runs/a/run.json") == '{"status": "done"}'


def test_a_conditional_write_loses_to_a_write_it_did_not_see(store: Storage) -> None:
    """The compare-and-write the recovery lease stands on: two writers that read the same version, one wins; a
    version of an absent file ("only if nobody made it") included; a plain write moves the version too."""
    text, absent = store.read_versioned("runs/r/lease.json")
    assert text is None
    first = store.write_text_if("runs/r/lease.json", "a", absent)
    assert first is not None and first != absent
    assert store.write_text_if("runs/r/lease.json", "b", absent) is None  # made meanwhile: refused
    assert store.read_versioned("runs/r/lease.json") == ("a", first)
    second = store.write_text_if("runs/r/lease.json", "c", first)
    assert second is not None and second != first
    # a stale version: refused, nothing written
    assert store.write_text_if("runs/r/lease.json", "d", first) is None
    assert store.read_text("runs/r/lease.json") == "c"
    store.write_text("runs/r/lease.json", "e")
    assert store.write_text_if("runs/r/lease.json", "f", second) is None
    assert store.read_versioned("runs/r/lease.json")[0] == "e"
    # whatever the compare-and-write keeps beside it is not listed
    assert store.list("runs/r") == ["runs/r/lease.json"]


def test_sizes_are_the_listing_with_each_files_size(store: Storage, tmp_path: Path) -> None:
    """How a checkpoint's manifest is checked in one listing (tpuft/backends/base.py
    RunLayout.checkpoint_steps)."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(os.urandom(300_001))
    store.upload_file(weights, "runs/a/checkpoints/step_1/model.safetensors")
    store.write_text("runs/a/checkpoints/step_1/manifest.json", "{}")
    store.write_text("runs/a/empty.txt", "")
    store.write_text("runs/ab/run.json", "{}")

    assert store.sizes("runs/a") == {
        "runs/a/checkpoints/step_1/manifest.json": 2,
        "runs/a/checkpoints/step_1/model.safetensors": 300_001,
        "runs/a/empty.txt": 0,
    }
    assert list(store.sizes("runs/a")) == store.list("runs/a")  # the same files, in the same order
    inside = {rel: size for rel, size in store.sizes("runs/a").items() if "/checkpoints/" in rel}
    assert store.sizes("runs/a/checkpoints/") == inside
    assert store.sizes("runs/nope") == {} and store.sizes("runs/a/empty.txt") == {}


def test_upload_file(store: Storage, tmp_path: Path) -> None:
    """One file at a time: how a worker mirrors its run dir (tpuft/storage/sync.py)."""
    local = tmp_path / "metrics.jsonl"
    local.write_text('{"step": 1}\n')
    store.upload_file(local, "runs/r/metrics.jsonl")
    local.write_text('{"step": 1}\n{"step": 2}\n')
    store.upload_file(local, "runs/r/metrics.jsonl")
    assert store.read_text("runs/r/metrics.jsonl") == '{"step": 1}\n{"step": 2}\n'
    assert store.list("runs") == ["runs/r/metrics.jsonl"]


def test_paths_cannot_leave_the_root(store: Storage) -> None:
    with pytest.raises(UsageError, match="inside the storage root"):
        store.write_text("runs/../../etc/passwd", "x")


# ---- trees -----------------------------------------------------------------------------------------------


def test_upload_then_download_is_byte_identical_and_resumes(store: Storage, tmp_path: Path) -> None:
    source = tmp_path / "ckpt"
    files = make_tree(source)

    assert store.upload_tree(source, "runs/r1/checkpoints", workers=8) == 30
    assert store.list("runs/r1/checkpoints") == sorted(f"runs/r1/checkpoints/{rel}" for rel in files)
    assert store.upload_tree(source, "runs/r1/checkpoints") == 0  # unchanged: nothing sent again

    target = tmp_path / "restored"
    assert store.download_tree("runs/r1/checkpoints", target, workers=8) == 30
    assert read_tree(target) == files
    assert store.download_tree("runs/r1/checkpoints", target) == 0


def test_second_download_fetches_no_bytes(gcs: GcsEmulator, tmp_path: Path) -> None:
    gcs.reset()
    storage = open_storage(f"gs://{BUCKET}")
    storage.ensure_bucket("us-central2")
    make_tree(tmp_path / "src", 12)
    storage.upload_tree(tmp_path / "src", "runs/r/tb")
    storage.download_tree("runs/r/tb", tmp_path / "dst")
    before = media_gets(gcs)

    assert storage.download_tree("runs/r/tb", tmp_path / "dst") == 0
    assert media_gets(gcs) == before  # one listing, compared by size and crc32c, no media GET


def test_changed_truncated_and_missing_files_are_fetched_again(store: Storage, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    store.upload_tree(tmp_path / "src", "runs/r1/export")
    target = tmp_path / "dst"
    store.download_tree("runs/r1/export", target)

    same_size = target / "step_00000001/shard-1/part-001.bin"
    same_size.write_bytes(bytes(len(same_size.read_bytes())))  # same name and size, other content
    half = target / "step_00000002/shard-0/part-002.bin"
    half.write_bytes(half.read_bytes()[:10])  # as an interrupted copy would leave it
    (target / "meta-5.json").unlink()
    stale = target / f".meta-5.json{PARTIAL_SUFFIX}"
    stale.write_bytes(b"left by a killed download")

    assert store.download_tree("runs/r1/export", target) == 3
    assert read_tree(target) == files  # the stale partial file was replaced by the finished one and is gone


def test_upload_sends_only_changed_files(store: Storage, tmp_path: Path) -> None:
    source = tmp_path / "src"
    make_tree(source, 10)
    store.upload_tree(source, "runs/r/ckpt")
    (source / "meta-5.json").write_bytes(b"changed")
    (source / "new.txt").write_text("new")
    (source / f".new.txt{PARTIAL_SUFFIX}").write_text("half a file is never uploaded")

    assert store.upload_tree(source, "runs/r/ckpt") == 2
    assert store.read_text("runs/r/ckpt/meta-5.json") == "changed"
    assert len(store.list("runs/r/ckpt")) == 11


def test_empty_or_missing_prefix_downloads_nothing(store: Storage, tmp_path: Path) -> None:
    assert store.download_tree("runs/none", tmp_path / "dst") == 0
    assert (tmp_path / "dst").is_dir()
    with pytest.raises(TpuftError, match="no such folder"):
        store.upload_tree(tmp_path / "missing", "runs/x")


def test_large_files_move_in_parallel_slices(gcs: GcsEmulator, tmp_path: Path) -> None:
    """Above ``sliced_threshold`` files go up as an XML multipart upload and come down in ranged GETs."""
    gcs.reset()
    storage = GcsStorage(BUCKET, "team", sliced_threshold=6 * 1024 * 1024, slice_size=5 * 1024 * 1024)
    storage.ensure_bucket("us-central2")
    source = tmp_path / "src"
    (source / "shards").mkdir(parents=True)
    big = os.urandom(11 * 1024 * 1024 + 123)
    (source / "shards" / "model.safetensors").write_bytes(big)
    (source / "config.json").write_text("{}")

    assert storage.upload_tree(source, "runs/r/export/hf", workers=4) == 2
    xml_object = (
        f"/{BUCKET}/team/runs/r/export/hf/shards/model.safetensors"  # XML API path: only multipart parts
    )
    parts = [path for method, path in gcs.requests if method == "PUT" and path == xml_object]
    assert len(parts) == 3  # 5 + 5 + 1 MiB parts
    blob = gcs.client().get_bucket(BUCKET).get_blob("team/runs/r/export/hf/shards/model.safetensors")
    # composite object
    assert blob is not None and blob.size == len(big) and blob.crc32c and blob.md5_hash is None

    assert storage.download_tree("runs/r/export/hf", tmp_path / "dst", workers=4) == 2
    assert (tmp_path / "dst" / "shards" / "model.safetensors").read_bytes() == big
    assert storage.download_tree("runs/r/export/hf", tmp_path / "dst") == 0
    assert storage.upload_tree(source, "runs/r/export/hf") == 0

    storage.upload_file(source / "shards" / "model.safetensors", "runs/r/copy.safetensors")
    assert (
        len([path for method, path in gcs.requests if method == "PUT" and path.endswith("/copy.safetensors")])
        == 3
    )


# ---- runs and roots --------------------------------------------------------------------------------------


def test_run_ids_and_run_dirs(store: Storage) -> None:
    assert store.run_ids() == []
    ids = ["t5-small-20250101-090000-0042", "t5-small-20250102-090000-0007", "t5-small-20250103-120000-1234"]
    for run_id in ids:
        store.write_text(f"runs/{run_id}/run.json", "{}")
        store.write_text(f"runs/{run_id}/logs/worker-0.log", "")

    assert store.run_ids() == ids
    run_dir = store.run_dir(ids[0])
    if isinstance(store, LocalStorage):
        assert run_dir == store.root / "runs" / ids[0]
    else:
        assert run_dir == f"{store.url}/runs/{ids[0]}"
        assert run_dir.startswith(f"gs://{BUCKET}/") and "//runs" not in run_dir


def test_gcs_run_ids_follow_the_time_in_the_id(gcs: GcsEmulator) -> None:
    gcs.reset()
    storage = open_storage(f"gs://{BUCKET}")
    storage.ensure_bucket(None)
    for run_id in ["zeta-20250105-000000-0001", "alpha-20250106-000000-0001", "manual"]:
        storage.write_text(f"runs/{run_id}/run.json", "{}")
    assert storage.run_ids() == ["manual", "zeta-20250105-000000-0001", "alpha-20250106-000000-0001"]


def test_prefix_root_sees_only_its_prefix(gcs: GcsEmulator) -> None:
    gcs.reset()
    whole = open_storage(f"gs://{BUCKET}")
    team = open_storage(f"gs://{BUCKET}/team/a/")
    assert isinstance(team, GcsStorage)
    assert (team.bucket, team.prefix, team.url) == (BUCKET, "team/a", f"gs://{BUCKET}/team/a")
    team.ensure_bucket("us-central2")
    whole.write_text("runs/other-20250101-000000-0001/run.json", "{}")
    team.write_text("runs/mine-20250101-000000-0001/run.json", "{}")

    assert team.list() == ["runs/mine-20250101-000000-0001/run.json"]
    assert team.run_ids() == ["mine-20250101-000000-0001"]
    assert whole.run_ids() == ["other-20250101-000000-0001"]
    assert "team/a/runs/mine-20250101-000000-0001/run.json" in whole.list()


@pytest.mark.parametrize("url", ["gs://", "gs:///runs", "gs://UPPER", "gs://a"])
def test_bad_bucket_urls_are_usage_errors(url: str) -> None:
    with pytest.raises(UsageError, match="not a valid bucket name"):
        open_storage(url)


def test_local_urls_stay_local(tmp_path: Path) -> None:
    assert open_storage(str(tmp_path)) == LocalStorage(tmp_path)


# ---- errors and start-up cost ----------------------------------------------------------------------------


def test_missing_bucket_names_the_object_and_the_call(gcs: GcsEmulator, tmp_path: Path) -> None:
    gcs.reset()
    storage = open_storage("gs://no-such-bucket")
    with pytest.raises(TpuftError) as err:
        storage.write_text("runs/x/run.json", "{}")
    assert "gs://no-such-bucket/runs/x/run.json: upload: not found" in err.value.message

    make_tree(tmp_path / "src", 4)
    with pytest.raises(TpuftError, match=r"gs://no-such-bucket/runs/x/: list objects: not found"):
        storage.upload_tree(tmp_path / "src", "runs/x")


def test_failed_downloads_leave_no_file_and_are_retried(gcs: GcsEmulator, tmp_path: Path) -> None:
    gcs.reset()
    storage = open_storage(f"gs://{BUCKET}")
    storage.ensure_bucket(None)
    files = make_tree(tmp_path / "src")
    storage.upload_tree(tmp_path / "src", "runs/r/ckpt")
    gcs.fail("GET", "/download/storage/v1/b/tpuft-test-runs/o/runs/r/ckpt/meta-10.json", 403)
    target = tmp_path / "dst"

    with pytest.raises(TpuftError) as err:
        storage.download_tree("runs/r/ckpt", target)

    assert "1 of 30 downloads failed" in err.value.message
    assert "gs://tpuft-test-runs/runs/r/ckpt/meta-10.json: download: permission denied" in err.value.message
    assert "roles/storage.objectAdmin" in str(err.value)
    assert not (target / "meta-10.json").exists()
    assert not [p for p in target.rglob("*") if p.name.endswith(PARTIAL_SUFFIX)]
    assert len(read_tree(target)) == 29
    gcs.reset_faults()
    assert storage.download_tree("runs/r/ckpt", target) == 1
    assert read_tree(target) == files


def test_missing_credentials_say_how_to_log_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(TpuftError) as err:
        open_storage("gs://some-bucket").exists("runs/x/run.json")
    assert "gs://some-bucket" in err.value.message
    assert "gcloud auth application-default login" in str(err.value)


def test_opening_gcs_storage_does_not_import_google_cloud() -> None:
    """The CLI imports tpuft.storage at start-up; google.cloud costs ~0.5 s and is only loaded once GCS is
    used."""
    code = (
        "import sys; from tpuft.storage import open_storage; s = open_storage('gs://b-1/p'); "
        "s.url; s.run_dir('x');print(sorted(m for m in sys.modules if m.startswith(('google.cloud', "
        "'google.auth', 'google_crc32c'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_remove_tree_deletes_a_folder_and_nothing_beside_it(store: Storage) -> None:
    for name in (
        "out.shards/job.json",
        "out.shards/shard-000000/predictions-00000.jsonl",
        "out.shards-x/keep",
        "keep",
    ):
        store.write_text(name, "x")
    assert store.remove_tree("out.shards") == 2
    assert store.list() == ["keep", "out.shards-x/keep"]
    assert store.remove_tree("out.shards") == 0
    assert store.remove_tree("") == 0 and store.list() == ["keep", "out.shards-x/keep"]  # never the root
