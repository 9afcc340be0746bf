"""The run storage of a GCP cluster: one bucket, in the region of the cluster's zone, where same-region
traffic is fast and free."""

from __future__ import annotations

from tpuft.core.records import Cluster, Progress


def default_bucket_url(bucket: str | None, project: str) -> str:
    """The cluster file's ``bucket``, else one per project."""
    return bucket or f"gs://{project}-tpuft"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def ensure_bucket(
    bucket_url: str, project: str, region: str, cluster: Cluster, progress: Progress | None
) -> None:
    """Create the bucket in ``region`` unless it exists, and say which in the cluster's details (with the
    storage layer's warning, e.g. a bucket found in another region)."""
    from tpuft.storage import open_storage

    if progress:
        progress(f"bucket {bucket_url} in {region}")
    created, warning = open_storage(bucket_url, project=project).ensure_bucket(region)
    cluster.details["bucket"] = f"{bucket_url} ({'created' if created else 'exists'})"
    if warning:
        cluster.details["bucket_warning"] = warning
