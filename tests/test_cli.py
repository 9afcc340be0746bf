"""Every verb has help with an example; --version; the CLI and the worker keep their imports apart."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpuft import __version__

VERBS = ["create", "setup", "train", "up", "monitor", "convert", "delete", "status", "exec"]


@pytest.mark.parametrize("verb", VERBS + ["recipes ls", "recipes show", "recipes cp", "recipes validate"])
def test_help_has_an_example(cli, verb: str) -> None:  # type: ignore[no-untyped-def]
    result = cli(*verb.split(), "--help")
    assert result.code == 0
    assert "Example: tpuft" in result.out


def test_version(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("--version")
    assert result.code == 0 and result.out.strip() == f"tpuft {__version__}"


def test_unknown_command_is_a_usage_error(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("trian")
    assert result.code == 2


HEAVY = ("torch", "tensorflow", "jax", "transformers", "tf_keras", "torch_xla", "numpy", "safetensors")


def test_cli_imports_no_ml_framework() -> None:
    code = "import sys, tpuft.cli; print(' '.join(m for m in %r if m in sys.modules))" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_worker_does_not_import_the_cli_side() -> None:
    code = (
        "import sys, tpuft.worker.__main__, tpuft.worker.torch_xla_train, tpuft.worker.metrics, tpuft.convert.torch_ckpt;"
        "print(' '.join(m for m in ('typer', 'rich', 'tpuft.cli', 'tpuft.ops', 'tpuft.fleet', 'tpuft.providers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
