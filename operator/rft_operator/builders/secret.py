"""The job's data-plane token: Secret ``<job>-token`` (key ``token``).

Every pod of the job reads it by reference (``$RFT_JOB_TOKEN``, see ``common.base_env``; vLLM as
``VLLM_API_KEY``). The reconcile creates the Secret once, with a fresh random token, when the job has
none, and never applies it again: a re-reconcile, an operator restart or an edit of the job never
rotates it (the Secret is immutable). It goes with the job (owner reference). Pure: the token is an
argument; this module draws nothing.
"""
from __future__ import annotations

import base64
from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import JOB_TOKEN_SECRET_KEY

from .. import names
from .common import metadata

Obj = dict[str, Any]
ROLE = "token"


def token_secret(job: RFTJob, token: str) -> Obj:
    """The Secret carrying ``token`` (opaque, immutable, owned by the job)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": metadata(job, names.token(job.name), ROLE),
        "data": {JOB_TOKEN_SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }
