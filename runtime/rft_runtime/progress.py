"""The trainer's progress record and where it goes (DESIGN.md contract 5).

The record's JSON format is the operator's (``rft_operator.progress``, documented in
``docs/progress.md``): the runtime never imports the operator, so the format is mirrored here and
a test checks that the operator parses what this module writes, field for field.

Sinks:

* :class:`FileProgressSink` — ``progress.json`` in a directory (local runs), replaced atomically.
* :class:`ConfigMapProgressSink` — ConfigMap ``<job>-progress``, key ``progress.json``, patched
  through the in-cluster config. It patches that one ConfigMap and nothing else.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

PROGRESS_KEY = "progress.json"
MAX_MESSAGE = 1024


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 with a ``Z`` suffix."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def progress_configmap_name(job: str) -> str:
    """The progress ConfigMap of a job: ``<job>-progress``."""
    return f"{job}-progress"


@dataclass
class ProgressErrors:
    """Cumulative error counters (camelCase in JSON)."""

    timeouts: int = 0
    runtime_errors: int = 0
    parse_errors: int = 0
    dropped_episodes: int = 0
    reissued_leases: int = 0

    def to_json(self) -> dict[str, int]:
        return {"timeouts": self.timeouts, "runtimeErrors": self.runtime_errors,
                "parseErrors": self.parse_errors, "droppedEpisodes": self.dropped_episodes,
                "reissuedLeases": self.reissued_leases}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProgressErrors":
        return cls(int(d.get("timeouts", 0)), int(d.get("runtimeErrors", 0)), int(d.get("parseErrors", 0)),
                   int(d.get("droppedEpisodes", 0)), int(d.get("reissuedLeases", 0)))


@dataclass
class CheckpointEntry:
    """A complete checkpoint retained on the volume."""

    step: int
    path: str
    time: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "path": self.path}
        if self.time is not None:
            d["time"] = self.time
        return d


@dataclass
class ProgressRecord:
    """One progress record; ``to_json`` gives the operator's format (None fields are omitted)."""

    attempt: int = 0
    step: int = 0
    total_steps: int | None = None
    policy_version: int = 0
    reward_mean: float | None = None
    reward_std: float | None = None
    eval_score: float | None = None
    samples_scored: int = 0
    errors: ProgressErrors = field(default_factory=ProgressErrors)
    checkpoints: list[CheckpointEntry] = field(default_factory=list)
    done: bool = False
    message: str = ""
    update_time: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as the operator reads it (camelCase keys; non-finite floats become absent)."""
        def num(x: float | None) -> float | None:
            return float(x) if x is not None and math.isfinite(float(x)) else None

        d: dict[str, Any] = {
            "attempt": int(self.attempt),
            "step": int(self.step),
            "totalSteps": self.total_steps,
            "policyVersion": int(self.policy_version),
            "rewardMean": num(self.reward_mean),
            "rewardStd": num(self.reward_std),
            "evalScore": num(self.eval_score),
            "samplesScored": int(self.samples_scored),
            "errors": self.errors.to_json(),
            "checkpoints": [c.to_json() for c in self.checkpoints],
            "done": bool(self.done),
            "message": self.message[:MAX_MESSAGE],
            "updateTime": self.update_time or now_rfc3339(),
        }
        return {k: v for k, v in d.items() if v is not None}

    def to_text(self) -> str:
        """The JSON text stored under ``progress.json``."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProgressRecord":
        """Read a record written by :meth:`to_json` (missing keys take defaults)."""
        return cls(
            attempt=int(d.get("attempt", 0)), step=int(d.get("step", 0)), total_steps=d.get("totalSteps"),
            policy_version=int(d.get("policyVersion", 0)), reward_mean=d.get("rewardMean"),
            reward_std=d.get("rewardStd"), eval_score=d.get("evalScore"),
            samples_scored=int(d.get("samplesScored", 0)),
            errors=ProgressErrors.from_json(d.get("errors") or {}),
            checkpoints=[CheckpointEntry(int(c["step"]), str(c["path"]), c.get("time"))
                         for c in d.get("checkpoints") or []],
            done=bool(d.get("done", False)), message=str(d.get("message", "")), update_time=d.get("updateTime"),
        )


class ProgressSink(Protocol):
    """Where progress records go."""

    def write(self, record: ProgressRecord) -> None: ...

    def read(self) -> ProgressRecord | None: ...


class FileProgressSink:
    """``<dir>/progress.json``, written to a temporary file and renamed (readers never see half)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / PROGRESS_KEY

    def write(self, record: ProgressRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".progress-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(record.to_text())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def read(self) -> ProgressRecord | None:
        if not self.path.exists():
            return None
        text = self.path.read_text()
        return ProgressRecord.from_json(json.loads(text)) if text.strip() else None


API_TIMEOUT_S = (5.0, 10.0)
"""(connect, read) deadline of every progress API call: an API-server brown-out costs a training
step at most this long (a failed write is logged and the next step's record supersedes it)."""


class ConfigMapProgressSink:
    """Patches ConfigMap ``<job>-progress`` in the job's namespace (in-cluster config).

    ``api`` (a ``kubernetes.client.CoreV1Api``) may be given for tests; by default the in-cluster
    service-account config is loaded (or, outside a pod, ``$KUBECONFIG``). Only ``patch`` and
    ``get`` of that one ConfigMap are used.
    """

    def __init__(self, job: str, namespace: str, api: Any = None) -> None:
        self.name = progress_configmap_name(job)
        self.namespace = namespace
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CoreV1Api()
        self._api = api

    def write(self, record: ProgressRecord) -> None:
        self._api.patch_namespaced_config_map(self.name, self.namespace, {"data": {PROGRESS_KEY: record.to_text()}},
                                              _request_timeout=API_TIMEOUT_S)

    def read(self) -> ProgressRecord | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self._api.read_namespaced_config_map(self.name, self.namespace, _request_timeout=API_TIMEOUT_S)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        text = (cm.data or {}).get(PROGRESS_KEY, "")
        return ProgressRecord.from_json(json.loads(text)) if text.strip() else None


def in_cluster() -> bool:
    """True inside a Kubernetes pod: the API server's address is in the environment."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
