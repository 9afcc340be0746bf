"""Checkpoints in a bucket: fetch only what a conversion reads, through the storage layer, resumably.

A T5X model dir in GCS holds every step and the optimizer state (for t5-xxl, tens of GB beside the weights);
the converter needs one step's parameters. So the listing decides the step first, then only that step's files
are downloaded. Which folders are checkpoints, which of their files hold the weights and which checkpoints are
complete, each backend's :class:`~tpuft.backends.spec.RunLayout` says (``markers``, ``weights``,
``not_weights``, ``companions``, ``manifest``), asked through the registry: no backend is named here.
Downloads resume (same size + CRC32C are skipped), so a re-run after an interruption is cheap.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpuft.backends.registry import kinds, layout
from tpuft.backends.spec import RunLayout, manifest_gaps
from tpuft.convert.model_source import ConvertError, pick_step
from tpuft.core.paths import tpuft_home
from tpuft.storage import open_storage


@dataclass(frozen=True)
class Selection:
    checkpoint: str
    """The checkpoint's path inside the URL ("" when the URL is the checkpoint)."""
    files: frozenset[str]


def cache_dir(url: str) -> Path:
    return tpuft_home() / "cache" / "convert" / hashlib.sha256(url.encode()).hexdigest()[:16]


def checkpoint_kinds() -> list[list[RunLayout]]:
    """The registered layouts, grouped where they name and mark checkpoints alike (two backends may write the
    same ``step_N`` folders): a group reads a file that every layout of it reads."""
    groups: dict[tuple[str, tuple[str, ...]], list[RunLayout]] = {}
    for kind in kinds():
        one = layout(kind)
        groups.setdefault((one.checkpoint_pattern, one.markers), []).append(one)
    return list(groups.values())


def _reads(group: list[RunLayout], inside: str) -> bool:
    return all(one.conversion_reads(inside) for one in group)


def _files(group: list[RunLayout], names: list[str], checkpoint: str) -> set[str]:
    prefix = f"{checkpoint}/" if checkpoint else ""
    return {n for n in names if n.startswith(prefix) and _reads(group, n[len(prefix) :])}


def _companions(group: list[RunLayout], names: set[str], checkpoint: str) -> set[str]:
    """Companion files in the checkpoint's folder and in the folder above it."""
    folders = [checkpoint] + ([checkpoint.rpartition("/")[0]] if checkpoint else [])
    wanted = {
        f"{folder}/{name}" if folder else name
        for one in group
        for name in one.companions
        for folder in folders
    }
    return wanted & names


def _is_hf_dir(names: set[str]) -> bool:
    """A save_pretrained dir (an export, or a step_N folder given as the URL): a config and its weights."""
    return "config.json" in names and (
        "tf_model.h5" in names or any(n.startswith("model") and n.endswith(".safetensors") for n in names)
    )


def select_files(
    names: list[str], step: int | None, url: str, complete: Callable[[str], list[str]] | None = None
) -> Selection:
    """Pick one checkpoint among the listed object names and the files of it that a conversion reads.
    ``complete(folder)`` says what keeps a checkpoint folder from being complete (its manifest's gaps): a
    half-uploaded one is never picked, and one asked for by step is refused with what it lacks."""
    name_set = set(names)
    groups = checkpoint_kinds()
    for group in groups:  # the URL is one checkpoint
        markers = group[0].markers
        if any(m in name_set for m in markers) and (markers != ("config.json",) or _is_hf_dir(name_set)):
            return Selection("", frozenset(_files(group, names, "") | _companions(group, name_set, "")))
    for group in groups:
        found = _checkpoints(group[0], names)
        if not found:
            continue
        if complete is not None and not all(one.foreign_checkpoints for one in group):
            gaps = {s: complete(p) for s, p in found.items()}
            if step is not None and gaps.get(step):
                raise ConvertError(
                    f"{url}: checkpoint {found[step]} is incomplete ({'; '.join(gaps[step][:3])}); "
                    "it was being written or uploaded when its run stopped"
                )
            found = {s: p for s, p in found.items() if not gaps[s]}
            if not found:
                raise ConvertError(
                    f"{url}: no complete checkpoint (each checkpoint folder lacks its manifest or a "
                    "listed file)"
                )
        chosen = pick_step(sorted(found.items()), step, url)
        return Selection(
            chosen, frozenset(_files(group, names, chosen) | _companions(group, name_set, chosen))
        )
    looked = ", ".join(
        f"{group[0].checkpoint_format.format(step=0)}/{group[0].markers[0]}" for group in groups
    )
    raise ConvertError(
        f"{url}: no checkpoint found (looked for checkpoint folders like {looked}, or a save_pretrained dir)"
    )


def _checkpoints(kind: RunLayout, names: list[str]) -> dict[int, str]:
    """step -> path of each checkpoint folder of this layout in the listing (the shallowest ones)."""
    marker = "|".join(re.escape(m) for m in kind.markers)
    folder = kind.checkpoint_pattern.removeprefix("^").removesuffix("$")
    pattern = re.compile(rf"^(?:.*/)?(?P<dir>{folder})/(?:{marker})$")
    found: dict[int, str] = {}
    for name in names:
        match = pattern.match(name)
        if match:
            path = name[: match.end("dir")]
            step = kind.step_of(path.rpartition("/")[2])
            if step is not None:
                found.setdefault(step, path)
    if not found:
        return {}
    shallowest = min(p.count("/") for p in found.values())
    return {s: p for s, p in found.items() if p.count("/") == shallowest}


def fetch_checkpoint(url: str, step: int | None, *, project: str | None = None) -> Path:
    """Download the chosen checkpoint of ``url`` into a cache dir; returns its local path (same layout
    below)."""
    storage = open_storage(url, project=project)
    sizes = storage.sizes("")
    if not sizes:
        raise ConvertError(f"{url}: no such checkpoint (nothing is stored under it)")

    manifests = sorted({one.manifest for group in checkpoint_kinds() for one in group if one.manifest})

    def gaps(folder: str) -> list[str]:
        inside = {rel[len(folder) + 1 :]: size for rel, size in sizes.items() if rel.startswith(folder + "/")}
        manifest = next((m for m in manifests if m in inside), None)
        if manifest is None:
            return ["no readable manifest"]
        return manifest_gaps(storage.read_text(f"{folder}/{manifest}"), inside)

    selection = select_files(sorted(sizes), step, url, gaps)
    local = cache_dir(url)
    storage.download_tree("", local, include=lambda rel: rel in selection.files)
    return local / selection.checkpoint if selection.checkpoint else local


def upload_model(local_dir: Path, url: str, *, overwrite: bool, project: str | None = None) -> int:
    """Upload a finished HF dir; config.json goes last, so a reader never finds a config without its
    weights."""
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
