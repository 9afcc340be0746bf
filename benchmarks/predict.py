"""``tpuft predict``'s worker side, measured: throughput of the hf engine (``--local``) against a plain
``transformers`` loop, and the worker's peak memory on a big input.

* ``throughput``: the quickstart model's export (``--export``; default: the newest
  ``runs/quickstart-*/export/hf`` under ``$TPUFT_HOME`` or ``~/.tpuft``; ``tpuft up quickstart`` makes one) on
  the 500 held-out numbers, in the PyTorch/XLA venv, on this machine's CPU, with the same batch size and
  thread count for every row, the model loaded once beforehand (examples/s of the prediction alone; each row
  is the best of ``--repeat`` passes, the rows' passes interleaved):
  - ``tpuft predict --local``: the shard loop (``worker/predict/loop.py``: parts sorted by length, longest
    first) with the hf engine (``worker/predict/hf.py``: batches padded to their longest input,
    ``inference_mode``);
  - ``plain loop``: what a user writes: the file in its order, ``tokenizer(batch, padding=True)`` and
    ``model.generate(max_new_tokens=8)`` under ``no_grad``;
  - ``plain loop, max_length padding``: the same with ``padding="max_length"`` to ``data.max_source_length``
    (the static shapes of training), as copied from a training script.
  The whole command (``python -m tpuft.worker.predict.main --local``: imports and model load included) is
  timed too, and its exact match is printed beside the training run's last ``eval_exact_match`` when the run
  dir has one.
* ``rss``: the peak RSS of one worker process (``python -m tpuft.worker.predict.main``'s loop, reader, part
  writer and the join; an echo engine stands in for the model, whose memory does not depend on the input's
  size) predicting a 10,000-line and a 1,000,000-line JSON-lines input generated in a temp folder.

    python benchmarks/predict.py throughput [--export DIR] [--batch-size 32] [--repeat 3]
    python benchmarks/predict.py rss [--lines 10000 1000000]
    python benchmarks/predict.py join-rss [--lines 10000 1000000]   # the controller's join of 2 processes'
    shards python benchmarks/predict.py scaling [--run RUN_DIR] [--workers 1 2] [--lines 10000]   # 1 vs 2
    local workers
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EVAL = REPO / "tpuft" / "recipes" / "data" / "numbers" / "eval.jsonl"

MEASURE = r"""
import json, sys, time
from pathlib import Path
import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration
from tpuft.config import recipe_from_text
from tpuft.worker.predict import loop as predict_loop
from tpuft.worker.predict.hf import HfEngine
from tpuft.run.predict_job import PredictJob

cfg = json.loads(sys.argv[1])
recipe_text = Path(cfg["recipe"]).read_text()
recipe = recipe_from_text(recipe_text, cfg["recipe"], check_files=False)
torch.set_num_threads(cfg["threads"])
rows = {}

job = PredictJob(input=cfg["input"], shards=cfg["tmp"] + "/shards", output=None, backend="hf", model=cfg["export"],
                 recipe=recipe_text, batch_size=cfg["batch_size"], settings={"threads": cfg["threads"]})
engine = HfEngine(Path(cfg["export"]), recipe, job)

def ours():
    import shutil
    shutil.rmtree(job.shards, ignore_errors=True)
    predict_loop.run(job, engine, recipe=recipe, say=lambda _: None)

tokenizer = AutoTokenizer.from_pretrained(cfg["export"])
model = T5ForConditionalGeneration.from_pretrained(cfg["export"]).eval()
sources = [json.loads(line)[recipe.data.source_field] for line in open(cfg["input"]) if line.strip()]
size = cfg["batch_size"]

def plain(**padding):
    out = []
    with torch.no_grad():
        for start in range(0, len(sources), size):
            enc = tokenizer(sources[start:start + size], return_tensors="pt", truncation=True,
                            max_length=recipe.data.max_source_length, **padding)
            out += tokenizer.batch_decode(model.generate(**enc, max_new_tokens=recipe.data.max_target_length),
                                          skip_special_tokens=True)
    return out

ways = {"tpuft predict --local, 1 process": ours, "plain loop": lambda: plain(padding=True),
        "plain loop, max_length padding": lambda: plain(padding="max_length")}
for _ in range(cfg["repeat"]):  # interleaved: a machine whose load changes meanwhile weighs on every row alike
    for name, way in ways.items():
        started = time.perf_counter()
        way()
        rows[name] = min(rows.get(name, float("inf")), time.perf_counter() - started)
print(json.dumps({"examples": len(sources), "seconds": rows}))
"""  # noqa: E501 (a script run in another interpreter)


PARALLEL = r"""
import json, sys, time
from pathlib import Path
from tpuft.config import recipe_from_text
from tpuft.worker.predict import loop as predict_loop
from tpuft.worker.predict.hf import HfEngine
from tpuft.run.predict_job import PredictJob

cfg, process = json.loads(sys.argv[1]), int(sys.argv[2])
text = Path(cfg["recipe"]).read_text()
recipe = recipe_from_text(text, cfg["recipe"], check_files=False)
tmp, times, engine = Path(cfg["tmp"]), [], None
for r in range(cfg["repeat"]):
    job = PredictJob(input=cfg["input"], shards=f"{tmp}/parallel-{r}", output=None, backend="hf", model=cfg["export"],
                     recipe=text, batch_size=cfg["batch_size"], settings={"threads": 1})
    engine = engine or HfEngine(Path(cfg["export"]), recipe, job)  # loaded once, as the other rows' models
    (tmp / f"ready-{r}-{process}").touch()
    while not (tmp / f"go-{r}").exists():  # every process starts its share at once
        time.sleep(0.002)
    started = time.perf_counter()
    predict_loop.run(job, engine, process=process, processes=cfg["processes"], recipe=recipe, say=lambda _: None)
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""  # noqa: E501 (a script run in another interpreter)


def parallel_seconds(python: str, env: dict[str, str], cfg: dict, processes: int) -> float:
    """``--local --processes N``'s prediction time: N engine processes of one torch thread each, every one its
    share of the shard (the command's own split), started together once their models are loaded; a pass lasts
    until its slowest process is done; the best of ``repeat`` passes."""
    tmp = Path(cfg["tmp"])
    cfg = {**cfg, "processes": processes}
    children = [
        subprocess.Popen(
            [python, "-c", PARALLEL, json.dumps(cfg), str(p)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for p in range(processes)
    ]
    for r in range(cfg["repeat"]):
        while not all((tmp / f"ready-{r}-{p}").exists() for p in range(processes)):
            if any(child.poll() not in (None, 0) for child in children):
                raise SystemExit(next(c.stderr.read() for c in children if c.poll())[-3000:])  # type: ignore[union-attr]
            time.sleep(0.01)
        (tmp / f"go-{r}").touch()
    passes = []
    for child in children:
        out, err = child.communicate()
        if child.returncode:
            raise SystemExit(err[-3000:])
        passes.append(json.loads(out.strip().splitlines()[-1]))
    return min(max(times) for times in zip(*passes))


def torch_python() -> str:
    sys.path.insert(0, str(REPO))
    from tests.venvs import torch_python as build

    return build()


def find_export() -> Path:
    homes = [Path(os.environ["TPUFT_HOME"])] if os.environ.get("TPUFT_HOME") else []
    homes.append(Path("~/.tpuft").expanduser())
    found = [p for home in homes if home.is_dir() for p in home.glob("**/runs/quickstart-*/export/hf")]
    if not found:
        raise SystemExit("no quickstart export found: run `tpuft up quickstart`, or give --export DIR")
    return max(found, key=lambda p: p.stat().st_mtime)


def last_eval_exact_match(run_dir: Path) -> float | None:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return None
    found = [
        json.loads(line).get("eval_exact_match") for line in metrics.read_text().splitlines() if line.strip()
    ]
    found = [value for value in found if value is not None]
    return found[-1] if found else None


def throughput(export: Path, batch_size: int, repeat: int, threads: int) -> None:
    python = torch_python()
    run_dir = export.parent.parent
    recipe = run_dir / "recipe.yaml"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "export": str(export),
            "recipe": str(recipe),
            "input": str(EVAL),
            "tmp": tmp,
            "batch_size": batch_size,
            "repeat": repeat,
            "threads": threads,
        }
        done = subprocess.run(
            [python, "-c", MEASURE, json.dumps(cfg)], capture_output=True, text=True, env=env, cwd=REPO
        )
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        cpus = len(os.sched_getaffinity(0))
        if (
            cpus > 1
        ):  # the command's default on this machine: a process per CPU (tpuft.ops.predict.local_processes)
            measured["seconds"][f"tpuft predict --local, {cpus} processes"] = parallel_seconds(
                python, env, cfg, cpus
            )
        from tpuft.run.predict_job import PredictJob

        job = PredictJob(
            input=str(EVAL),
            shards=f"{tmp}/cli-shards",
            output=f"{tmp}/out.jsonl",
            backend="hf",
            model=str(export),
            recipe=recipe.read_text(),
            batch_size=batch_size,
            settings={"threads": threads},
        )
        (Path(tmp) / "job.json").write_text(job.to_json())
        started = time.perf_counter()
        cli = subprocess.run(
            [python, "-m", "tpuft.worker.predict.main", "--job", f"{tmp}/job.json", "--local"],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        wall = time.perf_counter() - started
        if cli.returncode:
            raise SystemExit(cli.stdout[-2000:] + cli.stderr[-3000:])
        result = json.loads(cli.stdout.split("[tpuft] predict result ", 1)[1].splitlines()[0])
    n = measured["examples"]
    base = n / measured["seconds"]["plain loop"]
    print(
        f"quickstart export {export}, {n} held-out numbers, batch {batch_size}, {threads} threads, "
        f"best of {repeat}\n"
    )
    print(f"| {'how':34} | {'examples/s':>10} | {'vs plain loop':>13} |")
    print(f"|{'-' * 36}|{'-' * 11}:|{'-' * 14}:|")
    for name, seconds in measured["seconds"].items():
        rate = n / seconds
        print(f"| {name:34} | {rate:10.1f} | {rate / base:12.2f}x |")
    print(
        f"\nthe whole `python -m tpuft.worker.predict.main --local` command: {wall:.1f} s "
        f"(imports and model load included); exact match {result['scores']['exact_match']}, "
        f"the training run's final eval_exact_match {last_eval_exact_match(run_dir)}"
    )


ECHO = r"""
import json, sys
from pathlib import Path
from tpuft.worker.predict import loop as predict_loop
from tpuft.run.predict_job import PredictJob

class Echo:
    def predict(self, sources): return [s[::-1] for s in sources]
    def close(self): pass

job = PredictJob.from_json(Path(sys.argv[1]).read_text())
predict_loop.serve(job, Echo(), process=0, processes=1, recipe=None, say=lambda _: None)
import resource
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def rss(lines: list[int]) -> None:
    recipe = (REPO / "tpuft" / "recipes" / "quickstart.yaml").read_text()
    rows = []
    for count in lines:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "in.jsonl"
            with source.open("w") as handle:
                for i in range(count):
                    handle.write(
                        json.dumps({"words": f"number {i} written out in words", "digits": str(i)}) + "\n"
                    )
            from tpuft.run.predict_job import PredictJob

            job = PredictJob(
                input=str(source),
                shards=f"{tmp}/shards",
                output=f"{tmp}/out.jsonl",
                backend="echo",
                model="-",
                recipe=recipe,
                batch_size=32,
            )
            (Path(tmp) / "job.json").write_text(job.to_json())
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", ECHO, f"{tmp}/job.json"],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            seconds = time.perf_counter() - started
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            peak = int(done.stdout.split("PEAK_KIB ", 1)[1].split()[0]) / 1024
            out_lines = sum(1 for _ in open(f"{tmp}/out.jsonl"))
            rows.append((count, source.stat().st_size / 2**20, peak, seconds, out_lines))
    print("one worker process (loop, reader, part writer, join; an echo engine)\n")
    print(
        f"| {'input lines':>11} | {'input MiB':>9} | {'peak RSS MiB':>12} | {'seconds':>7} | {'rows out':>9} "
        "|"
    )
    print(f"|{'-' * 12}:|{'-' * 10}:|{'-' * 13}:|{'-' * 8}:|{'-' * 10}:|")
    for count, mib, peak, seconds, out_lines in rows:
        print(f"| {count:11,} | {mib:9.1f} | {peak:12.1f} | {seconds:7.1f} | {out_lines:9,} |")


JOIN = r"""
import json, resource, sys, time
from pathlib import Path
from tpuft.ops.predict_shards import join_output
from tpuft.run.predict_job import PredictJob
from tpuft.scoring.predictions import row, statistics

lines, folder = int(sys.argv[1]), Path(sys.argv[2])
shard_lines, processes = 10_000, 2
shards = folder / "shards"
count = (lines + shard_lines - 1) // shard_lines
for k in range(count):  # what 2 worker processes leave: parts, their stats, then their done files
    ids = range(k * shard_lines, min(lines, (k + 1) * shard_lines))
    for p in range(processes):
        mine = [i for i in ids if i % processes == p]
        part = shards / f"shard-{k:06d}"
        part.mkdir(parents=True, exist_ok=True)
        preds = [str(i % 9999) for i in mine]
        (part / f"stats-{p:05d}.json").write_text(json.dumps({"stats": statistics(preds, preds), "labels": [], "rows": len(mine)}))
        with open(part / f"predictions-{p:05d}.jsonl", "w") as handle:
            for i, pr in zip(mine, preds):
                handle.write(json.dumps(row(i, f"number {i} written out in words", pr, pr)) + "\n")
(shards / "processes.json").write_text(json.dumps({"processes": processes}))
for p in range(processes):
    (shards / f"done-{p:05d}.json").write_text(json.dumps({"shards": count, "records": lines, "predicted": count,
                                                           "skipped": 0, "processes": processes}))
job = PredictJob(input="in.jsonl", shards=str(shards), output=None, backend="hf", model="m", recipe="",
                 shard_lines=shard_lines, total_lines=lines)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
summary = join_output(job, str(folder / "out.jsonl"))
print(json.dumps({"rows": summary["rows"], "seconds": round(time.monotonic() - started, 1),
                  "before": round(before / 1024, 1), "peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""  # noqa: E501 (a script run in another interpreter)


def join_rss(lines: list[int]) -> None:
    """The controller's join (``tpuft.ops.predict_shards.join_output``) of shards two processes wrote."""
    rows = []
    for count in lines:
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(
                [sys.executable, "-c", JOIN, str(count), tmp],
                capture_output=True,
                text=True,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            rows.append((count, json.loads(done.stdout.splitlines()[-1])))
    print("the controller's join of 2 processes' shards of 10,000 lines\n")
    print(
        f"| {'rows':>9} | {'seconds':>7} | {'peak RSS before the join MiB':>28} | "
        f"{'peak RSS after it MiB':>21} |"
    )
    print(f"|{'-' * 10}:|{'-' * 8}:|{'-' * 29}:|{'-' * 22}:|")
    for count, found in rows:
        print(f"| {count:9,} | {found['seconds']:7.1f} | {found['before']:28.1f} | {found['peak']:21.1f} |")


def scaling(run_dir: Path, workers: list[int], lines: int) -> None:
    """``tpuft predict`` of a run's last checkpoint on local pods of 1 and 2 workers (the PyTorch/XLA engine
    on each worker's PJRT CPU device): examples/s of the whole job (launch, model load, compilation, decode,
    join) and of the decode alone (the workers' shard lines)."""
    numbers = REPO / "tpuft" / "recipes" / "data" / "numbers"
    steps = sorted((run_dir / "checkpoints").glob("step_*"))
    if not steps:
        raise SystemExit(f"{run_dir} has no checkpoint")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "in.jsonl"
        with source.open("w") as handle:
            every = [
                line for name in ("train", "eval", "test") for line in (numbers / f"{name}.jsonl").open()
            ]
            for i in range(lines):
                handle.write(every[i % len(every)])
        env = {**os.environ, "TPUFT_HOME": f"{tmp}/home"}
        for count in workers:
            cluster = Path(tmp) / f"c{count}.yaml"
            cluster.write_text(f"name: scale{count}\nlocal:\n  workers: {count}\n  devices_per_worker: 1\n")
            tpuft = [sys.executable, "-m", "tpuft"]
            subprocess.run([*tpuft, "create", "-c", str(cluster)], env=env, capture_output=True, check=True)
            done = subprocess.run(
                [
                    *tpuft,
                    "predict",
                    str(steps[-1]),
                    "--recipe",
                    str(run_dir / "recipe.yaml"),
                    "-i",
                    str(source),
                    "-o",
                    f"{tmp}/out{count}.jsonl",
                    "-c",
                    str(cluster),
                    "--json",
                ],
                env=env,
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            result = json.loads(done.stdout)
            decode = sum(
                float(line.rsplit(", ", 1)[1].split()[0])
                for line in done.stderr.splitlines()
                if "] [tpuft] predict shard " in line and line.endswith(" ex/s")
            )
            rows.append(
                (
                    count,
                    result["seconds"],
                    result["examples_per_s"],
                    decode,
                    result["scores"].get("exact_match"),
                )
            )
    print(f"tpuft predict of {steps[-1].name} ({run_dir.name}) on {lines:,} numbers, local pods\n")
    print(
        f"| {'workers':>7} | {'job s':>6} | {'job examples/s':>14} | {'decode examples/s':>17} | "
        f"{'exact match':>11} |"
    )
    print(f"|{'-' * 8}:|{'-' * 7}:|{'-' * 15}:|{'-' * 18}:|{'-' * 12}:|")
    for count, seconds, rate, decode, exact in rows:
        print(f"| {count:7} | {seconds:6.1f} | {rate:14.1f} | {decode:17.1f} | {exact:11} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("throughput")
    one.add_argument("--export", type=Path)
    one.add_argument("--batch-size", type=int, default=32)
    one.add_argument("--repeat", type=int, default=3)
    one.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    two = sub.add_parser("rss")
    two.add_argument("--lines", type=int, nargs="+", default=[10_000, 1_000_000])
    four = sub.add_parser("scaling")
    four.add_argument("--run", type=Path, help="a quickstart run dir (default: the newest export's)")
    four.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    four.add_argument("--lines", type=int, default=10_000)
    three = sub.add_parser("join-rss")
    three.add_argument("--lines", type=int, nargs="+", default=[10_000, 1_000_000])
    args = parser.parse_args()
    if args.what == "throughput":
        throughput((args.export or find_export()).resolve(), args.batch_size, args.repeat, args.threads)
    elif args.what == "scaling":
        scaling((args.run or find_export().parent.parent).resolve(), args.workers, args.lines)
    elif args.what == "join-rss":
        join_rss(args.lines)
    else:
        rss(args.lines)


if __name__ == "__main__":
    main()
