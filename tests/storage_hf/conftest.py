"""Fixtures for the Hugging Face Hub tests: ``hub_server``, a real Hub-compatible server (olah, see
:mod:`tests.support.hubserver`) on loopback, one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hubserver import HubServer


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """olah serving the repositories a test adds (``add_model_repo``, ``add_dataset_repo``), stopped after
    the module's last test."""
    with HubServer(tmp_path_factory.mktemp("hub")) as hub:
        yield hub
