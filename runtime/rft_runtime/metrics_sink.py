"""Per-step training metrics: ``metrics.jsonl``, TensorBoard event files and Prometheus gauges.

:class:`MetricsSink.log` takes one flat dict of numbers per step. Each goes to

* ``<dir>/metrics.jsonl`` — one JSON object per line with ``step`` first (flushed and fsynced);
* TensorBoard — ``<dir>/tensorboard/`` scalars, tagged with the keys unchanged (``time/update``
  groups under ``time`` in the TensorBoard UI);
* Prometheus — a gauge on the sink's own registry, labelled ``job``, ``namespace``, ``role``
  (:mod:`rft_api.telemetry`). Keys of a family become one gauge with a label
  (:func:`prometheus_series`): ``time/<phase>`` → ``rft_trainer_step_phase_seconds{phase}``,
  ``reward/<evaluator>`` → ``rft_trainer_evaluator_reward{evaluator}``, ``errors/<kind>`` →
  ``rft_trainer_episode_errors{kind}``, ``domain/<domain>/<stat>`` →
  ``rft_trainer_domain_reward_<stat>{domain}``; any other key is ``rft_trainer_<key>``
  (non-alphanumerics become ``_``).

:meth:`MetricsSink.text` adds markdown text to TensorBoard (its Text tab): the trainer's sampled
completions, tagged ``samples``.

On resume, :meth:`MetricsSink.truncate_after` drops lines of steps that are redone, and the
TensorBoard writer purges events after the resumed step, so each step appears once.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Gauge

from rft_api.telemetry import job_registry

METRICS_FILE = "metrics.jsonl"
_PROM_NAME = re.compile(r"[^a-zA-Z0-9_]")


# Families of keys exported as one labelled gauge: prefix → (gauge name, label).
FAMILIES = {
    "time": ("rft_trainer_step_phase_seconds", "phase"),
    "reward": ("rft_trainer_evaluator_reward", "evaluator"),
    "errors": ("rft_trainer_episode_errors", "kind"),
}


def prometheus_name(key: str) -> str:
    """The gauge name of an unlabelled metric key: ``rft_trainer_`` + key with non-alphanumerics as ``_``."""
    return "rft_trainer_" + _PROM_NAME.sub("_", key).strip("_")


def prometheus_series(key: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """``(gauge name, label names, label values)`` of a metric key (see the module docstring)."""
    head, _, rest = key.partition("/")
    if rest and head in FAMILIES:
        name, label = FAMILIES[head]
        return name, (label,), (rest,)
    if head == "domain" and rest.count("/") == 1:
        domain, stat = rest.split("/")
        return prometheus_name(f"domain_reward_{stat}"), ("domain",), (domain,)
    return prometheus_name(key), (), ()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The objects of a ``metrics.jsonl`` file (a torn last line is ignored)."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class MetricsSink:
    """Writes per-step metrics to JSONL, TensorBoard and Prometheus gauges."""

    def __init__(self, directory: str | Path | None, *, tensorboard: bool = True,
                 registry: CollectorRegistry | None = None, purge_step: int | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.registry = registry or job_registry("trainer")
        self._gauges: dict[str, Gauge] = {}
        self._tb = None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.directory / "tensorboard"), purge_step=purge_step,
                                         flush_secs=10)

    @property
    def jsonl_path(self) -> Path | None:
        return self.directory / METRICS_FILE if self.directory is not None else None

    def truncate_after(self, step: int) -> int:
        """Keep only lines with ``step <= step`` (a resumed run redoes the later ones); returns how
        many lines were dropped."""
        path = self.jsonl_path
        if path is None or not path.exists():
            return 0
        rows = read_metrics(path)
        keep = [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= step]
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            for r in keep:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return len(rows) - len(keep)

    def gauge(self, key: str) -> Gauge:
        """The Prometheus gauge (with its labels applied) of ``key`` (created on first use)."""
        name, labels, values = prometheus_series(key)
        g = self._gauges.get(name)
        if g is None:
            doc = f"trainer metrics {key.rsplit('/', 1)[0]}/<{labels[0]}>" if labels else f"trainer metric {key}"
            g = Gauge(name, doc, labels, registry=self.registry)
            self._gauges[name] = g
        return g.labels(*values) if labels else g

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record one step's metrics; non-numeric and non-finite values are left out of
        TensorBoard and Prometheus (kept in JSONL as null)."""
        row: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            if k == "step":
                continue
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, (int, float)):
                fv = float(v)
                row[k] = v if math.isfinite(fv) else None
                if math.isfinite(fv):
                    self.gauge(k).set(fv)
                    if self._tb is not None:
                        self._tb.add_scalar(k, fv, step)
            elif v is None or isinstance(v, str):
                row[k] = v
        path = self.jsonl_path
        if path is not None:
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return row

    def text(self, tag: str, markdown: str, step: int) -> None:
        """Markdown ``markdown`` as TensorBoard text under ``tag`` at ``step`` (nothing without TensorBoard)."""
        if self._tb is not None:
            self._tb.add_text(tag, markdown, step)

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
