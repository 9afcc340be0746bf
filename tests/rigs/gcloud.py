"""The real gcloud (``/usr/bin/gcloud`` where installed) pointed at the stand-in APIs: what the fan-out
benchmark races against and what the create-body tests record gcloud's requests with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

GCLOUD = "/usr/bin/gcloud"


def gcloud_available() -> bool:
    return Path(GCLOUD).exists() or shutil.which("gcloud") is not None


def gcloud_env(
    root: Path, project: str, *, tpu_endpoint: str | None = None, compute_endpoint: str | None = None
) -> dict[str, str]:
    """gcloud's environment: the stand-ins' endpoints (``http://127.0.0.1:PORT``), a token from a file (the
    stand-ins take any), its own config folder and HOME (its known_hosts goes there, not in ~/.ssh), and no
    prompts or update checks."""
    home = root / "gcloud-home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    token = root / "gcloud-token"
    token.write_text("fake-token\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")},
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(root / "gcloud-config"),
        "CLOUDSDK_CORE_PROJECT": project,
        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
    }
    if tpu_endpoint:
        env["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"] = f"{tpu_endpoint.rstrip('/')}/"
    if compute_endpoint:
        env["CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE"] = f"{compute_endpoint.rstrip('/')}/compute/v1/"
    return env
