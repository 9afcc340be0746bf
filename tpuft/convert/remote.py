"""Checkpoints in a bucket: fetch only what a conversion reads, through the storage layer, resumably.

A T5X model dir in GCS holds every step and the optimizer state (for t5-xxl, tens of GB beside the weights); the
converter needs one step's parameters. So the listing decides the step first, then only that step's files are
downloaded: for legacy T5X the msgpack file and the ``target.*`` arrays (never ``state.*``), for Orbax the
``state/`` store (optimizer state shares its OCDBT files), for a torch checkpoint everything but optimizer and
trainer state. Downloads resume (same size + CRC32C are skipped), so a re-run after an interruption is cheap.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuft.backends.base import manifest_gaps
from tpuft.backends.torch_xla import LAYOUT as TORCH_LAYOUT
from tpuft.convert.model_source import ConvertError, pick_step
from tpuft.paths import tpuft_home
from tpuft.storage import open_storage

_T5X_MARKERS = re.compile(r"^(?:(?P<parent>.*)/)?(?P<dir>checkpoint_(?P<step>\d+))/(?P<marker>checkpoint|state/_METADATA)$")
_TORCH_MARKER = re.compile(r"^(?:(?P<parent>.*)/)?(?P<dir>step_(?P<step>\d+))/config\.json$")
_TORCH_SKIP = {"optimizer.pt", "trainer_state.json", "scheduler.pt", "rng_state.pth"}
MANIFEST = TORCH_LAYOUT.manifest or "manifest.json"


@dataclass(frozen=True)
class Selection:
    checkpoint: str
    """The checkpoint's path inside the URL ("" when the URL is the checkpoint)."""
    files: frozenset[str]


def cache_dir(url: str) -> Path:
    return tpuft_home() / "cache" / "convert" / hashlib.sha256(url.encode()).hexdigest()[:16]


def select_files(
    names: list[str], step: int | None, url: str, complete: Callable[[str], list[str]] | None = None
) -> Selection:
    """Pick one checkpoint among the listed object names and the files of it that a conversion reads.
    ``complete(folder)`` says what keeps a torch checkpoint folder from being complete (its manifest's gaps): a
    half-uploaded one is never picked, and one asked for by step is refused with what it lacks."""
    name_set = set(names)
    if "checkpoint" in name_set or "state/_METADATA" in name_set:  # the URL is one T5X checkpoint_N
        return Selection("", frozenset(_t5x_files(names, "")) | _gin(name_set, ""))
    if "config.json" in name_set and ("tf_model.h5" in name_set or any(n.startswith("model") and n.endswith(".safetensors") for n in names)):
        return Selection("", frozenset(n for n in names if "/" not in n and n not in _TORCH_SKIP))
    for pattern in (_T5X_MARKERS, _TORCH_MARKER):
        found: dict[int, str] = {}
        for name in names:
            match = pattern.match(name)
            if match:
                found.setdefault(int(match.group("step")), name[: match.end("dir")])
        if not found:
            continue
        shallowest = min(p.count("/") for p in found.values())
        found = {s: p for s, p in found.items() if p.count("/") == shallowest}
        if pattern is _TORCH_MARKER and complete is not None:
            gaps = {s: complete(p) for s, p in found.items()}
            if step is not None and gaps.get(step):
                raise ConvertError(f"{url}: checkpoint {found[step]} is incomplete ({'; '.join(gaps[step][:3])}); "
                                   "it was being written or uploaded when its run stopped")
            found = {s: p for s, p in found.items() if not gaps[s]}
            if not found:
                raise ConvertError(f"{url}: no complete checkpoint (each step_N/ lacks its manifest or a listed file)")
        chosen = pick_step(sorted((s, p) for s, p in found.items()), step, url)
        if pattern is _T5X_MARKERS:
            parent = chosen.rpartition("/")[0]
            return Selection(chosen, frozenset(_t5x_files(names, chosen)) | _gin(name_set, chosen) | _gin(name_set, parent))
        prefix = chosen + "/"
        files = {n for n in names if n.startswith(prefix) and "/" not in n[len(prefix) :] and n[len(prefix) :] not in _TORCH_SKIP}
        return Selection(chosen, frozenset(files))
    raise ConvertError(
        f"{url}: no checkpoint found (looked for T5X checkpoint_N/, torch checkpoints/step_N/, or a save_pretrained dir)"
    )


def _t5x_files(names: list[str], ckpt: str) -> list[str]:
    prefix = f"{ckpt}/" if ckpt else ""
    wanted = []
    for name in names:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if rest == "checkpoint" or rest.startswith("target.") or rest.startswith("state/") or rest == "_CHECKPOINT_METADATA":
            wanted.append(name)
    return wanted


def _gin(names: set[str], folder: str) -> frozenset[str]:
    path = f"{folder}/config.gin" if folder else "config.gin"
    return frozenset({path} & names)


def fetch_checkpoint(url: str, step: int | None, *, project: str | None = None) -> Path:
    """Download the chosen checkpoint of ``url`` into a cache dir; returns its local path (same layout below)."""
    storage = open_storage(url, project=project)
    sizes = storage.sizes("")
    if not sizes:
        raise ConvertError(f"{url}: no such checkpoint (nothing is stored under it)")

    def gaps(folder: str) -> list[str]:
        inside = {rel[len(folder) + 1 :]: size for rel, size in sizes.items() if rel.startswith(folder + "/")}
        return manifest_gaps(storage.read_text(f"{folder}/{MANIFEST}"), inside)

    selection = select_files(sorted(sizes), step, url, gaps)
    local = cache_dir(url)
    storage.download_tree("", local, include=lambda rel: rel in selection.files)
    return local / selection.checkpoint if selection.checkpoint else local


def upload_model(local_dir: Path, url: str, *, overwrite: bool, project: str | None = None) -> int:
    """Upload a finished HF dir; config.json goes last, so a reader never finds a config without its weights."""
    storage = open_storage(url, project=project)
    if storage.list("") and not overwrite:
        raise ConvertError(f"{url}: already holds files (pass --overwrite to replace them)")
    config = local_dir / "config.json"
    held = local_dir.parent / f".{local_dir.name}.config.json"
    shutil.move(config, held)
    try:
        count = storage.upload_tree(local_dir, "")
        storage.upload_file(held, "config.json")
    finally:
        shutil.move(held, config)
    return count + 1
