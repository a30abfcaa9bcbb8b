"""Inputs policy: a job whose model or datasets are hf:// or s3:// URIs starts its roles only once
its fetch Job (``builders.fetch``) completed; a fetch Job that failed fails the job (reason
FetchFailed, with ``rft fetch``'s message: the field, the URI and why), without spending the
trainer's restart budget. Condition ``InputsReady`` says where the fetch stands."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rft_api import layout
from rft_api.spec import RFTJobSpec

from ..observe import Observed
from .failure import Failure


@dataclass(frozen=True)
class InputsState:
    wanted: bool
    """The job has something to fetch."""
    ready: bool
    """Its roles may start (nothing to fetch, or the fetch completed)."""
    failure: Optional[Failure]
    condition: tuple[str, str, str]
    """``InputsReady``'s status, reason and message."""


def state(spec: RFTJobSpec, observed: Observed) -> InputsState:
    """Where the job's inputs stand, from its fetch Job and what the fetch pods said."""
    inputs = layout.inputs(spec, layout.inputs_dir())
    if not inputs:
        return InputsState(False, True, None, ("True", "NothingToFetch", "the job's model and datasets are read in place"))
    said = observed.fetch_messages[-1] if observed.fetch_messages else ""
    uris = ", ".join(i.uri for i in inputs)
    f = observed.fetch
    if f is None:
        return InputsState(True, False, None, ("False", "Fetching", f"fetching {uris}"))
    if f.complete:
        return InputsState(True, True, None, ("True", "Fetched", said or f"fetched {uris}"))
    if f.failed_condition:
        why = said or f"{f.reason}: {f.message}".strip(": ") or "the fetch Job failed"
        limit = "" if f.reason == "PodFailurePolicy" else f" (after {f.failed} attempts)"
        message = f"could not fetch the job's inputs{limit}: {why}"[:1024]
        return InputsState(True, False, Failure("FetchFailed", message), ("False", "FetchFailed", message))
    last = f"; the last attempt said: {said}" if f.failed and said else ""
    return InputsState(True, False, None, ("False", "Fetching", f"fetching {uris}{last}"[:1024]))
