"""The ``tpuft`` entry point. Top-level ``--help``/``--version`` are answered from the table below without importing
Typer and Rich (they cost ~10x Python's own start-up); everything else goes to the Typer app in ``tpuft.cli``.

``tests/test_cli.py`` checks that this table matches the app's commands, panels and docstrings.
"""

from __future__ import annotations

import os
import sys

from tpuft import __version__

SUMMARY = "T5-family fine-tuning on Cloud TPU VMs, end to end: create, setup, train, monitor, convert."
QUICKSTART = "Quick start on this machine (a local CPU 'pod' of 2 workers): tpuft up quickstart"

COMMANDS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Cluster",
        [
            ("create", "Create the cluster (TPU VM / pod slice, or local worker folders) and its bucket. Safe to run twice."),
            ("status", "Show the cluster's state and its workers."),
            ("delete", "Delete the cluster's workers. Runs in the bucket are kept."),
            ("exec", "Run a command on every worker (or some) in parallel, with prefixed output."),
            ("ssh", "Open an interactive shell on one worker (SSH on GCP; the worker's folder locally)."),
        ],
    ),
    (
        "Training",
        [
            ("setup", "Install the recipe's backend environment on every worker, in parallel (cached: the second time takes seconds)."),
            ("train", "Launch the recipe on every worker, stream their logs, stop all of them if one fails."),
            ("up", "Create, set up, train, summarize and export in one go."),
        ],
    ),
    (
        "Results",
        [
            ("monitor", "Show a run's progress: step, loss, eval metrics, throughput, ETA and worker heartbeats."),
            ("convert", "Turn a training checkpoint into a Hugging Face model dir (config.json, model.safetensors, tokenizer)."),
        ],
    ),
    ("Recipes", [("recipes", "List, show, copy and validate recipes.")]),
]


def top_level_help(color: bool) -> str:
    bold = (lambda s: f"\033[1m{s}\033[0m") if color else (lambda s: s)
    width = max(len(name) for _, commands in COMMANDS for name, _ in commands)
    lines = [f"{bold('Usage:')} tpuft [OPTIONS] COMMAND [ARGS]...", "", f" {SUMMARY}", "", f" {QUICKSTART}", ""]
    lines += [bold("Options:"), "  --version   Print the version and exit.", "  -h, --help  Show this message and exit.", ""]
    for panel, commands in COMMANDS:
        lines.append(bold(f"{panel}:"))
        lines += [f"  {name.ljust(width)}  {summary}" for name, summary in commands]
        lines.append("")
    lines.append("Run 'tpuft COMMAND --help' for a command's options and an example.")
    return "\n".join(lines)


def main() -> None:
    args = sys.argv[1:]
    if args in ([], ["--help"], ["-h"]):
        color = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        print(top_level_help(color))
        sys.exit(0)
    if args == ["--version"]:
        print(f"tpuft {__version__}")
        sys.exit(0)
    from tpuft.cli import main as cli_main

    cli_main()
