"""Fixtures shared with the trainer tests (a random tiny model)."""

from tests.trainer.conftest import tiny_model_dir  # noqa: F401
