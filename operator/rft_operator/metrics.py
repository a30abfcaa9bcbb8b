"""Prometheus metrics of the operator (own registry: several operators can live in one process)."""
from __future__ import annotations

from typing import Any, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from rft_api.constants import PHASES
from rft_api.telemetry import job_registry

DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """``rft_operator_reconciles_total{result}``, ``rft_operator_reconcile_errors_total{kind}``,
    ``rft_operator_reconcile_duration_seconds``, ``rft_operator_jobs{phase}``."""

    def __init__(self, registry: Optional[CollectorRegistry] = None):
        self.registry = registry or job_registry("operator")
        self.reconciles = Counter("rft_operator_reconciles", "Reconciles of RFTJobs, by result "
                                  "(ok, error, gone: the job no longer exists)", ["result"], registry=self.registry)
        self.errors = Counter("rft_operator_reconcile_errors", "Reconcile errors, by kind (transient: API "
                              "unavailable or throttled; apply: a child refused; unexpected: a bug)", ["kind"],
                              registry=self.registry)
        self.duration = Histogram("rft_operator_reconcile_duration_seconds", "Duration of one reconcile",
                                  buckets=DURATION_BUCKETS, registry=self.registry)
        self.jobs = Gauge("rft_operator_jobs", "RFTJobs by phase (from the last resync)", ["phase"],
                          registry=self.registry)
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        for result in ("ok", "error", "gone"):
            self.reconciles.labels(result=result)
        for kind in ("transient", "apply", "unexpected"):
            self.errors.labels(kind=kind)
        self._server: Any = None

    def set_phases(self, phases: Iterable[str]) -> None:
        """Set the jobs-by-phase gauge from the phases of every job seen (no status counts as Pending)."""
        counts = {p: 0 for p in PHASES}
        for p in phases:
            counts[p if p in counts else "Pending"] += 1
        for p, n in counts.items():
            self.jobs.labels(phase=p).set(n)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``addr:port`` (port 0: any free port); returns the bound port."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
