"""The store settings of a job: ``spec.storage`` (endpoints, region, path style) and the credentials,
which come from the environment only (the operator sets them from the spec's secretKeyRefs)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from rft_api.layout import HF_TOKEN_ENV, S3_ACCESS_KEY_ENV, S3_SECRET_KEY_ENV
from rft_api.spec import StorageSpec

from .hf import HubSettings
from .s3 import S3Settings

_FALLBACKS = {S3_ACCESS_KEY_ENV: "AWS_ACCESS_KEY_ID", S3_SECRET_KEY_ENV: "AWS_SECRET_ACCESS_KEY",
              HF_TOKEN_ENV: "HF_TOKEN"}


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name) or environ.get(_FALLBACKS[name]) or ""
    return value.strip() or None


def s3_settings(storage: StorageSpec | None, environ: Mapping[str, str] | None = None) -> S3Settings:
    """How ``s3://`` URIs of the job are reached."""
    env = os.environ if environ is None else environ
    s3 = storage.s3 if storage is not None else None
    return S3Settings(endpoint=s3.endpoint if s3 else None, region=s3.region if s3 else "us-east-1",
                      path_style=s3.path_style if s3 else True,
                      access_key=_env(env, S3_ACCESS_KEY_ENV), secret_key=_env(env, S3_SECRET_KEY_ENV))


def hub_settings(storage: StorageSpec | None, environ: Mapping[str, str] | None = None) -> HubSettings:
    """How ``hf://`` URIs of the job are reached (the endpoint: the spec's, else ``HF_ENDPOINT``)."""
    env = os.environ if environ is None else environ
    hub = storage.hugging_face if storage is not None else None
    endpoint = (hub.endpoint if hub else None) or env.get("HF_ENDPOINT") or None
    return HubSettings(endpoint=endpoint, token=_env(env, HF_TOKEN_ENV))
