"""Fixtures for the operator's unit tests (no cluster)."""
from __future__ import annotations

import pytest

from rft_api.job import RFTJob
from tests.operator.support import make_job


@pytest.fixture
def tiny_job() -> RFTJob:
    return make_job()
