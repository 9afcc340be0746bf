"""How a command reaches every worker: local processes now, SSH with the GCP provider."""

from tpuft.fleet.base import Fleet, FleetResult, WorkerResult

__all__ = ["Fleet", "FleetResult", "WorkerResult"]
