"""The job's data-plane token: Secret ``<job>-token`` (key ``token``).

Every pod of the job reads it by reference (``$RFT_JOB_TOKEN``, see ``common.base_env``; vLLM as
``VLLM_API_KEY``). The reconcile creates the Secret once, with a fresh random token, when the job has
none, and never applies it again: a re-reconcile, an operator restart or an edit of the job never
rotates it (the Secret is immutable). It goes with the job (owner reference). Pure: the token is an
argument; this module draws nothing.

The Secret carries ``rft.dev/token-digest`` (:func:`token_digest`, a hash, never the token), which
every role's pod template carries too: when the Secret is missing while the job runs (deleted by
hand), the reconcile mints a new token and the new digest restarts every role with it, so the pods of
a job never hold two tokens.
"""
from __future__ import annotations

import base64
import hashlib
from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import JOB_TOKEN_SECRET_KEY

from .. import names
from .common import metadata

Obj = dict[str, Any]
ROLE = "token"
DIGEST_LEN = 16
"""Hex digits of the token's SHA-256 kept as its digest: enough to tell two random tokens apart, far
too few (and one-way) to tell anything of the token."""


def token_digest(token: str) -> str:
    """The digest that names ``token`` on its Secret and on the pod templates."""
    return hashlib.sha256(b"rft-job-token:" + token.encode()).hexdigest()[:DIGEST_LEN]


def token_secret(job: RFTJob, token: str) -> Obj:
    """The Secret carrying ``token`` (opaque, immutable, owned by the job) and its digest."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": metadata(job, names.token(job.name), ROLE, {names.ANNOTATION_TOKEN_DIGEST: token_digest(token)}),
        "data": {JOB_TOKEN_SECRET_KEY: base64.b64encode(token.encode()).decode()},
    }
