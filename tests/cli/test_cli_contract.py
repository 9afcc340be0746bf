"""What a script or a shell relies on: a closed pipe ends quietly, exec passes a worker's exit code through,
--json errors are JSON, help shows one metavar style, -V and shell completion work, on both entry points."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuft import __version__

TYPER_ENTRY = "import sys; from tpuft.cli import main; sys.argv[0] = 'tpuft'; main()"
"""The Typer app without the launcher's fast paths in front of it (``python -c TYPER_ENTRY ARGS``)."""


def closed_early(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with stdout a pipe whose reader is gone before anything is written (what ``| head -1``
    becomes when head has read its line): the exit code and all of stderr."""
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    err = child.stderr.read().decode()
    return child.wait(timeout=60), err


@pytest.fixture
def env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "120"}


def test_a_closed_pipe_ends_every_entry_point_quietly(
    env: dict[str, str], cli, cluster_file: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from tpuft.run import rundir

    assert cli("create", "-c", str(cluster_file)).code == 0
    with_run = tmp_path / "with-run.yaml"  # a finished run with a long log, for `runs` and `logs`
    with_run.write_text(f"name: pipes\nbucket: {tmp_path / 'bucket'}\nlocal:\n  workers: 2\n")
    run = tmp_path / "bucket" / "runs" / "x-1"
    rundir.log_path(run, 0).parent.mkdir(parents=True)
    rundir.log_path(run, 0).write_text("".join(f"line {i}\n" for i in range(20000)))
    (run / rundir.RUN_INFO).write_text(json.dumps({"run_id": "x-1", "status": "finished"}))
    launcher = [sys.executable, "-m", "tpuft"]
    typer_app = [sys.executable, "-c", TYPER_ENTRY]
    cases = (
        [launcher + ["--help"]] * 6
        + [launcher + ["-V"]] * 2
        + [
            typer_app + ["train", "--help"],
            typer_app + ["recipes", "ls"],
            typer_app + ["status", "-c", str(cluster_file), "--json"],
            launcher + ["runs", "-c", str(with_run)],
            launcher + ["logs", "x-1", "-c", str(with_run)],
            launcher
            + ["exec", "-c", str(cluster_file), "--", "seq 1 20000"],  # the fast path's reader threads
            typer_app
            + ["exec", "-c", str(cluster_file), "--", "seq 1 20000"],  # Rich's console in reader threads
        ]
    )
    for argv in cases:
        code, err = closed_early(argv, env)
        assert err == "" and code in (0, 141), (argv[2:], code, err)


def test_exec_exits_with_the_failing_workers_own_code(cli, cluster_file: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("create", "-c", str(cluster_file)).code == 0
    one_fails = cli("exec", "-c", str(cluster_file), "--", 'if [ "$TPUFT_WORKER_ID" = 1 ]; then exit 3; fi')
    assert one_fails.code == 3 and "failed on worker 1 (exit code 3)" in one_fails.err
    # Both fail with their own codes: the first to fail (it stops the other) gives tpuft's code.
    both_fail = cli(
        "exec",
        "-c",
        str(cluster_file),
        "--",
        'if [ "$TPUFT_WORKER_ID" = 0 ]; then exit 5; fi; sleep 2; exit 6',
    )
    assert both_fail.code == 5 and "failed on worker 0 (exit code 5)" in both_fail.err
    killed = cli("exec", "-c", str(cluster_file), "-w", "0", "--", "kill -9 $$")
    assert killed.code == 128 + 9  # a death by signal as a shell reports it


def test_json_verbs_print_their_errors_as_json(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cases = {
        ("status", "--json", "-c", str(tmp_path / "missing.yaml")): 2,  # config
        ("runs", "--json", "--no-such-option"): 2,  # usage, found by Click before the verb runs
        ("recipes", "show", "no_such_recipe", "--json"): 2,
        ("monitor", "--json", "--interval", "0"): 2,  # the verb's own check
    }
    for args, code in cases.items():
        result = cli(*args)
        payload = json.loads(result.out)
        assert result.code == code == payload["exit_code"] and payload["error"] and result.err == "", (
            args,
            result,
        )
        assert set(payload) <= {"error", "hint", "exit_code", "problems"}
    assert (
        "missing.yaml"
        in json.loads(cli("status", "--json", "-c", str(tmp_path / "missing.yaml")).out)["problems"][0]
    )
    plain = cli("status", "-c", str(tmp_path / "missing.yaml"))
    assert plain.out == "" and "error:" in plain.err


def every_command():  # type: ignore[no-untyped-def]
    from typer.main import get_command

    from tpuft.cli import app

    root = get_command(app)
    yield [], root
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        yield [name], command
        for sub, leaf in getattr(command, "commands", {}).items():
            yield [name, sub], leaf


METAVAR = re.compile(r"[A-Z][A-Z_=]*(\.\.\.)?|[a-z0-9_-]+(\|[a-z0-9_-]+)+")
"""Capitals (PATH, KEY=VALUE, RUN_ID), or a choice's own values (a|b)."""


def test_help_shows_one_metavar_style_and_no_bool(cli) -> None:  # type: ignore[no-untyped-def]
    import typer

    for path, command in every_command():
        context = typer.Context(command, info_name="tpuft")  # type: ignore[arg-type]
        for param in command.get_params(context):
            shown = param.display_type_rich(context)  # type: ignore[attr-defined]
            if getattr(param, "is_flag", False) or param.param_type_name == "argument":
                assert not shown, (path, param.name, shown)
            else:
                assert METAVAR.fullmatch(shown or ""), (path, param.name, shown)
            if param.param_type_name == "argument":
                assert param.display_name_raw.isupper(), (path, param.name)  # type: ignore[attr-defined]
        text = cli(*path, "--help").out
        assert not re.search(r"<\w+(\[\w+\])?>|\{[A-Za-z_]+\}", text), (path, text)


def test_version_and_completion(cli, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    for flag in ("-V", "--version"):
        assert cli(flag).out.strip() == f"tpuft {__version__}"
        fast = subprocess.run([sys.executable, "-m", "tpuft", flag], capture_output=True, text=True, env=env)
        assert fast.stdout.strip() == f"tpuft {__version__}"
    script = subprocess.run(
        [sys.executable, "-m", "tpuft", "--show-completion", "bash"], capture_output=True, text=True, env=env
    )
    assert script.returncode == 0 and "complete " in script.stdout and "_TPUFT_COMPLETE" in script.stdout
    # What the shell's completion function does: tpuft with no arguments and the words in the environment.
    words = {**env, "_TPUFT_COMPLETE": "complete_bash", "COMP_WORDS": "tpuft recipes v", "COMP_CWORD": "2"}
    answer = subprocess.run([sys.executable, "-m", "tpuft"], capture_output=True, text=True, env=words)
    assert answer.stdout.split() == ["validate"]
    fast_help = subprocess.run(
        [sys.executable, "-m", "tpuft", "--help"], capture_output=True, text=True, env=env
    ).stdout
    assert "-V, --version" in fast_help and "--install-completion" in fast_help


def test_the_venv_cache_moves_with_its_own_variable(
    cli, cluster_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """TPUFT_VENV_CACHE moves it, XDG_CACHE_HOME too; TPUFT_HOME (a throw-away home) does not: the venvs are
    shared (docs/how-it-works.md, 'Where things live on this machine')."""
    assert cli("create", "-c", str(cluster_file)).code == 0

    def shown() -> str:
        return json.loads(cli("status", "-c", str(cluster_file), "--json").out)["details"]["venv_cache"]

    monkeypatch.delenv("TPUFT_VENV_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert shown() == str((tmp_path / "xdg" / "tpuft" / "venvs").resolve())
    monkeypatch.setenv("TPUFT_VENV_CACHE", str(tmp_path / "venvs"))
    assert shown() == str((tmp_path / "venvs").resolve())
    assert not shown().startswith(os.environ["TPUFT_HOME"])


def test_a_network_error_of_a_json_verb_is_json(tmp_path: Path, env: dict[str, str]) -> None:
    """Credentials whose token endpoint and the TPU API are closed ports of this machine: the one located
    error, as JSON on stdout, exit code 1 (the input was fine)."""
    import socket

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    with socket.socket() as probe:  # a port nothing listens on: bound, then released
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    account = {
        "type": "service_account",
        "project_id": "tpuft-test",
        "private_key_id": "k1",
        "private_key": pem.decode(),
        "client_email": "t@tpuft-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": f"http://127.0.0.1:{port}/token",
    }
    (tmp_path / "adc.json").write_text(json.dumps(account))
    (tmp_path / "tpuft.yaml").write_text(
        "name: t5-v4\nprovider: gcp\naccelerator: v4-8\ngcp:\n  project: tpuft-test\n  zone: us-central2-b\n "
        " timeout: 1s\n"
        f"  tpu_api_endpoint: https://127.0.0.1:{port}\n"
    )
    quiet = {
        k: v
        for k, v in env.items()
        if not k.upper().endswith("_PROXY") and k not in ("STORAGE_EMULATOR_HOST", "API_ENDPOINT_OVERRIDE")
    }
    quiet.update(
        GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "adc.json"),
        CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
        NO_PROXY="*",
    )
    done = subprocess.run(
        [sys.executable, "-m", "tpuft", "status", "--json", "-c", str(tmp_path / "tpuft.yaml")],
        env=quiet,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    payload = json.loads(done.stdout)
    assert done.returncode == payload["exit_code"] == 1 and done.stderr == "", done
    assert f"127.0.0.1:{port}" in payload["error"] and payload["hint"], payload
