"""Shared helpers of the runtime attack tests (tests/security/test_episodes.py, test_sandbox_escape.py,
test_judge.py, test_serve_limits.py): builders of honest and forged requests. Not a conftest: the
directory is shared with other suites."""

from __future__ import annotations

from typing import Any


def episode(task_key: str, idx: int, *, version: int = 0, reward: Any = 1.0, prompt: list[int] | None = None,
            response: list[int] | None = None) -> dict[str, Any]:
    """An episode as a rollout worker posts it (JSON form); every field can be poisoned."""
    resp = [3] if response is None else response
    return {
        "id": f"{task_key}:{idx}",
        "task_id": task_key,
        "rollout_idx": idx,
        "trajectories": [{"name": "default", "reward": reward, "steps": [{
            "prompt_ids": [1, 2] if prompt is None else prompt, "response_ids": resp,
            "logprobs": [-0.5] * len(resp), "response_mask": [1] * len(resp),
            "finish_reason": "stop", "policy_version": version}]}],
    }


def tasks(k: int) -> list[dict[str, Any]]:
    """``k`` tasks in ``Task.to_dict()`` form, each with a secret ground truth."""
    return [{"task_id": f"t{i}", "prompt": f"q{i}", "ground_truth": f"secret-{i}"} for i in range(k)]
