"""Where the trainer's progress record goes (``docs/progress.md``).

The record itself is :class:`rft_api.progress.Progress`, the one model the operator parses too.

Sinks:

* :class:`FileProgressSink` — ``progress.json`` in a directory (local runs), replaced atomically.
* :class:`ConfigMapProgressSink` — ConfigMap ``<job>-progress`` (named by the runtime config), key
  ``progress.json``, patched through the in-cluster config. It patches that one ConfigMap and nothing else.

Both also hold the last steps' sampled completions (:mod:`rft_runtime.samples_view`): the file
``samples.json`` next to ``progress.json``, or the ConfigMap's key ``samples.json``
(:meth:`~FileProgressSink.write_samples`).
"""

from __future__ import annotations

import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from rft_api.progress import PROGRESS_KEY, SAMPLES_KEY, Progress, parse_text

MAX_MESSAGE = 1024


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 with a ``Z`` suffix."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finite(x: float | None) -> float | None:
    """``x`` as a float, or None when it is absent or not finite (the record refuses NaN and inf)."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def clip_message(message: str) -> str:
    return message[:MAX_MESSAGE]


class ProgressSink(Protocol):
    """Where progress records go."""

    def write(self, record: Progress) -> None: ...

    def read(self) -> Progress | None: ...

    def write_samples(self, data: str) -> None:
        """Replace the last steps' samples (the ``samples.json`` text)."""

    def read_samples(self) -> str | None:
        """The ``samples.json`` text written last (None when there is none)."""


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file next to ``path`` and rename it (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class FileProgressSink:
    """``<dir>/progress.json`` (and ``<dir>/samples.json``), each written to a temporary file and renamed
    (readers never see half)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / PROGRESS_KEY
        self.samples_path = Path(directory) / SAMPLES_KEY

    def write(self, record: Progress) -> None:
        _replace_file(self.path, record.to_data()[PROGRESS_KEY])

    def write_samples(self, data: str) -> None:
        _replace_file(self.samples_path, data)

    def read_samples(self) -> str | None:
        if not self.samples_path.exists():
            return None
        return self.samples_path.read_text(encoding="utf-8") or None

    def read(self) -> Progress | None:
        if not self.path.exists():
            return None
        text = self.path.read_text()
        return parse_text(text) if text.strip() else None


API_TIMEOUT_S = (5.0, 10.0)
"""(connect, read) deadline of every progress API call: an API-server brown-out costs a training
step at most this long (a failed write is logged and the next step's record supersedes it)."""


class ConfigMapProgressSink:
    """Patches ConfigMap ``<job>-progress`` in the job's namespace (in-cluster config).

    ``api`` (a ``kubernetes.client.CoreV1Api``) may be given for tests; by default the in-cluster
    service-account config is loaded (or, outside a pod, ``$KUBECONFIG``). Only ``patch`` and
    ``get`` of that one ConfigMap are used.
    """

    def __init__(self, name: str, namespace: str, api: Any = None) -> None:
        self.name = name
        self.namespace = namespace
        if api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CoreV1Api()
        self._api = api

    def write(self, record: Progress) -> None:
        self._api.patch_namespaced_config_map(self.name, self.namespace, {"data": record.to_data()},
                                              _request_timeout=API_TIMEOUT_S)

    def write_samples(self, data: str) -> None:
        """Patch the key ``samples.json`` of the same ConfigMap (the record's key is left as it is)."""
        self._api.patch_namespaced_config_map(self.name, self.namespace, {"data": {SAMPLES_KEY: data}},
                                              _request_timeout=API_TIMEOUT_S)

    def _data(self) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self._api.read_namespaced_config_map(self.name, self.namespace, _request_timeout=API_TIMEOUT_S)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(cm.data or {})

    def read(self) -> Progress | None:
        text = (self._data() or {}).get(PROGRESS_KEY, "")
        return parse_text(text) if text.strip() else None

    def read_samples(self) -> str | None:
        return (self._data() or {}).get(SAMPLES_KEY) or None

