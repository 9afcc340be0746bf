"""Mirror a growing local run directory to run storage, while it grows and once more at the end.

Objects in a bucket cannot be appended to, so a worker writes its run files (metrics, heartbeats, TensorBoard
events, checkpoints, export) to a local staging folder, and this thread uploads what changed every few seconds
and once more at the end. Half-written checkpoints (``*.tmp``) are skipped until they are renamed into place.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

SYNC_SECONDS = float(os.environ.get("TPUFT_SYNC_SECONDS", "15"))


class RunDirSync:
    def __init__(self, local: Path, storage: Any) -> None:
        self.local = local
        self.storage = storage
        """Rooted at the run dir: files keep their relative paths."""
        self._seen: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tpuft-sync", daemon=True)

    def start(self) -> RunDirSync:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(SYNC_SECONDS):
            try:
                self.sync_once()
            except Exception as exc:  # noqa: BLE001 - a failed upload is retried next round, training goes on
                print(f"[tpuft] run dir sync failed (will retry): {exc}", flush=True)

    def changed_files(self) -> list[tuple[Path, str]]:
        out = []
        for path in sorted(self.local.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(self.local).as_posix()
            if any(part.endswith(".tmp") or part.startswith(".") for part in rel.split("/")):
                continue
            stat = path.stat()
            key = (stat.st_size, stat.st_mtime_ns)
            if self._seen.get(rel) != key:
                out.append((path, rel))
                self._seen[rel] = key
        return out

    def sync_once(self) -> int:
        changed = self.changed_files()
        for path, rel in changed:
            self.storage.upload_file(path, rel)
        return len(changed)

    def close(self) -> None:
        """Stop the thread and upload what is left (called at the end, and on failure)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=SYNC_SECONDS + 5)
        self.sync_once()
