"""Fixtures for the storage tests: ``s3_server``, a real S3-compatible server (SeaweedFS, see
:mod:`tests.support.s3server`) shared by the session, each test using buckets of its own.

When ``weed`` is not built yet, hack/seaweedfs.sh builds it (or a background ``hack/prepare.sh`` is
waited for) before the first test that needs it, outside its timeout (:mod:`tests.support.prereqs`);
a failed build fails those tests with the build's output, without building again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import prereqs
from tests.support.s3server import S3Server, weed_binary

_WEED = prereqs.register("weed (hack/seaweedfs.sh)", rank=3, wanted=prereqs.uses_fixture("s3_server"),
                         build=weed_binary)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A running SeaweedFS S3 server on 127.0.0.1 whose bucket ``public`` may be read without signing."""
    with S3Server(public_buckets=("public",), weed=_WEED.get()) as server:
        yield server
