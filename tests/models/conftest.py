"""Fixtures for the tests that run the project's code on real pretrained models (tests/support/models.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from tests.support import prereqs  # noqa: E402
from tests.support.models import smollm2_dir  # noqa: E402

_SMOLLM2 = prereqs.register("SmolLM2-135M-Instruct (hack/smollm2.sh)", rank=1,
                            wanted=prereqs.uses_fixture("smollm2"), build=smollm2_dir)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The SmolLM2-135M-Instruct model directory (built once into the cache by hack/smollm2.sh, before
    the first test that needs it, outside its timeout; a failed build fails the tests that need it, with
    the build's output)."""
    return _SMOLLM2.get()
