"""Helpers for the operator tests: jobs with deterministic metadata (no cluster)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from rft_api.job import RFTJob, parse_manifest
from rft_api.status import RFTJobStatus

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "01-tiny-arith.yaml"
GOLDEN_INPUTS = Path(__file__).parent / "golden" / "inputs"
FIXED_UID = "00000000-0000-4000-8000-000000000001"


def manifest(path: Path = EXAMPLE, **spec_patch: Any) -> dict:
    """A manifest from a YAML file with top-level spec keys replaced."""
    doc = yaml.safe_load(path.read_text())
    doc = copy.deepcopy(doc)
    doc["spec"].update(spec_patch)
    return doc


def make_job(doc: Optional[dict] = None, *, namespace: str = "default", generation: int = 1,
             status: Optional[RFTJobStatus] = None, **spec_patch: Any) -> RFTJob:
    """A parsed RFTJob with deterministic metadata (uid, namespace, generation)."""
    doc = copy.deepcopy(doc) if doc is not None else manifest()
    doc["spec"].update(spec_patch)
    job = parse_manifest(doc)
    job.metadata.setdefault("namespace", namespace)
    job.metadata["uid"] = FIXED_UID
    job.metadata["generation"] = generation
    job.status = status
    return job


# ------------------------------------------------------------------------------------ observations
import datetime as dt  # noqa: E402

from rft_api.progress import Progress  # noqa: E402
from rft_operator.observe import Observed, TrainerObs, WorkloadObs  # noqa: E402

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    """T0 + seconds."""
    return T0 + dt.timedelta(seconds=seconds)


def trainer_obs(*, attempt: int = 0, ready: int = 0, active: int = 0, complete: bool = False,
                failed: bool = False, desired: int = 1, terminating: bool = False) -> TrainerObs:
    return TrainerObs(name="tiny-arith-trainer", attempt=attempt, desired=desired, active=active, ready=ready,
                      complete=complete, failed_condition=failed, reason="BackoffLimitExceeded" if failed else "",
                      message="Job has reached the specified backoff limit" if failed else "",
                      terminating=terminating)


def observed(now: dt.datetime = T0, *, inference: int | None = None, rollout: int | None = None,
             reward: int | None = None, trainer: TrainerObs | None = None, progress: Progress | None = None,
             progress_error: str | None = None, children: bool = True) -> Observed:
    """An observation: ``inference=1`` means the inference Deployment exists with 1 ready replica."""
    workloads = {}
    for role, ready in (("inference", inference), ("rollout", rollout), ("reward", reward)):
        if ready is not None:
            workloads[role] = WorkloadObs(name=f"tiny-arith-{role}", desired=1, ready=ready)
    kids = {("ConfigMap", "tiny-arith-config")} if children else set()
    kids |= {("Deployment", w.name) for w in workloads.values()}
    if trainer is not None:
        kids.add(("Job", trainer.name))
    return Observed(now=now, workloads=workloads, trainer=trainer, progress=progress,
                    progress_error=progress_error, children=frozenset(kids))
