"""Every verb that talks to Google Cloud fails fast and in one located line when the network does (issue 25).

Credentials are present (a service account whose token endpoint is a closed port on 127.0.0.1), the cluster's
Cloud TPU API endpoint is another closed port (https, so the real credentials are used, not the anonymous ones
of the test rigs), and Cloud Storage is a third (``API_ENDPOINT_OVERRIDE``: the storage client keeps the
credentials, so its first request is a token refresh that fails). Each verb runs as the user runs it (``python
-m tpuft``), all at once, with ``gcp.timeout: 1s``: exit code 1, no traceback, a few lines naming what was
being done and the endpoint, and done within the timeout plus 5 s beyond what starting tpuft takes on this
machine at the same moment (the baseline, ``status`` of a local cluster, run among them: the suite's machine
may be busy). Nothing here reaches a host but 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpuft.config import GcpConfig

TIMEOUT_S = 1.0
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "20260101-000000-abcd"

VERBS: dict[str, list[str]] = {
    "status": ["status"],
    "create": ["create", "--yes"],
    "delete": ["delete", "--yes"],
    "ssh": ["ssh"],
    "exec": ["exec", "--", "true"],
    "runs": ["runs"],
    "monitor": ["monitor", "--once"],
    "logs": ["logs"],
    "pull": ["pull"],
    "setup": ["setup", "quickstart"],
    "train": ["train", "quickstart"],
    "up": ["up", "quickstart", "--yes"],
    "stop": ["stop"],
    "resume": ["resume", RUN_ID],
    "attach": ["attach"],
    "tensorboard": ["tensorboard"],
    "convert": ["convert", f"gs://tpuft-test-tpuft/runs/{RUN_ID}/checkpoints/step-10", "{tmp}/converted"],
    "runs (storage refused)": ["runs"],  # Storage itself at a closed port (anonymous, as against an emulator)
}
BASELINES = ["baseline 1", "baseline 2", "baseline 3"]  # `status -c local.yaml`: starting tpuft, no network
LOCATED = re.compile(
    r"error: (?P<what>\S.*?): no answer from (?P<where>.+? at \S+?)(?: for \d+s)? \((?P<why>[^)]+)\)"
)


def closed_port() -> int:
    """A loopback port that nothing listens on: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_account(token_uri: str) -> dict[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        "type": "service_account",
        "project_id": "tpuft-test",
        "private_key_id": "k1",
        "private_key": pem.decode(),
        "client_email": "tpuft@tpuft-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }


@dataclass
class Outcome:
    code: int
    output: str
    seconds: float


@dataclass
class Down:
    ports: dict[str, int]
    outcomes: dict[str, Outcome]

    @property
    def start_up(self) -> float:
        """How long starting tpuft took while the verbs ran (the slowest of the baselines)."""
        return max(self.outcomes[name].seconds for name in BASELINES)


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> Down:
    tmp = tmp_path_factory.mktemp("network-down")
    ports = {"tpu": closed_port(), "storage": closed_port(), "token": closed_port()}
    credentials = tmp / "adc.json"
    credentials.write_text(json.dumps(service_account(f"http://127.0.0.1:{ports['token']}/token")))
    cluster = tmp / "tpuft.yaml"
    cluster.write_text(
        "name: t5-v4\nprovider: gcp\naccelerator: v4-8\n"
        f"gcp:\n  project: tpuft-test\n  zone: us-central2-b\n  timeout: {TIMEOUT_S:.0f}s\n"
        f"  tpu_api_endpoint: https://127.0.0.1:{ports['tpu']}\n"
    )
    local = tmp / "local.yaml"
    local.write_text("name: baseline\nprovider: local\naccelerator: v4-8\n")
    env = {
        k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and not k.startswith("TPUFT_")
    }
    for leftover in (
        "STORAGE_EMULATOR_HOST",
        "API_ENDPOINT_OVERRIDE",
        "CLOUDSDK_CONFIG",
        "GOOGLE_CLOUD_PROJECT",
    ):
        env.pop(leftover, None)
    env.update(
        GOOGLE_APPLICATION_CREDENTIALS=str(credentials),
        API_ENDPOINT_OVERRIDE=f"http://127.0.0.1:{ports['storage']}",
        CLOUDSDK_CONFIG=str(tmp / "gcloud"),  # no gcloud settings of this machine's user
        TPUFT_HOME=str(tmp / "home"),
        TPUFT_CONFIG=str(cluster),
        TPUFT_NO_AGENT="1",
        COLUMNS="200",
        NO_PROXY="*",
    )

    def run(name: str) -> tuple[str, Outcome]:
        argv = (
            ["status", "-c", str(local)]
            if name in BASELINES
            else [a.replace("{tmp}", str(tmp)) for a in VERBS[name]]
        )
        verb_env = dict(env)
        if "storage refused" in name:
            verb_env.pop("API_ENDPOINT_OVERRIDE")
            verb_env["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{ports['storage']}"
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tpuft", *argv],
            cwd=tmp,
            env=verb_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return name, Outcome(done.returncode, done.stdout + done.stderr, time.monotonic() - started)

    names = list(VERBS)
    order = [BASELINES[0], *names[:9], BASELINES[1], *names[9:], BASELINES[2]]
    with ThreadPoolExecutor(max_workers=4) as pool:  # each mostly waits out its timeout: a few at a time
        outcomes = dict(pool.map(run, order))
    return Down(ports, outcomes)


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_verb_fails_in_one_located_line_within_the_timeout(down: Down, verb: str) -> None:
    outcome = down.outcomes[verb]
    shown = f"{verb}: exit {outcome.code} after {outcome.seconds:.1f}s:\n{outcome.output}"
    assert outcome.code == 1, shown
    assert "Traceback" not in outcome.output and len(outcome.output.strip().splitlines()) <= 3, shown
    located = LOCATED.search(outcome.output)
    assert located, shown
    ours = {f"127.0.0.1:{port}" for port in down.ports.values()}
    assert any(address in located["where"] for address in ours), shown
    assert located["where"].startswith(
        ("the Cloud TPU API at https://", "the OAuth2 token endpoint at http://", "Cloud Storage at http://")
    ), shown
    assert located["why"] == "connection refused", shown
    assert "gcloud auth application-default login" in outcome.output, shown  # what to check
    assert outcome.seconds - down.start_up < TIMEOUT_S + 5, (
        f"{shown}\n(starting tpuft took {down.start_up:.1f}s)"
    )


def test_the_tpu_and_storage_endpoints_are_named_as_what_failed(down: Down) -> None:
    tpu = LOCATED.search(down.outcomes["status"].output)
    assert tpu and tpu["what"] == "reading TPU node nodes/t5-v4", down.outcomes["status"].output
    assert tpu["where"] == f"the Cloud TPU API at https://127.0.0.1:{down.ports['tpu']}"
    token = LOCATED.search(down.outcomes["runs"].output)
    assert token and token["what"] == "list runs gs://tpuft-test-tpuft/runs/", down.outcomes["runs"].output
    assert token["where"] == f"the OAuth2 token endpoint at http://127.0.0.1:{down.ports['token']}/token"
    storage = LOCATED.search(down.outcomes["runs (storage refused)"].output)
    assert storage and storage["where"] == f"Cloud Storage at http://127.0.0.1:{down.ports['storage']}"


def test_many_calls_share_one_budget_and_a_later_call_still_gets_its_try() -> None:
    """The budget is the command's, not each call's: once a down network has used it up, the next calls fail
    at once (one quick try each, so a long-lived command notices when the network is back)."""
    from tpuft.providers.gcp import tuning
    from tpuft.providers.gcp.api import TpuApi
    from tpuft.storage.network import CLOCK, CloudUnreachable

    port = closed_port()
    api = TpuApi("tpuft-test", "us-central2-b", "t5-v4", 1, f"http://127.0.0.1:{port}", timeout=1.0)
    saved = tuning.RETRY_BASE_S
    tuning.RETRY_BASE_S = 0.05
    started = time.monotonic()
    try:
        for _ in range(5):
            with pytest.raises(
                CloudUnreachable, match=rf"reading TPU node nodes/t5-v4: no answer from .*:{port}"
            ):
                api.call("reading TPU node", api.client().get_node, name=api.node_path("t5-v4"))
        assert time.monotonic() - started < 1.0 + 2.0
    finally:
        tuning.RETRY_BASE_S = saved
        CLOCK.disarm()


def test_the_baseline_is_a_plain_start(down: Down) -> None:
    for name in BASELINES:
        assert down.outcomes[name].code == 0 and "NOT_FOUND" in down.outcomes[name].output, down.outcomes[
            name
        ]


def test_the_default_budget_is_at_most_30s() -> None:
    assert GcpConfig().timeout <= 30
    assert GcpConfig(timeout="5s").timeout == 5


def test_a_silent_endpoint_is_bounded_too() -> None:
    """A port that accepts and never answers (a firewall that drops, a dead proxy): each request waits at most
    what is left of the budget, not the libraries' 60-120 s."""
    from tpuft.providers.gcp.api import TpuApi
    from tpuft.storage.network import CLOCK, LAST_TRY_S, CloudUnreachable

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing ever reads or answers
        port = silent.getsockname()[1]
        api = TpuApi("tpuft-test", "us-central2-b", "t5-v4", 1, f"http://127.0.0.1:{port}", timeout=1.0)
        started = time.monotonic()
        try:
            with pytest.raises(
                CloudUnreachable, match=r"no answer from the Cloud TPU API at .* \(timed out\)"
            ):
                api.call("reading TPU node", api.client().get_node, name=api.node_path("t5-v4"))
        finally:
            CLOCK.disarm()
        assert time.monotonic() - started < 1.0 + LAST_TRY_S + 1.0


NETWORK_OR_NOT: dict[str, bool] = {
    "TransportError": True,  # google.auth: the token endpoint did not answer
    "requests.ConnectionError": True,
    "requests.Timeout": True,
    "socket.gaierror": True,  # DNS
    "ConnectionRefusedError": True,
    "RetryError(ConnectionError)": True,  # a library's retries ran out on the network
    "ServiceUnavailable": True,  # 503, and gRPC's UNAVAILABLE as google.api_core maps it
    "DeadlineExceeded": True,
    "RefreshError(invalid_grant)": False,  # the token endpoint answered: the credentials are bad
    "PermissionDenied": False,
    "NotFound": False,
    "FileNotFoundError": False,
    "ValueError": False,
}


def an_error(name: str) -> BaseException:
    import requests
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    return {
        "TransportError": lambda: auth.TransportError("token endpoint down"),
        "requests.ConnectionError": lambda: requests.ConnectionError("refused"),
        "requests.Timeout": lambda: requests.Timeout("read timed out"),
        "socket.gaierror": lambda: socket.gaierror(-2, "Name or service not known"),
        "ConnectionRefusedError": lambda: ConnectionRefusedError(111, "Connection refused"),
        "RetryError(ConnectionError)": lambda: api.RetryError(
            "Timeout of 120.0s exceeded", requests.ConnectionError()
        ),
        "ServiceUnavailable": lambda: api.ServiceUnavailable("503"),
        "DeadlineExceeded": lambda: api.DeadlineExceeded("504"),
        "RefreshError(invalid_grant)": lambda: auth.RefreshError("invalid_grant: Bad Request"),
        "PermissionDenied": lambda: api.PermissionDenied("403"),
        "NotFound": lambda: api.NotFound("404"),
        "FileNotFoundError": lambda: FileNotFoundError(2, "No such file"),
        "ValueError": lambda: ValueError("bad"),
    }[name]()


@pytest.mark.parametrize("name", list(NETWORK_OR_NOT))
def test_what_counts_as_the_network_failing(name: str) -> None:
    """One classification for the TPU API and Storage: the way to the cloud failed (retry, then say so), or
    the cloud answered no (say what it said, at once)."""
    from tpuft.storage.network import is_network_error

    assert is_network_error(an_error(name)) is NETWORK_OR_NOT[name]
