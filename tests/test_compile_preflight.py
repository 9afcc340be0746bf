"""``recipes show --compile`` answers or fails fast (issue 39, item 4), through the CLI, with no compile:

* a paper estimate far over the chip's HBM (T5's xxl on a v4-8, no partitioning) is the answer at once, with
  what would fit, and nothing installed; ``--force-compile`` goes on to the compile, said first with its
  expected time and memory;
* before anything is installed, sources that cannot be reached (T5X's git repositories, here rewritten by
  git's own ``insteadOf`` to a closed loopback port, so nothing leaves this machine), a ``backend.t5x_source``
  that does not exist, and a pip index out of reach (a closed loopback port, pip's configuration files off)
  are located problems naming ``backend.t5x_source``, exit code 2, in seconds;
* an install that fails anyway shows its last lines and names the setting.

Every test runs with an empty venv cache of its own (``TPUFT_VENV_CACHE``): were a check missing, the command
would start building the T5X venv, and pip would find only the closed port (``PIP_RETRIES=0``) and fail.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from tpuft.core.errors import TpuftError
from tpuft.ops.compile_fit import _run_with_progress

RECIPE = Path(__file__).resolve().parents[1] / "tpuft" / "recipes" / "t5x_quickstart.yaml"
XXL = ["--set", "backend.gin_overrides={}", "--set", "backend.family=t5_1_1", "--set", "backend.size=xxl"]


def closed_port() -> int:
    """A loopback port that nothing listens on: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty venv cache; git's GitHub URLs rewritten to a closed loopback port (and https refused, should
    the rewrite not apply); pip's index a closed loopback port, its configuration files and find-links off."""
    port = closed_port()
    cache = tmp_path / "venvs"
    monkeypatch.setenv("TPUFT_VENV_CACHE", str(cache))
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.http://127.0.0.1:{port}/.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://github.com/")
    monkeypatch.setenv("GIT_ALLOW_PROTOCOL", "http:file")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    return cache


def wheelhouse(folder: Path) -> Path:
    """A folder holding a wheel of each source package (never installed: the index check stops first)."""
    folder.mkdir()
    for name in ("t5x", "airio", "jestimator"):
        (folder / f"{name}-0.0.1-py3-none-any.whl").write_bytes(b"")
    return folder


def test_a_decisive_estimate_answers_at_once_with_what_would_fit(cli, offline: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "--summary", str(RECIPE), *XXL, "-a", "v4-8", "--compile", "--json")
    assert result.code == 0, result.err
    fit = json.loads(result.out)["compile"]
    assert fit["decisive_estimate"] is True and fit["fits"] is False and "compiled" not in fit
    assert fit["total_bytes_per_device"] > 1.5 * fit["hbm_bytes_per_device"]
    assert "not compiled" in fit["verdict"] and "--force-compile" in fit["verdict"]
    kinds = " | ".join(fit["suggestions"])
    assert "backend.num_partitions: " in kinds and "a v5p-8 " in kinds and "backend.size: xl " in kinds, kinds
    assert not offline.exists()  # nothing installed, nothing built

    text = cli("recipes", "show", "--summary", str(RECIPE), *XXL, "-a", "v4-8", "--compile")
    assert text.code == 0 and "does not fit: needs 86.9 GiB of 32.0 GiB per chip on v4-8" in " ".join(
        text.out.split()
    )


def test_check_fit_stops_on_a_decisive_estimate(cli, offline: Path) -> None:  # type: ignore[no-untyped-def]
    """``train --check-fit`` on the default local cluster (a v4-16: 8 chips, data parallel) stops on the
    paper verdict, before anything is created, installed or compiled."""
    result = cli("train", str(RECIPE), *XXL, "--check-fit")
    assert result.code == 2, result.out + result.err
    said = " ".join(result.err.split())
    assert "not compiled" in said and "--force-compile" in said and "v4-16" in said
    assert not offline.exists()


def test_force_compile_says_what_the_compile_costs_then_fails_fast_on_git(cli, offline: Path) -> None:  # type: ignore[no-untyped-def]
    result = cli("recipes", "show", "--summary", str(RECIPE), *XXL, "-a", "v4-8", "--force-compile")
    assert result.code == 2, result.out + result.err
    said = " ".join(result.err.split())
    assert "expect the compile of T5X's train step of t5_1_1 xxl" in said and "GB of memory" in said
    assert "an estimate, scaled by parameter count" in said
    line = RECIPE.read_text().splitlines().index("backend:") + 1
    for package in ("t5x", "airio", "jestimator"):
        assert f"{RECIPE}:{line}: backend.t5x_source: {package} comes from https://github.com/" in said, said
    assert "which git cannot reach" in said and "127.0.0.1" in said
    assert "backend.t5x_source chooses where t5x, airio and jestimator come from" in said
    assert "Traceback" not in result.err and not offline.exists()


def compile_with_source(cli, source: Path):  # type: ignore[no-untyped-def]
    """``recipes show --summary --compile`` of the quickstart for a v4-8 with ``backend.t5x_source`` set."""
    settings = ("--set", f"backend.t5x_source={source}")
    return cli("recipes", "show", "--summary", str(RECIPE), "-a", "v4-8", "--compile", *settings)


def test_a_t5x_source_that_does_not_exist_is_named_before_any_install(
    cli, offline: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nowhere" / "t5x.whl"
    result = compile_with_source(cli, missing)
    assert result.code == 2, result.out + result.err
    said = " ".join(result.err.split())
    assert f"--set backend.t5x_source={missing}: backend.t5x_source: {missing} does not exist" in said
    assert not offline.exists()


def test_an_unreachable_pip_index_is_named_before_any_install(cli, offline: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    wheels = wheelhouse(tmp_path / "wheels")
    result = compile_with_source(cli, wheels)
    assert result.code == 2, result.out + result.err
    said = " ".join(result.err.split())
    assert "pip's index cannot be reached" in said and "/simple" in said and "Traceback" not in said
    assert "backend.t5x_source: " not in said  # the sources are there: only the index is named
    assert not offline.exists()


def test_a_failed_install_shows_its_last_lines_and_the_setting() -> None:
    """What pip printed last, not a traceback of tpuft's, and the hint that names the setting."""
    script = (
        "import sys; print('Collecting t5x'); print('ERROR: No matching distribution found for t5x'); "
        "sys.exit(1)"
    )
    with pytest.raises(TpuftError) as raised:
        _run_with_progress(
            [sys.executable, "-c", script], "the venv to be built", None, "set backend.t5x_source to ..."
        )
    text = str(raised.value)
    assert (
        "ERROR: No matching distribution found for t5x" in text and "the venv could not be installed" in text
    )
    assert raised.value.hint == "set backend.t5x_source to ..."
