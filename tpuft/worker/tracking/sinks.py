"""The trackers the sidecar (:mod:`tpuft.worker.tracking.sidecar`) feeds: W&B and MLflow, each behind the same
four calls.

``start`` opens the tracker's run (the one ``tracking.json`` names when there is one: a resumed run continues
it), ``send`` logs metrics rows at their steps, ``finish`` logs the test summary and the samples table and
closes the run with the trainer's outcome, ``where`` says where the run is (kept in ``tracking.json`` and
run.json). Imported only in the tracking venv (wandb, mlflow); each call may raise, and the sidecar's guard
makes that a warning.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

OUTCOMES = {
    "finished": ("FINISHED", 0),
    "failed": ("FAILED", 1),
    "hung": ("FAILED", 1),
    "stopped": ("KILLED", 1),
    "killed": ("KILLED", 1),
}
"""The trainer's outcome -> (MLflow run status, W&B exit code)."""


def numeric(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's metrics: its numbers, less the step and the wall time."""
    return {
        key: float(value)
        for key, value in row.items()
        if key not in {"step", "time"} and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def make_sinks(names: list[str], context: dict[str, Any], state: dict[str, Any]) -> list[Any]:
    kinds = {"wandb": WandbSink, "mlflow": MlflowSink}
    return [kinds[name](context, state.get(name) or {}) for name in names if name in kinds]


def flat_params(data: Any, prefix: str = "") -> dict[str, str]:
    """A nested recipe as dotted ``key: value`` strings (MLflow's params)."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    text = data if isinstance(data, str) else json.dumps(data)
    return {prefix.rstrip("."): text[:6000]}


def sample_columns(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    return columns


class Sink:
    """What both trackers keep: the sidecar's context (run dir, run id, recipe, report, tags), their own
    ``report.<name>`` settings, and their entry of ``tracking.json`` (``saved``: updated as they go)."""

    name = ""

    def __init__(self, context: dict[str, Any], saved: dict[str, Any]) -> None:
        self.context = context
        self.settings = dict(context["report"].get(self.name) or {})
        self.saved = saved


class WandbSink(Sink):
    name = "wandb"

    def __init__(self, context: dict[str, Any], saved: dict[str, Any]) -> None:
        super().__init__(context, saved)
        self.run: Any = None
        self.last_step = 0

    @property
    def started(self) -> bool:
        return self.run is not None

    @property
    def mode(self) -> str:
        """The mode the W&B run is opened in (:func:`wandb_mode`, with this process's environment)."""
        return wandb_mode(self.settings.get("mode"), os.environ)

    def key_problem(self) -> str | None:
        """Why an online run cannot start (no API key anywhere W&B looks), or None: offline and disabled
        runs need none. Decided before wandb is imported."""
        if self.mode != "online" or os.environ.get("WANDB_API_KEY") or _netrc_has_wandb():
            return None
        return (
            "no WANDB_API_KEY in the chief's environment: give it through the cluster file's "
            "worker_env (WANDB_API_KEY: ${WANDB_API_KEY}), or set report.wandb.mode: offline (or WANDB_MODE: "
            "offline in worker_env)"
        )

    def start(self) -> None:
        problem = self.key_problem()
        if problem is not None:
            raise RuntimeError(problem)
        import wandb

        mode = self.mode
        tags = self.context["tags"]
        run_id = self.saved.get("id") or secrets.token_hex(4)
        self.run = wandb.init(
            project=self.settings.get("project") or "tpuft",
            entity=self.settings.get("entity"),
            id=run_id,
            resume="allow",
            name=tags["run_id"],
            group=self.settings.get("group"),
            notes=self.settings.get("notes"),
            tags=[value for value in tags.values() if value] + list(self.settings.get("tags") or []),
            config=self.context["recipe"],
            dir=str(self.context["run_dir"]),
            mode=mode,
            settings=wandb.Settings(
                console="off", silent=True, x_disable_stats=True, x_disable_machine_info=True
            ),
            reinit="create_new",
        )

    def send(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.run.log(numeric(row), step=row["step"])
            self.last_step = max(self.last_step, row["step"])

    def finish(self, outcome: str, test: dict[str, Any], source: str, rows: list[dict[str, Any]]) -> None:
        import wandb

        if test:
            self.run.summary.update(test)
        if rows:
            columns = sample_columns(rows)
            table = wandb.Table(columns=columns, data=[[_cell(row.get(c)) for c in columns] for row in rows])
            self.run.log({f"samples/{source}": table}, step=self.last_step)
        self.run.finish(exit_code=OUTCOMES.get(outcome, ("", 1))[1])
        self.run = None
        self.saved["finished"] = True

    def where(self) -> dict[str, Any]:
        if self.run is None:
            return {
                key: self.saved[key]
                for key in ("id", "project", "entity", "mode", "url", "path", "dir")
                if key in self.saved
            }
        mode = self.mode
        if mode == "disabled":  # W&B's stand-in run: nothing is kept, nothing to point at
            self.saved.update(mode=mode)
            return {"mode": mode}
        found = {
            "id": self.run.id,
            "project": self.run.project,
            "mode": mode,
            "dir": os.path.relpath(str(self.run.dir), str(self.context["run_dir"])).removesuffix("/files"),
        }
        if mode == "online":
            found.update(
                entity=self.run.entity,
                url=self.run.url,
                path="/".join(self.run.path)
                if isinstance(self.run.path, (list, tuple))
                else str(self.run.path),
            )
        self.saved.update(found)
        return found


WANDB_MODES = {"offline": "offline", "dryrun": "offline", "disabled": "disabled"}
"""``WANDB_MODE`` values that turn a run down from online, and what each turns it to (``dryrun`` is W&B's old
name for offline)."""


def wandb_mode(configured: str | None, environ: Mapping[str, str]) -> str:
    """``report.wandb.mode`` (online unless set), turned down by ``WANDB_MODE`` (W&B's own switch, from the
    cluster's ``worker_env`` or the worker's environment) as W&B would be: ``offline``/``dryrun`` -> offline,
    ``disabled`` -> disabled. Only down: ``WANDB_MODE=online`` does not send a recipe's offline run to the
    server. Needed because tpuft passes the mode to ``wandb.init``, where an argument outranks the
    environment."""
    mode = str(configured or "online")
    switch = WANDB_MODES.get(str(environ.get("WANDB_MODE", "")).strip().lower())
    if switch == "disabled" or (switch == "offline" and mode == "online"):
        return switch
    return mode


def _netrc_has_wandb() -> bool:
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def _cell(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)


def mlflow_uri(configured: str | None, run_dir: Path) -> str:
    """The store's URI: the recipe's, else ``MLFLOW_TRACKING_URI``, else SQLite in the run dir (``mlflow.db``:
    MLflow 3 refuses new file stores unless asked, see :meth:`MlflowSink.start`); a relative path in a
    ``file:`` or ``sqlite:`` URI is the run dir's."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///")
        return uri if path.startswith("/") else f"sqlite:///{run_dir / path}"
    if uri.startswith("file:"):
        path = uri.removeprefix("file:")
        path = path.removeprefix("//") if path.startswith("///") else path
        return f"file:{path if path.startswith('/') else run_dir / path}"
    return uri


def local_artifacts(uri: str) -> str | None:
    """A SQLite store's artifacts beside its database file: MLflow's default is ``./mlruns`` of whatever
    folder the process that creates the experiment runs in. None (MLflow's choice) for a file store, which
    keeps them inside itself, and for a server, which has its own artifact root."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///") :]).resolve().parent / "mlartifacts").as_uri()


class MlflowSink(Sink):
    name = "mlflow"

    def __init__(self, context: dict[str, Any], saved: dict[str, Any]) -> None:
        super().__init__(context, saved)
        self.client: Any = None
        self.run_id: str | None = None
        self.uri = mlflow_uri(self.settings.get("tracking_uri"), Path(context["run_dir"]))

    @property
    def started(self) -> bool:
        return self.run_id is not None

    def start(self) -> None:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        if self.uri.startswith(
            "file:"
        ):  # asked for by name: MLflow 3 keeps its file store, in maintenance mode
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=self.uri)
        name = str(self.settings.get("experiment") or "tpuft")
        tags = self.context["tags"]
        run_id = self.saved.get("run_id") if self.saved.get("tracking_uri") == self.uri else None
        if run_id:
            try:
                client.update_run(run_id, status="RUNNING")
            except MlflowException as exc:
                print(
                    f"[tracking] WARNING: mlflow: run {run_id} of {self.uri} is gone ({exc.error_code}); "
                    "starting a new one",
                    flush=True,
                )
                run_id = None
        if not run_id:
            experiment = client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(name, artifact_location=local_artifacts(self.uri))
            )
            run = client.create_run(
                experiment_id,
                run_name=tags["run_id"],
                tags={f"tpuft.{key}": value for key, value in tags.items() if value},
            )
            run_id = run.info.run_id
            self._config(client, run_id)
        self.client, self.run_id = client, run_id
        self.saved.update(run_id=run_id, tracking_uri=self.uri, experiment=name)

    def _config(self, client: Any, run_id: str) -> None:
        from mlflow.entities import Param

        params = [Param(key, value) for key, value in flat_params(self.context["recipe"]).items() if key]
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])
        client.log_text(run_id, (Path(self.context["run_dir"]) / "recipe.yaml").read_text(), "recipe.yaml")

    def send(self, rows: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(key, value, int(float(row.get("time") or time.time()) * 1000), row["step"])
            for row in rows
            for key, value in numeric(row).items()
        ]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def finish(self, outcome: str, test: dict[str, Any], source: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            columns = sample_columns(rows)
            self.client.log_table(
                self.run_id,
                {c: [_cell(row.get(c)) for row in rows] for c in columns},
                f"samples_{source}.json",
            )
        self.client.set_terminated(self.run_id, status=OUTCOMES.get(outcome, ("KILLED", 1))[0])
        self.saved["finished"] = True

    def where(self) -> dict[str, Any]:
        return {key: self.saved[key] for key in ("run_id", "tracking_uri", "experiment") if key in self.saved}
