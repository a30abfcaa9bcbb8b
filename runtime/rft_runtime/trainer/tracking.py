"""Experiment tracking beyond TensorBoard: an MLflow run (``spec.tracking.mlflow``) and a Weights &
Biases offline run (``spec.tracking.wandb``) per job. :func:`start_trackers` opens those a spec names.

:class:`MlflowTracker` speaks MLflow's REST API (``/api/2.0/mlflow/...``) with httpx, so the runtime
needs no MLflow client library; the tests run it against a real ``mlflow server``. Credentials are
read from the environment as MLflow's own client reads them: ``MLFLOW_TRACKING_TOKEN`` (bearer), else
``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` (basic); on a cluster they come from
``trainer.env`` by secretKeyRef and never appear in the config, a log or the status.

- One run per job, kept across trainer restarts: its id is stored on the checkpoint volume
  (``tracking/mlflow.json``), so a resumed attempt logs into the same run (status back to RUNNING).
- Parameters: the job's spec, flattened (``trainer.learningRate``), plus the job's identity as tags.
- Metrics: every step's finite metrics at that step, the reward curve included (``reward_mean``).
- Sampled completions (``spec.tracking.samples``): an artifact ``samples/step-NNNNNN.json`` per step
  written, uploaded through the server's artifact proxy (``/api/2.0/mlflow-artifacts``, on by default in
  ``mlflow server``). A run whose artifacts the server does not proxy (its artifact URI is a path or a
  bucket the server's clients write to directly) gets none; that is logged once, not counted as a failure.
- The run ends FINISHED with the job, or FAILED when the trainer fails.

A tracker never stops training. Requests run on a background thread from a bounded queue (a step
never waits for the tracker); a failure (unreachable, an HTTP error, a full queue) is counted in
:attr:`MlflowTracker.errors` (the ``tracking_errors`` metric) and logged once as a warning, and the
tracker keeps trying with the next step.

:class:`WandbTracker` uses the real ``wandb`` SDK in offline mode: the run is written under the
checkpoint volume (``tracking/wandb/``), to be uploaded later with ``wandb sync``; its run id is kept
(``tracking/wandb.json``) so that every trainer attempt writes the same run. Sampled completions are
logged as a table ``samples`` (one row per completion) at their step. Its failures are counted and warned
once in the same way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import quote, urlparse

import httpx

from .checkpoint import write_text_atomic

log = logging.getLogger(__name__)

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
MAX_PARAMS_PER_BATCH = 100  # MLflow's limits for runs/log-batch
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE = 6000
STATE_FILE = "mlflow.json"
WANDB_STATE_FILE = "wandb.json"
WANDB_SAMPLE_COLUMNS = ("task", "prompt", "reference", "completion", "text", "reward", "correct", "reason",
                        "finish", "errors")


class TrackerError(RuntimeError):
    """The tracking server refused a request or could not be reached."""


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """``{"trainer": {"learningRate": 1e-3}}`` → ``{"trainer.learningRate": "0.001"}`` (lists as JSON)."""
    out: dict[str, str] = {}
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif obj is not None:
        text = json.dumps(obj) if isinstance(obj, (list, bool)) else str(obj)
        out[prefix] = text[:MAX_PARAM_VALUE]
    return out


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (no booleans, text, NaN or infinities), sorted by name."""
    return {k: float(v) for k, v in sorted(metrics.items())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def read_state(path: Path | None) -> dict[str, Any]:
    """A tracker's state file on the checkpoint volume ({} when absent or unreadable)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path: Path, state: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(dict(state)))


class _Failures:
    """Counts a tracker's failures (``tracking_errors``) and warns about the first one only."""

    what = "tracking"

    def __init__(self) -> None:
        self.errors = 0
        self._warned = False

    def _failed(self, e: Exception) -> None:
        self.errors += 1
        if not self._warned:
            self._warned = True
            log.warning("%s failed (training goes on; further failures are only counted in tracking_errors): %s",
                        self.what, e)


def auth_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Authorization header MLflow's client would send, from MLflow's environment variables."""
    env = os.environ if env is None else env
    if env.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"}
    user, password = env.get("MLFLOW_TRACKING_USERNAME"), env.get("MLFLOW_TRACKING_PASSWORD")
    if user and password is not None:
        import base64

        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


class MlflowTracker(_Failures):
    """Logs a job's run to an MLflow tracking server, on a background thread, never failing training."""

    def __init__(self, uri: str, experiment: str, run_name: str, state_dir: Path | None, *,
                 tags: Mapping[str, str] | None = None, timeout_s: float = 10.0, max_queue: int = 256) -> None:
        super().__init__()
        self.uri = uri.rstrip("/")
        self.what = f"MLflow tracking at {self.uri}"
        self.experiment = experiment
        self.run_name = run_name
        self.state_file = state_dir / STATE_FILE if state_dir is not None else None
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        self.artifact_uri: str | None = None
        self._no_artifacts_noted = False
        self._http = httpx.Client(timeout=timeout_s, headers=auth_headers())
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="mlflow-tracker", daemon=True)

    # ------------------------------------------------------------------ public (trainer thread)
    def start(self, params: Mapping[str, str]) -> "MlflowTracker":
        """Open (or resume) the job's run and log ``params``; returns self."""
        self._thread.start()
        self._submit(lambda: self._open(dict(params)))
        return self

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Queue the finite numeric ``metrics`` of ``step``."""
        now = int(time.time() * 1000)
        rows = [{"key": k, "value": v, "timestamp": now, "step": int(step)} for k, v in finite_metrics(metrics).items()]
        if rows:
            self._submit(lambda: self._batch(metrics=rows))

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Queue ``step``'s sampled completions as the run's artifact ``samples/step-NNNNNN.json``."""
        data = json.dumps(list(rows), ensure_ascii=False, indent=1).encode()
        self._submit(lambda: self._artifact(f"samples/step-{int(step):06d}.json", data))

    def finish(self, status: str = "FINISHED", timeout_s: float = 30.0) -> None:
        """End the run (``FINISHED`` or ``FAILED``), wait up to ``timeout_s`` for what is queued, and stop."""
        self._submit(lambda: self._end(status))
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        self._http.close()

    # ------------------------------------------------------------------ background thread
    def _submit(self, fn: Callable[[], None]) -> None:
        try:
            self._queue.put_nowait(fn)
        except queue.Full:
            self._failed(TrackerError(f"the queue of {self._queue.maxsize} requests is full (the server is slow "
                                      "or down): metrics dropped"))

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except (TrackerError, httpx.HTTPError, OSError, ValueError) as e:
                self._failed(e)

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
              params: Mapping[str, str] | None = None, ok_missing: bool = False) -> dict[str, Any] | None:
        r = self._http.request(method, f"{self.uri}{API}{path}", json=body, params=params)
        if ok_missing and r.status_code == 404:
            return None
        if r.status_code != 200:
            try:
                detail = r.json().get("message") or r.text[:300]
            except ValueError:
                detail = r.text[:300]
            raise TrackerError(f"{method} {API}{path}: HTTP {r.status_code}: {detail}")
        data = r.json() if r.content else {}
        return data if isinstance(data, dict) else {}

    def _open(self, params: dict[str, str]) -> None:
        stored = read_state(self.state_file)
        run_id = stored.get("run_id") if stored.get("uri") == self.uri else None
        if isinstance(run_id, str):
            got = self._call("GET", "/runs/get", params={"run_id": run_id}, ok_missing=True)
            if got is not None:
                self.run_id = run_id
                self.artifact_uri = ((got.get("run") or {}).get("info") or {}).get("artifact_uri")
                self._call("POST", "/runs/update", {"run_id": run_id, "status": "RUNNING"})
                log.info("MLflow: resuming run %s in %s", run_id, self.uri)
                return
        exp = self._call("GET", "/experiments/get-by-name", params={"experiment_name": self.experiment},
                         ok_missing=True)
        if exp is not None:
            exp_id = exp["experiment"]["experiment_id"]
        else:
            exp_id = (self._call("POST", "/experiments/create", {"name": self.experiment}) or {})["experiment_id"]
        run = self._call("POST", "/runs/create", {
            "experiment_id": exp_id, "run_name": self.run_name, "start_time": int(time.time() * 1000),
            "tags": [{"key": k, "value": v} for k, v in sorted(self.tags.items())]}) or {}
        self.run_id = run["run"]["info"]["run_id"]
        self.artifact_uri = run["run"]["info"].get("artifact_uri")
        if self.state_file is not None:
            write_state(self.state_file, {"uri": self.uri, "experiment": self.experiment, "run_id": self.run_id})
        items = sorted(params.items())
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._batch(params=[{"key": k, "value": v} for k, v in items[i:i + MAX_PARAMS_PER_BATCH]])
        log.info("MLflow: run %s (%s) in experiment %r at %s", self.run_id, self.run_name, self.experiment, self.uri)

    def _batch(self, metrics: list[dict[str, Any]] | None = None, params: list[dict[str, str]] | None = None) -> None:
        if self.run_id is None:
            raise TrackerError("no run is open (opening it failed)")
        for i in range(0, max(1, len(metrics or [])), MAX_METRICS_PER_BATCH):
            body: dict[str, Any] = {"run_id": self.run_id}
            if metrics:
                body["metrics"] = metrics[i:i + MAX_METRICS_PER_BATCH]
            if params and i == 0:
                body["params"] = params
            self._call("POST", "/runs/log-batch", body)

    def artifact_url(self, path: str) -> str | None:
        """Where the run's artifact ``path`` is uploaded: through the server's artifact proxy for an
        ``mlflow-artifacts:`` run (an ``http(s)`` artifact URI directly); None when the server does not
        proxy the run's artifacts."""
        uri = self.artifact_uri or ""
        if uri.startswith("mlflow-artifacts:"):
            where = urlparse(uri).path.strip("/")
            return f"{self.uri}{ARTIFACTS_API}/{quote(where)}/{quote(path)}"
        if uri.startswith(("http://", "https://")):
            return f"{uri.rstrip('/')}/{quote(path)}"
        return None

    def _artifact(self, path: str, data: bytes) -> None:
        if self.run_id is None:
            raise TrackerError("no run is open (opening it failed)")
        url = self.artifact_url(path)
        if url is None:
            if not self._no_artifacts_noted:
                self._no_artifacts_noted = True
                log.info("MLflow: run %s keeps its artifacts at %s, which %s does not serve: samples are not "
                         "uploaded (mlflow server --serve-artifacts serves them)", self.run_id, self.artifact_uri,
                         self.uri)
            return
        r = self._http.put(url, content=data, headers={"Content-Type": "application/json"})
        if r.status_code != 200:
            raise TrackerError(f"PUT {ARTIFACTS_API}/.../{path}: HTTP {r.status_code}: {r.text[:300]}")

    def _end(self, status: str) -> None:
        if self.run_id is not None:
            self._call("POST", "/runs/update", {"run_id": self.run_id, "status": status,
                                                "end_time": int(time.time() * 1000)})


class WandbTracker(_Failures):
    """A Weights & Biases run in offline mode under ``state_dir`` (one run id across attempts)."""

    what = "W&B tracking"

    def __init__(self, project: str, run_name: str, state_dir: Path, *, entity: str | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.project, self.run_name, self.entity = project, run_name, entity
        self.state_dir = state_dir
        self.tags = dict(tags or {})
        self.run: Any = None

    def start(self, config: Mapping[str, Any]) -> "WandbTracker":
        try:
            self._open(dict(config))
        except Exception as e:  # noqa: BLE001 - the tracker never stops training
            self._failed(e)
        return self

    def _open(self, config: dict[str, Any]) -> None:
        root = self.state_dir / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        # everything the SDK writes stays on the volume (the pods' root file systems are read-only)
        for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
            os.environ.setdefault(var, str(root / sub))
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        state = self.state_dir / WANDB_STATE_FILE
        run_id = read_state(state).get("run_id")
        self.run = wandb.init(mode="offline", dir=str(root), project=self.project, entity=self.entity,
                              name=self.run_name, id=run_id, resume="allow" if run_id else None,
                              config=config, tags=[f"{k}={v}" for k, v in sorted(self.tags.items())],
                              settings=wandb.Settings(console="off", x_disable_stats=True))
        if run_id is None:
            write_state(state, {"run_id": self.run.id, "project": self.project})
        log.info("W&B: offline run %s (%s) in %s (upload with: wandb sync %s)", self.run.id, self.project, root,
                 root)

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(finite_metrics(metrics), step=int(step))
        except Exception as e:  # noqa: BLE001 - the tracker never stops training
            self._failed(e)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """``step``'s sampled completions as a table ``samples``, one row per completion."""
        if self.run is None:
            return
        try:
            import wandb

            data = [[g.get("task_id"), g.get("prompt"), g.get("reference"), c.get("index"), c.get("text"),
                     c.get("reward"), c.get("correct"), c.get("reason"), c.get("finish") or c.get("termination"),
                     ", ".join(c.get("errors") or [])]
                    for g in rows for c in g.get("completions") or []]
            table = wandb.Table(columns=list(WANDB_SAMPLE_COLUMNS), data=data)
            self.run.log({"samples": table}, step=int(step))
        except Exception as e:  # noqa: BLE001 - the tracker never stops training
            self._failed(e)

    def finish(self, status: str = "FINISHED") -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=0 if status in ("FINISHED", "KILLED") else 1)
            import wandb

            wandb.teardown()  # the SDK's service flushes the run to disk before the trainer exits
        except Exception as e:  # noqa: BLE001 - the tracker never stops training
            self._failed(e)
        self.run = None


Tracker = MlflowTracker | WandbTracker


def start_trackers(tracking: Any, job_name: str, namespace: str, state_dir: Path, spec: Mapping[str, Any],
                   tags: Mapping[str, str]) -> list[Tracker]:
    """The trackers ``spec.tracking`` names, started (each in its own way never failing)."""
    out: list[Tracker] = []
    if tracking.mlflow is not None:
        ml = tracking.mlflow
        out.append(MlflowTracker(ml.uri, ml.experiment or f"{namespace}/{job_name}", job_name, state_dir,
                                 tags=tags).start(flatten(spec)))
    if tracking.wandb is not None:
        wb = tracking.wandb
        out.append(WandbTracker(wb.project, job_name, state_dir, entity=wb.entity, tags=tags).start(spec))
    return out
