"""Fixtures for the storage tests: ``s3_server``, a real S3-compatible server (SeaweedFS, see
:mod:`tests.support.s3server`) shared by the session, each test using buckets of its own.

When a collected test needs it and ``weed`` is not built yet, hack/seaweedfs.sh builds it before the
first test runs, so no per-test timeout cuts the build short; a failed build fails those tests with
the build's output."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.s3server import S3Server, WeedBuildError, weed_binary

_weed: Path | WeedBuildError | None = None


def _needs_s3(item: pytest.Item) -> bool:
    return "s3_server" in getattr(item, "fixturenames", ())


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build (or find) ``weed`` once, before any test, when a collected test uses ``s3_server``."""
    global _weed
    if _weed is None and any(_needs_s3(item) for item in session.items):
        try:
            _weed = weed_binary()
        except WeedBuildError as e:
            _weed = e


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A running SeaweedFS S3 server on 127.0.0.1 whose bucket ``public`` may be read without signing."""
    weed = _weed if _weed is not None else weed_binary()
    if isinstance(weed, WeedBuildError):
        pytest.fail(str(weed))
    with S3Server(public_buckets=("public",), weed=weed) as server:
        yield server
