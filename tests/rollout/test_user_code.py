"""Which rollout workers run the job's own code, and so load their tokenizer with torch visible
(`rft_runtime.rollout.loop.runs_user_code`); the others load it without importing torch
(`tests/local/test_roles.py` checks that process, `tests/serve/test_http_api.py` the inference
front end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft_api.job import validate_spec
from rft_runtime.rollout.loop import runs_user_code
from tests.support.runtime_config import local_config

FILE = {"file": {"configMapKeyRef": {"name": "ev", "key": "ev.py"}}}
BUNDLE = {"bundle": {"image": "registry.example/bundle:1", "entrypoint": "ev:score"}}


def _cfg(tmp_path: Path, evaluator: dict, *, remote: bool) -> object:
    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": evaluator})
    return local_config("u", spec, inference=["http://127.0.0.1:1"], checkpoints=tmp_path / "c",
                        output=tmp_path / "o", reward="http://127.0.0.1:2" if remote else None)


@pytest.mark.parametrize("evaluator, remote, expected", [
    ({"builtin": "math"}, False, False),
    ({"builtin": "math"}, True, False),
    (FILE, False, True),  # scored in the rollout worker
    (FILE, True, False),  # scored by the reward role
    ({"file": {**FILE["file"], "rollout": "rollout"}}, True, True),  # its rollout runs here all the same
    (BUNDLE, False, True),
    ({"bundle": {**BUNDLE["bundle"], "rollout": "ev:rollout"}}, True, True),
    ({"evaluators": [{"builtin": "math"}, {"evalProtocol": {"entrypoint": "evals.arith"}}]}, False, True),
    ({"evaluators": [{"builtin": "math"}, {"builtin": "regex", "config": {"pattern": "x"}}]}, False, False),
], ids=["builtin", "builtin-remote", "file", "file-remote", "file-rollout-remote", "bundle", "bundle-rollout-remote",
        "eval-protocol-in-a-list", "builtins-in-a-list"])
def test_which_rollout_workers_run_the_jobs_own_code(tmp_path, evaluator, remote, expected):
    assert runs_user_code(_cfg(tmp_path, evaluator, remote=remote)) is expected
