"""Run storage: where run directories live. A local folder for the local provider; ``gs://`` comes with the GCP
provider (through google-cloud-storage), behind this same small interface."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpuft.errors import UsageError

RUNS = "runs"


@dataclass(frozen=True)
class LocalStorage:
    root: Path

    @property
    def url(self) -> str:
        return str(self.root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / RUNS / run_id

    def run_ids(self) -> list[str]:
        """Run ids, oldest first (ids start with the recipe name, so order by creation time)."""
        runs = self.root / RUNS
        if not runs.is_dir():
            return []
        found = [p for p in runs.iterdir() if p.is_dir()]
        return [p.name for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.name))]


def open_storage(url: str) -> LocalStorage:
    if url.startswith("gs://"):
        raise UsageError(f"{url}: gs:// run storage needs the GCP provider, which this version does not have yet")
    return LocalStorage(Path(url).expanduser())
