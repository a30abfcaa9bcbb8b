"""Fixtures for the runtime tests (tiny model builds are session-scoped: built once per run)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_random_dir(tmp_path_factory):
    """A freshly built random-weight tiny model (seed 0)."""
    from rft_runtime.model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-random") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_model_cache(tmp_path_factory):
    """A per-session cache directory for ``resolve_builtin_model``."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def builtin_tiny_dir(tiny_model_cache):
    """``builtin:tiny`` (warm-started) built from scratch in this session's cache."""
    from rft_runtime.model import resolve_builtin_model

    return resolve_builtin_model("builtin:tiny", tiny_model_cache)
