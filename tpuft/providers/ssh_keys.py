"""The user's SSH key for TPU VMs, handled the way gcloud does: ``~/.ssh/google_compute_engine`` by default,
created with ssh-keygen when missing, and published as ``USER:KEY`` in the instance metadata ``ssh-keys``."""

from __future__ import annotations

import getpass
import subprocess
from pathlib import Path

from tpuft.core.errors import TpuftError


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "tpuft"


def ensure_key(key_file: Path, user: str) -> str:
    """Return the public key line, creating the key pair (RSA 3072, like gcloud) when there is none."""
    public = Path(f"{key_file}.pub")
    if not key_file.exists():
        key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        done = subprocess.run(
            ["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-C", user, "-f", str(key_file)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise TpuftError(f"could not create SSH key {key_file}: {done.stderr.strip()}")
    if not public.exists():
        done = subprocess.run(["ssh-keygen", "-y", "-f", str(key_file)], capture_output=True, text=True)
        if done.returncode != 0:
            raise TpuftError(f"could not read SSH key {key_file}: {done.stderr.strip()}")
        public.write_text(done.stdout)
    return public.read_text().strip()
