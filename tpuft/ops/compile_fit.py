"""Does the recipe fit its slice? ``recipes show --summary --compile`` and ``train``/``up --check-fit``.

The paper estimate (:mod:`tpuft.model.summary`) counts parameters and optimizer slots; what decides a step's
fit is also XLA's temporaries, which only a compile knows. A backend that can compile its real train step for
a TPU slice on this machine's CPU says how (:class:`tpuft.backends.base.CompilePlan`, through the registry);
here the plan's venv and overlay are built (cached, only when a compile is asked), the program runs, and its
per-device bytes and flops become the report: each part against the device's HBM from the catalogue, a
verdict, what to change when it does not fit, and flops turned into a lower bound on step time and on the
run's cost. A backend that cannot compile keeps the paper estimate, labelled as one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tpuft
from tpuft.core.accelerators import GENERATIONS, AcceleratorType, lookup
from tpuft.core.errors import TpuftError, UsageError
from tpuft.core.paths import tpuft_home, venv_cache
from tpuft.core.waiting import waiting
from tpuft.fleet.base import last_json_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuft.backends.base import CompilePlan, EnvSpec
    from tpuft.config import ClusterConfig, Loaded, RecipeConfig
    from tpuft.core.config_types import KeyPath

GIB = 2**30
HEADROOM = 0.93
"""A suggestion must leave 7% of HBM free, and a step with less to spare is called tight: the TPU runtime
keeps some HBM for itself (XLA's TPU compiler allowed a v2 core 7.48 of its 8 GiB), and a suggestion is
extrapolated from this compile, not compiled."""


class DoesNotFit(TpuftError):
    """``--check-fit``: the step needs more HBM than the slice has (exit 2: a setting to change, before
    anything is created)."""

    exit_code = 2


@dataclass(frozen=True)
class CompiledStep:
    """What XLA's TPU compiler says one device of the slice needs for one train step."""

    argument_bytes: int
    """Parameters, optimizer state and the batch: everything the step takes in."""
    output_bytes: int
    alias_bytes: int
    """Outputs written in place of donated arguments (the new train state over the old): counted once."""
    temp_bytes: int
    generated_code_bytes: int
    flops_per_device: float
    devices: int
    mesh: dict[str, int]
    compile_s: float
    params: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def new_output_bytes(self) -> int:
        return max(0, self.output_bytes - self.alias_bytes)

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.new_output_bytes + self.temp_bytes + self.generated_code_bytes

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompiledStep:
        known = {
            "argument_bytes",
            "output_bytes",
            "alias_bytes",
            "temp_bytes",
            "generated_code_bytes",
            "flops_per_device",
            "devices",
            "mesh",
            "compile_s",
            "params",
        }
        return cls(
            **{k: data[k] for k in known if k in data},
            extra={k: v for k, v in data.items() if k not in known},
        )


@dataclass
class FitReport:
    recipe: str
    backend: str
    accelerator: str
    devices: int
    device_word: str
    hbm_bytes: int
    """Per device."""
    steps: int
    step: CompiledStep | None = None
    estimate: str | None = None
    """Set when there was no compile: ``estimate (no compile for <backend>: <reason>)``."""
    estimate_bytes: int | None = None
    suggestions: list[str] = field(default_factory=list)
    step_time_s: float | None = None
    """Lower bound: the step's flops at the chip's peak bf16 FLOP/s."""
    cost_usd: float | None = None
    """Lower bound: ``train.steps`` x step time x the slice's list price."""
    decisive: bool = False
    """Not compiled: the paper estimate alone said it does not fit (:mod:`tpuft.ops.compile_triage`)."""

    @property
    def total_bytes(self) -> int:
        return self.step.total_bytes if self.step is not None else int(self.estimate_bytes or 0)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def margin_bytes(self) -> int:
        return self.hbm_bytes - self.total_bytes

    def verdict(self) -> str:
        """``fits with 27.1 GiB to spare`` or ``does not fit: needs 45.2 of 32.0 GiB per chip, try ...``."""
        source = "" if self.step is not None else f"; {self.estimate}"
        if self.fits:
            tight = (
                " (tight: the TPU runtime keeps some HBM for itself; XLA gave a v2 core 7.48 of its 8 GiB)"
                if self.margin_bytes < self.hbm_bytes * (1 - HEADROOM)
                else ""
            )
            return f"fits with {gib(self.margin_bytes)} to spare per {self.device_word}{source}{tight}"
        tries = f", try {'; or '.join(self.suggestions)}" if self.suggestions else ""
        return (
            f"does not fit: needs {gib(self.total_bytes)} of {gib(self.hbm_bytes)} per {self.device_word} on "
            f"{self.accelerator}{source}{tries}"
        )

    def rows(self) -> list[tuple[str, int, str]]:
        """(what, bytes per device, how) for the table."""
        step = self.step
        if step is None:
            return []
        return [
            ("arguments", step.argument_bytes, "parameters, optimizer state and the batch"),
            (
                "temporaries",
                step.temp_bytes,
                "activations kept for the backward pass, gradients, XLA's buffers",
            ),
            (
                "outputs",
                step.new_output_bytes,
                f"{gib(step.output_bytes)} of which {gib(step.alias_bytes)} written "
                "over the donated train state",
            ),
            ("generated code", step.generated_code_bytes, "the compiled program"),
        ]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "recipe": self.recipe,
            "backend": self.backend,
            "accelerator": self.accelerator,
            "devices": self.devices,
            "hbm_bytes_per_device": self.hbm_bytes,
            "total_bytes_per_device": self.total_bytes,
            "fits": self.fits,
            "margin_bytes": self.margin_bytes,
            "verdict": self.verdict(),
            "suggestions": self.suggestions,
            "step_time_lower_bound_s": self.step_time_s,
            "cost_lower_bound_usd": self.cost_usd,
            "steps": self.steps,
            "source": "compile" if self.step is not None else self.estimate,
            "decisive_estimate": self.decisive,
        }
        if self.step is not None:
            data["compiled"] = {**asdict(self.step), "total_bytes": self.step.total_bytes}
        return data


def gib(count: float) -> str:
    return f"{count / GIB:.1f} GiB" if abs(count) >= GIB / 10 else f"{count / 2**20:.1f} MiB"


def report(
    recipe: RecipeConfig, accelerator: AcceleratorType, step: CompiledStep, slices: int = 1
) -> FitReport:
    """The compile's numbers against the catalogue: the verdict's parts, what to change, the lower bounds.
    With ``slices`` (Multislice) the devices and the price are every slice's; the bytes per device are one
    device's."""
    generation = accelerator.generation
    found = FitReport(
        recipe=recipe.name,
        backend=recipe.backend.kind,
        accelerator=accelerator.name if slices == 1 else f"{slices} x {accelerator.name}",
        devices=accelerator.devices * slices,
        device_word="chip" if generation.devices_per_chip == 1 else "core",
        hbm_bytes=generation.hbm_bytes_per_device,
        steps=recipe.train.steps,
        step=step,
    )
    if step.flops_per_device > 0:
        found.step_time_s = step.flops_per_device / generation.peak_flops_per_device
        price = accelerator.price_per_hour
        if price is not None:
            found.cost_usd = round(recipe.train.steps * found.step_time_s * price * slices / 3600, 4)
    if not found.fits:
        found.suggestions = suggestions(recipe, accelerator, step, slices)
    return found


def suggestions(
    recipe: RecipeConfig, accelerator: AcceleratorType, step: CompiledStep, slices: int = 1
) -> list[str]:
    """Concrete settings that would fit, extrapolated from this compile (recompile with one to be sure):

    * more model parallelism: the train state is split ``num_partitions`` ways, so its bytes (arguments and
      the outputs written anew) shrink by old/new; the smallest power of two that divides the devices and
      fits;
    * more microbatches: temporaries (activations mostly) shrink by old/new; the smallest that divides each
      replica's batch and fits;
    * the same number of chips of a generation with more HBM per chip.

    Model parallelism stays within one slice (``devices``); the replicas are every slice's."""
    devices = accelerator.devices
    budget = accelerator.generation.hbm_bytes_per_device * HEADROOM
    backend, batch = recipe.backend, recipe.train.batch_size
    partitions = int(step.mesh.get("model", getattr(backend, "num_partitions", 1) or 1))
    microbatches = int(getattr(backend, "num_microbatches", None) or 1)
    state = step.argument_bytes + step.new_output_bytes
    found: list[str] = []
    candidate = partitions * 2
    while candidate <= devices:
        replicas = devices // candidate * slices
        if devices % candidate == 0 and batch % replicas == 0:
            need = state * partitions / candidate + step.temp_bytes + step.generated_code_bytes
            if need <= budget:
                found.append(f"backend.num_partitions: {candidate} (about {gib(need)} per device)")
                break
        candidate *= 2
    per_replica = batch // max(1, devices // partitions * slices)
    candidate = microbatches * 2
    while candidate <= per_replica:
        if per_replica % candidate == 0:
            need = state + step.temp_bytes * microbatches / candidate + step.generated_code_bytes
            if need <= budget:
                found.append(f"backend.num_microbatches: {candidate} (about {gib(need)} per device)")
                break
        candidate *= 2
    for generation in sorted(GENERATIONS.values(), key=lambda g: g.hbm_bytes_per_device):
        if generation.hbm_bytes_per_device <= accelerator.generation.hbm_bytes_per_device:
            continue
        size = accelerator.chips * (2 if generation.size_counts_cores else 1)
        bigger = step.total_bytes * accelerator.generation.devices_per_chip / generation.devices_per_chip
        if size in generation.sizes and bigger <= generation.hbm_bytes_per_device * HEADROOM:
            found.append(f"a {generation.name}-{size} ({generation.hbm_gib_per_chip} GiB per chip)")
            break
    return found


def estimate_report(
    recipe: RecipeConfig, accelerator: AcceleratorType, total_bytes: int, reason: str
) -> FitReport:
    """For a backend without an offline compile: the paper estimate's total, labelled."""
    generation = accelerator.generation
    return FitReport(
        recipe=recipe.name,
        backend=recipe.backend.kind,
        accelerator=accelerator.name,
        devices=accelerator.devices,
        device_word="chip" if generation.devices_per_chip == 1 else "core",
        hbm_bytes=generation.hbm_bytes_per_device,
        steps=recipe.train.steps,
        estimate=f"estimate (no compile for {recipe.backend.kind}: {reason})",
        estimate_bytes=total_bytes,
    )


# -- running the compile -----------------------------------------------------------------------------------
def fit_report(
    recipe: RecipeConfig,
    accelerator: AcceleratorType,
    *,
    python: str = "python3",
    recipe_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    slices: int = 1,
    force: bool = False,
    notice: Callable[[str], None] | None = None,
    locate: Callable[[KeyPath, str], str] | None = None,
    source: str | None = None,
) -> FitReport:
    """Compile the recipe's step for ``accelerator`` (``slices`` of it: Multislice), or, for a backend that
    cannot, the paper estimate. Before a compile (:mod:`tpuft.ops.compile_triage`): a paper estimate that
    is decisive answers at once, without a compile, unless ``force``; else ``notice`` is told how long and
    how much memory the compile is expected to take, and what can fail fast (the sources, pip's index) is
    checked before anything is installed (:mod:`tpuft.ops.compile_preflight`; ``locate`` places a problem
    at its recipe key)."""
    from tpuft.backends.registry import compile_planner, no_compile_reason
    from tpuft.ops import compile_triage

    planner = compile_planner(recipe.backend.kind)
    if planner is None:
        from tpuft.model.summary import summarize

        paper = summarize(recipe, accelerator, recipe_dir=recipe_dir)
        return estimate_report(recipe, accelerator, paper.total_bytes, no_compile_reason(recipe.backend.kind))
    summary = compile_triage.paper_summary(recipe, accelerator, slices, recipe_dir)
    if summary is not None and not force and compile_triage.decisive(summary):
        return FitReport(
            recipe=recipe.name,
            backend=recipe.backend.kind,
            accelerator=summary.accelerator,
            devices=summary.devices,
            device_word=summary.device_word,
            hbm_bytes=summary.hbm_bytes,
            steps=recipe.train.steps,
            estimate=compile_triage.decisive_label(summary),
            estimate_bytes=summary.total_bytes,
            suggestions=compile_triage.paper_suggestions(recipe, accelerator, slices, recipe_dir),
            decisive=True,
        )
    plan = planner.compile_plan(recipe, accelerator, python, slices=slices)
    if notice is not None and summary is not None:
        notice(compile_triage.forecast(summary.total_params).line(plan.what))
    return report(recipe, accelerator, run_compile(plan, progress, locate=locate, source=source), slices)


def require_fit(
    config: ClusterConfig,
    recipe: Loaded[RecipeConfig],
    progress: Callable[[str], None] | None = None,
    notice: Callable[[str], None] | None = None,
) -> FitReport:
    """``--check-fit``: compile for the cluster's accelerator before anything is created or launched; a step
    that does not fit stops here (exit 2) with its bytes and what to change. Its waits are shown on stderr."""
    accelerator = lookup(config.accelerator)
    found = fit_report(
        recipe.value,
        accelerator,
        python=config.local.python,
        recipe_dir=Path(recipe.source).resolve().parent,
        progress=progress,
        slices=config.slices,
        notice=notice,
        locate=recipe.problem,
        source=recipe.source,
    )
    if not found.fits:
        parts = ", ".join(f"{what} {gib(size)}" for what, size, _ in found.rows())
        raise DoesNotFit(
            f"{recipe.source}: {found.verdict()}" + (f" ({parts})" if parts else ""),
            hint=f"see it whole: tpuft recipes show --summary {recipe.source} --compile "
            f"--accelerator {accelerator.name}"
            + (
                " (--force-compile: compile although the paper estimate is decisive)"
                if found.step is None
                else ""
            ),
        )
    return found


def run_compile(
    plan: CompilePlan,
    progress: Callable[[str], None] | None = None,
    *,
    locate: Callable[[KeyPath, str], str] | None = None,
    source: str | None = None,
) -> CompiledStep:
    from tpuft.host.bootstrap import MARKER, is_ready
    from tpuft.ops.compile_preflight import check_sources

    check_sources(
        plan,
        venv_missing=not is_ready(venv_cache() / plan.env.key),
        overlay_missing=not (venv_cache() / plan.overlay_key / MARKER).is_file(),
        locate=locate,
        source=source,
        progress=progress,
    )
    python = ensure_env(plan.env, progress, _install_hint(plan))
    overlay = ensure_overlay(plan, python, progress)
    package_root = str(Path(tpuft.__file__).resolve().parent.parent)
    env = {**os.environ, **plan.env_vars, "PYTHONPATH": os.pathsep.join([package_root, str(overlay)])}
    with tempfile.TemporaryDirectory(prefix="tpuft-compile-") as folder:
        request = Path(folder) / "request.json"
        request.write_text(json.dumps(plan.request), encoding="utf-8")
        errors = Path(folder) / "stderr.log"
        with waiting(f"XLA's TPU compiler: {plan.what}, on this machine's CPU", progress=progress) as wait:
            if progress is not None:
                wait.update("compiling")
            with errors.open("wb") as err:
                done = subprocess.run(
                    [python, "-m", plan.module, str(request)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    check=False,
                )
        answer = last_json_object(done.stdout.decode("utf-8", "replace").splitlines())
        if answer is not None and "error" in answer:
            raise UsageError(f"the compile refused the recipe's settings: {answer['error']}")
        if done.returncode != 0 or answer is None:
            raise _compile_failure(
                plan, done.returncode, errors.read_text(encoding="utf-8", errors="replace")
            )
    return CompiledStep.from_json(answer)


def ensure_env(spec: EnvSpec, progress: Callable[[str], None] | None, hint: str | None = None) -> str:
    """The plan's venv, through the same bootstrap and cache as ``tpuft setup`` (in a child process: the
    bootstrap prints, and stdout may be carrying ``--json``)."""
    from tpuft.host.bootstrap import is_ready

    venv = venv_cache() / spec.key
    if not is_ready(venv):
        argv = [
            sys.executable,
            "-m",
            "tpuft.host.bootstrap",
            "--cache",
            str(venv_cache()),
            "--spec",
            json.dumps(spec.payload()),
        ]
        _run_with_progress(argv, f"the {spec.kind} venv to be built for the compile: {venv}", progress, hint)
    return str(venv / "bin" / "python")


def ensure_overlay(plan: CompilePlan, python: str, progress: Callable[[str], None] | None) -> Path:
    """The overlay folder (libtpu), installed once per machine under a lock; a half-written one is
    replaced."""
    import fcntl

    from tpuft.host.bootstrap import MARKER

    cache = venv_cache()
    folder = cache / plan.overlay_key
    marker = folder / MARKER
    if marker.is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{plan.overlay_key}.lock").open("a+") as lock:
        with waiting(f"the lock on {folder} (another tpuft process installs it)", progress=progress):
            fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file():
            return folder
        partial = cache / f".{plan.overlay_key}.{os.getpid()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        argv = [
            python,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--no-deps",
            "--target",
            str(partial),
            *plan.overlay,
        ]
        _run_with_progress(argv, f"{' '.join(plan.overlay)} to be installed (once) into {folder}", progress)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        marker.write_text(
            json.dumps({"requirements": list(plan.overlay), "built_at": time.time()}), encoding="utf-8"
        )
    return folder


def _run_with_progress(
    argv: list[str], what: str, progress: Callable[[str], None] | None, hint: str | None = None
) -> None:
    """Run an install, its output as the wait's detail; a failure is its last lines (never a bare
    traceback) and ``hint``: the setting that chooses what was installed."""
    lines: list[str] = []
    with waiting(what, progress=progress) as wait:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                lines.append(line)
                wait.update(line[:120])
        code = proc.wait()
    if code != 0:
        raise TpuftError(
            f"{what.split(' to be ', 1)[0]} could not be installed (exit code {code}): "
            f"{' '.join(argv[:6])} ...; its last lines:\n{_tail(chr(10).join(lines))}",
            hint=hint,
        )


def _install_hint(plan: CompilePlan) -> str | None:
    if not plan.sources_key:
        return None
    return f"if it failed installing the sources: {plan.sources_help}"


def _compile_failure(plan: CompilePlan, code: int, stderr: str) -> TpuftError:
    """One line a user can act on, not the compiler's traceback: the exception the program died of (XLA's own
    words), and the whole of its stderr kept in a log file for a bug report."""
    log = tpuft_home() / "logs" / f"compile-{time.strftime('%Y%m%d-%H%M%S')}.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(stderr, encoding="utf-8")
        kept = str(log)
    except OSError:
        kept = ""
    raised = [line.strip() for line in stderr.splitlines() if _RAISED.match(line.strip())]
    if raised and "Invalid TPU program" in raised[-1]:
        return TpuftError(
            f"XLA's TPU compiler refused {plan.what}: {raised[-1].split(': ', 1)[-1]}",
            hint="libtpu says this of a step with one buffer larger than a device's HBM (e.g. attention "
            "scores of long sequences), among other causes: try a shorter data.max_source_length, a "
            "smaller batch or more backend.num_microbatches"
            + (f"; the compiler's whole output: {kept}" if kept else ""),
        )
    said = raised[-1] if raised else _tail(stderr)
    return TpuftError(
        f"the compile failed (exit code {code}): {plan.what}: {said}",
        hint=f"The compiler's whole output: {kept}" if kept else None,
    )


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exhausted)\b.*: ")
"""The line a Python traceback ends with (``jax.errors.JaxRuntimeError: INVALID_ARGUMENT: ...``)."""


def _tail(text: str, lines: int = 15) -> str:
    kept = [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith(("W0", "I0", "WARNING:absl"))
    ]
    return "\n".join(kept[-lines:])
