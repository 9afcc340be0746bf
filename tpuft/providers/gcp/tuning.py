"""The GCP provider's waits, in one place so tests can shorten them: every module reads them at call time as
``tuning.NAME``, so patching this module reaches them all."""

from __future__ import annotations

import os

POLL_SECONDS = float(os.environ.get("TPUFT_GCP_POLL_SECONDS", "5"))
"""How often to ask about a long-running operation or a queued resource (tests set it low)."""
RETRY_BASE_S = float(os.environ.get("TPUFT_GCP_RETRY_BASE_S", "1"))
"""First back-off after a transient API error or a network that does not answer; doubles up to 30 s, and the
tries end with the cluster file's ``gcp.timeout`` (the command's budget, :mod:`tpuft.storage.network`), not at
a count."""
HOSTKEY_WAIT_S = float(os.environ.get("TPUFT_GCP_HOSTKEY_WAIT_S", "300"))
"""How long a fresh VM's guest agent may take to publish its SSH host keys before we refuse (tests set it
low)."""
CREATE_TIMEOUT_S = 3600.0
"""How long one long-running operation may take; a queued resource may wait 24 times as long for capacity."""
DELETE_TRIES = 5
"""Delete calls for one resource that may leave it in place (a delete that did not take, read back; a 409 or a
precondition refusal on a resource still being created or changed) before its delete fails, naming it: a
queued resource left behind keeps holding quota, and may even be fulfilled hours later."""
