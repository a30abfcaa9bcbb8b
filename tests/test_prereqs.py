"""tests/support/prereqs.py: a prerequisite is built once, before the first test that needs it; a failed
build fails every test that needs it with the build's message and is not built again; tests are ordered
by what they need."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.prereqs import Prerequisite, uses_fixture


def _item(*fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(fixturenames=list(fixtures))


def test_a_failed_build_runs_once_and_fails_each_test_that_needs_it() -> None:
    calls = []

    def build() -> str:
        calls.append(1)
        raise RuntimeError("hack/x.sh failed (exit 2): no go")

    p = Prerequisite("x", 1, uses_fixture("x"), build)
    for _ in range(3):
        with pytest.raises(pytest.fail.Exception, match=r"x: not built again in this run: hack/x.sh failed \(exit 2\): no go"):
            p.get()
    assert calls == [1]


def test_a_built_prerequisite_is_returned_without_building_again() -> None:
    calls = []
    p = Prerequisite("y", 1, uses_fixture("y"), lambda: calls.append(1) or "/cache/y")
    assert p.get() == "/cache/y" and p.get() == "/cache/y"
    assert calls == [1]


def test_wanted_by_fixture_name() -> None:
    wanted = uses_fixture("s3_server", "other")
    assert wanted(_item("tmp_path", "s3_server"))
    assert not wanted(_item("tmp_path"))
