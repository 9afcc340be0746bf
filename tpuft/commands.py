"""The one table of tpuft's verbs: name, panel, summary, details and an example.

Both ways into tpuft read it: the fast launcher (top-level ``--help`` without importing Typer or Rich) and the
Typer app (each command's ``--help``), so the two cannot drift apart. Stdlib only, imported at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

SUMMARY = "T5-family fine-tuning on Cloud TPU VMs, end to end: create, setup, train, monitor, convert."
QUICKSTART = "Quick start, on a local CPU 'pod' of 2 workers: tpuft up quickstart"


class Verb:
    """One verb. A plain class, not a dataclass: importing dataclasses would cost ``tpuft --help`` a fifth of
    its start-up."""

    __slots__ = ("name", "panel", "summary", "example", "details")

    def __init__(self, name: str, panel: str, summary: str, example: str, details: str = "") -> None:
        self.name, self.panel, self.summary, self.example, self.details = (
            name,
            panel,
            summary,
            example,
            details,
        )

    @property
    def help(self) -> str:
        """What ``tpuft NAME --help`` shows above the options."""
        parts = [self.summary, self.details, f"Example: {self.example}"]
        return "\n\n".join(part for part in parts if part)


VERBS: tuple[Verb, ...] = (
    Verb(
        "create",
        "Cluster",
        "Create the cluster (TPU VMs, or local workers) and its bucket.",
        "tpuft create --config tpuft.yaml",
        "On GCP a TPU VM, pod slice or queued resource (the Cloud TPU API), or with gcp.api: compute "
        "TPU7x and single-host v5p/v6e as Compute Engine instances (a managed instance group per multi-host "
        "slice); on the local pod one folder per worker. Safe to run twice.",
    ),
    Verb("status", "Cluster", "Show the cluster's state and its workers.", "tpuft status --json"),
    Verb(
        "delete",
        "Cluster",
        "Delete the cluster's workers. Runs in the bucket are kept.",
        "tpuft delete --yes",
    ),
    Verb(
        "gc",
        "Cluster",
        "Find preempted, failed or idle TPU capacity; --yes deletes it.",
        "tpuft gc --zone us-central2-b --idle 2h",
        "The capacity tpuft created that holds quota or bills for nothing. "
        "Looks in the cluster file's project and zone (and each --zone) at the nodes and queued "
        "resources labelled created-by=tpuft, nothing else: PREEMPTED or TERMINATED nodes, FAILED or "
        "SUSPENDED queued resources, and READY nodes with no live run in the cluster's bucket for longer "
        "than --idle. Shows each one's list price per hour (an estimate) and how long it has been so. --yes "
        "deletes them (a queued resource with force), each deletion reported; exit 1 when one failed.",
    ),
    Verb(
        "drill",
        "Cluster",
        "Cause maintenance or a preemption on one worker, as a drill.",
        "tpuft drill maintenance --worker 1",
        "maintenance: on GCP the TPU API's simulated maintenance event on that worker (its metadata "
        "server and the node announce a window); on the local pod a notice file in the worker's home, "
        "--notice seconds ahead. A run's supervisors and a --recover watcher then ask for a checkpoint and "
        "stop before the window; the watcher resumes the run after it. preempt: the TPU API has no "
        "preemption simulation, so on GCP the node is stopped (StopNode, the nearest real action; every "
        "worker of that node goes); on the local pod the worker's supervisor and trainer are killed. On GCP "
        "it asks first, as delete does (--yes where nobody can answer). Exit 2 when the cluster is not "
        "READY, has no such worker, or has no live run (nothing to drill): then nothing is done.",
    ),
    Verb(
        "exec",
        "Cluster",
        "Run a command on every worker (or some) in parallel.",
        "tpuft exec -- 'hostname; nproc'",
        "Each output line is prefixed with its worker's index. "
        "Each command sees TPUFT_WORKER_ID and TPUFT_NUM_WORKERS (on several slices also TPUFT_SLICE_ID "
        "and TPUFT_NUM_SLICES). --worker takes flat indices (0,2 or 1-3) or slice:host (1:0, 1:2-3, 1:* for "
        "a whole slice). When one fails the others are stopped, and tpuft exits with its exit code, as ssh "
        "would (the first to fail gives it).",
    ),
    Verb(
        "ssh",
        "Cluster",
        "Open a shell on one worker (SSH on GCP, its folder locally).",
        "tpuft ssh --worker 1",
    ),
    Verb(
        "doctor",
        "Cluster",
        "Check the workers for what would break a run; culprits named.",
        "tpuft doctor quickstart",
        "On each worker the launch plan uses, in parallel: the backend venv (same key, complete), the "
        "same tpuft, on TPU hosts libtpu importable and no stale TPU process or libtpu lockfile, the "
        "coordinator port free on worker 0, disk for the checkpoints the recipe keeps, the clock against "
        "this machine's. Only looks: nothing is changed. Exit 1 when a check fails (warnings do not), 2 for "
        "a usage or config error.",
    ),
    Verb(
        "setup",
        "Training",
        "Install the recipe's backend venv on every worker (cached).",
        "tpuft setup quickstart",
        "On every worker in parallel; the venv is cached, so the second time takes seconds.",
    ),
    Verb(
        "train",
        "Training",
        "Train the recipe on every worker, supervised; stream the logs.",
        "tpuft train quickstart --set train.steps=200",
        "Each worker's trainer runs under a supervisor that outlives this terminal. "
        "Ctrl-C (or a closed terminal, a dropped connection) detaches: the run goes on, and stops on "
        "every worker when one fails or hangs. Re-attach with tpuft attach, stop with tpuft stop; --detach "
        "returns at once, --stop-on-interrupt makes Ctrl-C stop the run. --recover (or recover: true in the "
        "cluster file) also recovers it from preemption: recreate the node, set up, resume from the last "
        "checkpoint.",
    ),
    Verb(
        "up",
        "Training",
        "Create, set up, train, summarize and export in one go.",
        "tpuft up quickstart",
        "Attached like train: Ctrl-C detaches and the run goes on (--stop-on-interrupt stops it instead); "
        "--recover recovers it from preemption.",
    ),
    Verb(
        "attach",
        "Training",
        "Re-attach to a run: its last lines, then live until it ends.",
        "tpuft attach --since 10m",
        "Ctrl-C (or closing the terminal) only detaches: the run goes on. Reconnects by itself when a "
        "connection drops.",
    ),
    Verb(
        "stop",
        "Training",
        "Stop a run on every worker; tpuft resume continues it later.",
        "tpuft stop quickstart-20261123 --checkpoint",
        "SIGTERM, then SIGKILL after 10 s. "
        "--checkpoint saves a checkpoint at the next step boundary first and stops right after it, so that "
        "tpuft "
        "resume continues from exactly that step (no step lost); it prints how long the checkpoint took.",
    ),
    Verb(
        "checkpoint",
        "Training",
        "Save a checkpoint of a running run now; return once complete.",
        "tpuft checkpoint quickstart-20261123 --timeout 600",
        "Every trainer saves at its next step boundary (on several hosts, at one step they all reach "
        "after the ask arrives) through its backend's normal save path; the command returns once the "
        "checkpoint is complete in run storage and prints the latency from the ask. Exit code 2: the run is "
        "not running; 1: a timeout (the workers that did not answer are named) or the trainers refused (the "
        "reason is said).",
    ),
    Verb(
        "resume",
        "Training",
        "Continue a stopped or failed run from its last checkpoint.",
        "tpuft resume quickstart-20261123",
        "Same run id, from its last complete checkpoint. "
        "Weights, optimizer, learning-rate schedule, data order and RNG continue exactly; metrics of "
        "the steps after that checkpoint are re-run and replaced. With --recover it also watches the run "
        "and recovers it from preemption; on a running run it takes over the watch (from any machine).",
    ),
    Verb(
        "predict",
        "Training",
        "Run a trained model on an input file, on the workers or --local.",
        "tpuft predict quickstart --input numbers.jsonl --output predictions.jsonl",
        "SOURCE: a run id or prefix (its best checkpoint under keep_best, else its last), a "
        "checkpoint folder or a Hugging Face model folder. IN: JSON lines, CSV or TSV (local or gs://), "
        "read with the recipe's fields, prefix and templates (or --field), and checked line by line before "
        "anything starts. OUT: JSON lines in input order (id, input, prediction; target and correct when "
        "the input has targets, and then the scores are printed). Written in shards that a killed predict "
        "resumes from (--resume); an existing OUT needs --resume or --overwrite. Like train it runs under "
        "the workers' supervisors: Ctrl-C detaches, tpuft attach / stop / logs work on its run id.",
    ),
    Verb(
        "monitor",
        "Results",
        "Watch a run: workers, step, loss, throughput, evals, ETA, logs.",
        "tpuft monitor --plot curves.png",
        "The node's state, each worker's health, step, loss, lr, throughput, eval metrics, the ETA and "
        "the log tails. "
        "Refreshes every few seconds until the run ends (Ctrl-C leaves, the run goes on). "
        "Reads metrics.jsonl, or the TensorBoard events of a backend that writes only those (T5X).",
    ),
    Verb(
        "runs",
        "Results",
        "List the runs in the cluster's bucket: status, steps, best eval.",
        "tpuft runs --json",
        "From the cluster's bucket (or local folder), each run with its recipe, backend, status, steps, "
        "attempts, best eval, test score, goodput, cost and start. A narrow terminal leaves the least "
        "needed columns out (named under the table, never the run id); --json has them all.",
    ),
    Verb(
        "goodput",
        "Results",
        "Where the runs' time went: goodput and badput by cause.",
        "tpuft goodput --json",
        "Goodput is the time in kept training steps over the wall time; per run and in total. "
        "Read from the events tpuft records in each run dir, with no change to the training "
        "code: queued-resource wait, provisioning, setup, launch, start-up and first compile, step windows "
        "(data waits apart on PyTorch/XLA), checkpoint saves and restores, evaluation, test, export, steps "
        "lost to a disruption (redone after the checkpoint the next attempt resumed from), the recovery "
        "back-off and idle gaps; what no event covers is other. The causes add up to the wall time. Also in "
        "the train summary, runs, monitor and monitor --plot.",
    ),
    Verb(
        "logs",
        "Results",
        "Print a run's worker logs; -f follows them live while it trains.",
        "tpuft logs -f --worker 0",
    ),
    Verb(
        "pull",
        "Results",
        "Copy a run home: metrics, logs, checkpoints, the HF export.",
        "tpuft pull latest ./my-run --checkpoints best",
        "The recipe, metrics, logs, TensorBoard events, the checkpoints --checkpoints chooses and the HF "
        "export. "
        "Parallel, verified against the bucket's checksums, resumable: files already there and intact "
        "are skipped, so running it again after an interruption fetches only the rest.",
    ),
    Verb(
        "tensorboard",
        "Results",
        "Serve a run's TensorBoard events until Ctrl-C.",
        "tpuft tensorboard --port 6007",
        "From the run's folder, or mirrored from the bucket every 30 s.",
    ),
    Verb(
        "convert",
        "Results",
        "Turn a training checkpoint into a Hugging Face model dir.",
        "tpuft convert gs://my-bucket/t5x/flan_t5_base ./flan-t5-base --verify",
        "The dir holds config.json, the safetensors and the tokenizer. "
        "Reads T5X checkpoints (legacy and Orbax) without t5x, PyTorch/XLA checkpoints and transformers "
        "4.x Keras/TF weights; streams one tensor at a time, and writes OUT_DIR only when it is complete.",
    ),
    Verb("recipes", "Recipes", "List, show, copy and validate recipes.", "tpuft recipes ls"),
)

RECIPE_VERBS: tuple[Verb, ...] = (
    Verb("ls", "Recipes", "List the shipped recipes.", "tpuft recipes ls"),
    Verb(
        "show",
        "Recipes",
        "Print a recipe (a file or a shipped name); --summary: its model's parameters and the memory per "
        "chip.",
        "tpuft recipes show --summary my_recipe.yaml --accelerator v4-64",
        "--summary works offline: parameters per module (total and trainable, after model.freeze and prompt "
        "tuning), then weights, gradients, optimizer state and an activation estimate per chip for the "
        "recipe's "
        "optimizer, precision and sharding, against the accelerator's HBM (the cluster's, or --accelerator).",
    ),
    Verb(
        "backends",
        "Recipes",
        "The capability matrix: which shared recipe keys and eval metrics each backend "
        "implements, and why an engine cannot.",
        "tpuft recipes backends --json",
        "A key a backend refuses is an error at its line in any recipe that sets it, with the same reason.",
    ),
    Verb(
        "cp",
        "Recipes",
        "Copy a shipped recipe to edit it (its data paths keep pointing at the shipped data).",
        "tpuft recipes cp quickstart my_recipe.yaml",
    ),
    Verb(
        "validate",
        "Recipes",
        "Check a recipe (and the cluster file) without running anything; exit 2 with every problem listed.",
        "tpuft recipes validate my_recipe.yaml --set train.steps=10",
        "Reads the recipe's data files through (every line, as the workers will) and checks the "
        "batch against the cluster's workers; creates and runs nothing. Exit 3: the recipe is valid but "
        "data files it names are not here (one line each, with the command that fetches it); "
        "--no-data-check skips the data. A Hugging Face dataset or a corpus is read by the workers only: "
        "said so, not counted. --json: the same exit codes; a pass as JSON (cluster, workers, each data "
        "source and its count), a refusal as every verb's JSON error with its problems, one line each.",
    ),
)

PANELS = ("Cluster", "Training", "Results", "Recipes")


def verb(name: str, table: tuple[Verb, ...] = VERBS) -> Verb:
    return next(v for v in table if v.name == name)


def top_level_help(color: bool, width: int | None = None) -> str:
    """``tpuft --help``, every line within ``width`` (the terminal's: ``$COLUMNS``, else the terminal, else
    80): a line that would be longer wraps under its own text, as Typer's help does."""
    import textwrap

    width = max(40, width or terminal_width())
    bold = (lambda s: f"\033[1m{s}\033[0m") if color else (lambda s: s)

    def item(label: str, text: str, indent: int) -> list[str]:
        lines = textwrap.wrap(text, width - indent, break_on_hyphens=False) or [""]
        return [label.ljust(indent) + lines[0], *(" " * indent + line for line in lines[1:])]

    name_width = max(len(v.name) for v in VERBS)
    lines = [f"{bold('Usage:')} tpuft [OPTIONS] COMMAND [ARGS]...", ""]
    lines += [*item("", SUMMARY, 1), "", *item("", QUICKSTART, 1), "", bold("Options:")]
    for label, text in (
        ("  -V, --version", "Print the version and exit."),
        ("  --install-completion", "Install completion for the current shell."),
        (
            "  --show-completion",
            "Show completion for the current shell, to copy it or customize the installation.",
        ),
        ("  -h, --help", "Show this message and exit."),
    ):
        lines += item(label, text, 24)
    lines.append("")
    for panel in PANELS:
        lines.append(bold(f"{panel}:"))
        for v in VERBS:
            if v.panel == panel:
                lines += item(f"  {v.name}", v.summary, name_width + 4)
        lines.append("")
    lines += item("", "Run 'tpuft COMMAND --help' for a command's options and an example.", 0)
    return "\n".join(lines)


def terminal_width() -> int:
    """The width Rich and Click use too: ``$COLUMNS`` when set, else the terminal's, else 80 (a pipe)."""
    import os
    import sys

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 80


# How a command ends when the reader of its output goes away (``tpuft runs | head -1``). Here because both
# entry points (the launcher, stdlib only, and the Typer app) need it and neither may import the other.

PIPE_CLOSED_EXIT = (
    141  # 128 + SIGPIPE: what `git log | head` reports, so `set -o pipefail` scripts see the same
)
_pipe_closed: list[bool] = []


def silence_stdout() -> None:
    """Point stdout's descriptor at /dev/null: the interpreter's last flush of what is still buffered would
    raise BrokenPipeError again (and print a traceback from inside its shutdown) otherwise."""
    import os
    import sys

    _pipe_closed.append(True)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (
        OSError,
        ValueError,
    ):  # stdout already closed or not a real file: nothing left to flush into a pipe
        pass


def exit_with(command: Callable[[], int]) -> NoReturn:
    """Run an entry point's ``command`` and exit with its code; a reader that went away (``tpuft runs | head
    -1``) ends it quietly with :data:`PIPE_CLOSED_EXIT`, as ``git log | head`` does. Both entry points (the
    fast launcher and the Typer app) end here."""
    import sys

    try:
        code = command()
        # inside the try: a pipe closed early fails here, not in the interpreter's last flush
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        code = PIPE_CLOSED_EXIT
    sys.exit(code)


def stdout_closed() -> bool:
    """Whether the reader went away during this command: its workers were stopped for that, not by the
    user."""
    return bool(_pipe_closed)


def closed_pipe_in_thread() -> None:
    """A reader thread (``exec``'s worker lines) found the pipe closed: silence stdout and interrupt the main
    thread, which stops the workers as Ctrl-C does; the entry point then exits quietly with
    :data:`PIPE_CLOSED_EXIT`."""
    import _thread

    if not _pipe_closed:
        silence_stdout()
        _thread.interrupt_main()
