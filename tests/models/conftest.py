"""Fixtures for the tests that run the project's code on real pretrained models (tests/support/models.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tests.support.models import ModelBuildError, smollm2_dir  # noqa: E402


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The SmolLM2-135M-Instruct model directory (built once into the cache by hack/smollm2.sh; a failed
    build fails the tests that need it, with the build's output)."""
    try:
        return smollm2_dir()
    except ModelBuildError as e:
        pytest.fail(str(e), pytrace=False)
