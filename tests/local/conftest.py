"""Fixtures for `rft run` tests: manifests derived from the tiny example, and running the CLI.

Runs use the builtin tiny model from the model cache (built once, ~2 min, on first use) and real
local Ray. Sizes are small so that each run stays around a minute on 2 cores.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.support.polling import wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "01-tiny-arith.yaml"

# A short, learnable variant of the example: 8 fixed arithmetic tasks, 8 samples each, every
# task seen every step, a learning rate that moves the tiny model within a dozen steps.
SHORT_SPEC: dict[str, Any] = {
    "dataset": {"train": {"builtin": "arithmetic", "size": 8, "seed": 0}},
    "rollout": {"samplesPerPrompt": 8, "promptsPerStep": 8, "temperature": 1.0, "maxTokens": 8,
                "concurrency": 64},
    "trainer": {"algorithm": "grpo", "learningRate": 2.0e-3, "maxSteps": 12, "seed": 0},
    "checkpoint": {"everySteps": 2, "keepLast": 2},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def write_manifest(path: Path, name: str = "tiny-test", **spec_overrides: Any) -> Path:
    """The example manifest with :data:`SHORT_SPEC` and ``spec_overrides`` merged in."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"] = _merge(_merge(doc["spec"], SHORT_SPEC), spec_overrides)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rft_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONUNBUFFERED": "1"})
    return env


def start_rft(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``rft <args>`` in its own session (so the test can signal it and its Ray children)."""
    f = open(log, "ab")
    return subprocess.Popen([sys.executable, "-m", "rft_runtime.cli", *args], cwd=REPO, env=rft_env(),
                            stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def run_rft(args: list[str], log: Path, timeout: float = 600) -> int:
    """Run ``rft <args>`` to completion; returns its exit status (output appended to ``log``)."""
    p = start_rft(args, log)
    try:
        return p.wait(timeout)
    finally:
        kill_session(p)


def kill_session(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Kill what is left of the process's session (the CLI and the Ray processes it started)."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        pass


def read_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


STEP_POLL_S = 0.1
"""How often ``rft.wait`` polls: steps take a few tenths of a second, a slower poll can miss the one to act on."""


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Build (or find in the cache) the builtin tiny model once per session, outside test timeouts
    of individual runs."""
    from rft_runtime.model import resolve_builtin_model

    return resolve_builtin_model("builtin:tiny")


@pytest.fixture
def manifest(tmp_path: Path) -> Callable[..., Path]:
    """``manifest(**spec_overrides)`` writes a short manifest into the test's directory."""
    def make(name: str = "tiny-test", **over: Any) -> Path:
        return write_manifest(tmp_path / f"{name}.yaml", name, **over)
    return make


@pytest.fixture
def rft() -> Any:
    """Helpers to run the CLI: ``start``, ``run``, ``kill_session``, ``read_rows``, and ``wait``
    (:func:`tests.support.polling.wait_for` polling every :data:`STEP_POLL_S`)."""
    class Helpers:
        start = staticmethod(start_rft)
        run = staticmethod(run_rft)
        kill = staticmethod(kill_session)
        rows = staticmethod(read_rows)
        wait = staticmethod(functools.partial(wait_for, interval=STEP_POLL_S))
    return Helpers
