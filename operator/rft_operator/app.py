"""Running the operator: kopf (with our settings and registry), the periodic resync and the metrics server.

``run`` is a coroutine so tests can run the operator in-process and stop it with ``stop_flag``.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import kopf

from .controller import Controller
from .handlers import build_registry, child_label_selectors
from .kube import Kube
from .metrics import Metrics

log = logging.getLogger(__name__)
KOPF_PREFIX = "rft.dev"


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: Optional[str] = None
    """Kubeconfig file; in-cluster credentials (or ``$KUBECONFIG``) when unset."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; all when empty."""
    metrics_port: Optional[int] = 8080
    """Port of ``/metrics`` (0: any free port; None: no metrics server)."""
    metrics_addr: str = "0.0.0.0"
    resync_seconds: float = 10.0
    """Period of the level-triggered resync of every job."""
    health_port: Optional[int] = None
    """Port of kopf's liveness endpoint ``/healthz`` (None: none)."""


def make_settings(resync_seconds: float = 10.0) -> kopf.OperatorSettings:
    """kopf settings: its bookkeeping in annotations (the structural schema would prune it from status),
    standalone (one replica, no peering objects), only warnings posted as k8s Events, server-side label
    selectors on the child watches, no CRD/namespace scanning (fewer permissions)."""
    s = kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_PREFIX)
    s.peering.standalone = True
    s.posting.level = logging.WARNING
    s.scanning.disabled = True
    s.watching.server_timeout = 60
    s.watching.client_timeout = 90
    s.execution.max_workers = 8
    for key, selector in child_label_selectors().items():
        s.watching.label_selectors[key] = selector
    return s


async def run(config: OperatorConfig, *, stop_flag: Any = None, ready_flag: Any = None,
              before_apply: Optional[Callable[[dict[str, Any]], None]] = None,
              on_started: Optional[Callable[[Controller, Metrics, Optional[int]], None]] = None) -> None:
    """Run until ``stop_flag`` is set (or forever). ``on_started`` receives the controller, the
    metrics and the bound metrics port (tests use it)."""
    api = Kube.from_kubeconfig(config.kubeconfig)
    metrics = Metrics()
    controller = Controller(api, metrics, namespaces=config.namespaces, resync_seconds=config.resync_seconds,
                            before_apply=before_apply)
    port = metrics.serve(config.metrics_port, config.metrics_addr) if config.metrics_port is not None else None
    if port is not None:
        log.info("metrics on %s:%d/metrics", config.metrics_addr, port)
    if on_started is not None:
        on_started(controller, metrics, port)
    resync = asyncio.get_running_loop().create_task(controller.resync_forever())
    try:
        await kopf.operator(
            registry=build_registry(controller), settings=make_settings(config.resync_seconds),
            standalone=True, clusterwide=not config.namespaces, namespaces=list(config.namespaces),
            stop_flag=stop_flag, ready_flag=ready_flag,
            liveness_endpoint=(f"http://{config.metrics_addr}:{config.health_port}/healthz"
                               if config.health_port is not None else None))
    finally:
        resync.cancel()
        await asyncio.gather(resync, return_exceptions=True)
        await controller.close()
        metrics.close()
        api.close()
