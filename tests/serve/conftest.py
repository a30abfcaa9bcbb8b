"""Fixtures for the builtin inference server tests: the tiny model, real servers on free ports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.serve.support import TINY, ServerThread, start_server


@pytest.fixture(scope="session")
def server() -> ServerThread:
    """A shared server over the tiny fixture model (its weights are never changed)."""
    s = start_server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def ref_model():
    """The tiny model loaded independently with transformers (float32), for recomputing logprobs."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32, local_files_only=True)
    return m.eval()


@pytest.fixture()
def model_copy(tmp_path: Path) -> Path:
    """A writable copy of the tiny model directory."""
    dst = tmp_path / "tiny"
    shutil.copytree(TINY, dst)
    return dst
