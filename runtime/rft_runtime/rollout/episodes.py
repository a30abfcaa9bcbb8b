"""Episodes (`rft_runtime.types`: rLLM's Episode / Trajectory / Step) from recorded rollouts.

One Step per sampled assistant turn: `prompt_ids` is the full context the engine saw, `response_ids`
the sampled ids, `logprobs` their inference logprobs, `response_mask` all ones, `messages` the chat
history that produced the prompt. In a multi-turn trajectory each step's prompt extends the previous
step's prompt + response (the environment's tokens fill the gap); `Trajectory.merged()` turns the
chain into one sequence with a response mask (1 = sampled, 0 = tool/environment), the form the
trainer trains on. The reward goes on every trajectory and on each trajectory's last step.
"""

from __future__ import annotations

from typing import Any, Sequence

from rft_runtime.types import Episode, ErrorFlags, Step, TerminationReason, Trajectory, episode_id

from .errors import TokenContractError
from .recorder import RecordedSample, RecordedTrajectory

__all__ = ["build_episode", "episode_id", "episode_json"]


def build_episode(
    task_id: str,
    rollout_idx: int,
    trajectories: Sequence[RecordedTrajectory],
    *,
    reward: float | None,
    reason: str | None = None,
    errors: ErrorFlags | None = None,
    termination_reason: TerminationReason | None = None,
    metrics: dict[str, float] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Episode:
    """An `Episode` `"{task_id}:{rollout_idx}"` from the recorder's trajectories."""
    trajs = [
        Trajectory(name=rt.name, steps=[_step(rec, reward, k == len(rt.samples) - 1) for k, rec in enumerate(rt.samples)],
                   reward=reward)
        for rt in trajectories
    ]
    return Episode(
        id=episode_id(task_id, rollout_idx),
        task_id=task_id,
        rollout_idx=rollout_idx,
        trajectories=trajs,
        reward_reason=reason,
        metrics=dict(metrics or {}),
        termination_reason=termination_reason,
        errors=errors or ErrorFlags(),
        metadata=dict(metadata or {}),
    )


def episode_json(episode: Episode) -> dict[str, Any]:
    """The JSON form posted to the coordinator (`Episode.model_validate` reads it back)."""
    return episode.model_dump(mode="json")


def _step(rec: RecordedSample, reward: float | None, last: bool) -> Step:
    s = rec.sample
    if s.policy_version is None:
        raise TokenContractError(
            "sample has no policy version: the engine did not report one and the caller passed none"
        )
    return Step(
        prompt_ids=list(s.prompt_ids),
        response_ids=list(s.completion_ids),
        logprobs=list(s.logprobs),
        response_mask=[1] * len(s.completion_ids),
        policy_version=s.policy_version,
        reward=reward if last else None,
        done=last,
        finish_reason=s.finish_reason,
        truncated=s.truncated,
        messages=[dict(m) for m in rec.conversation.messages[:-1]],
        response_text=rec.message.get("content") or "",
        metadata={"seed": s.seed, "server": s.server, **s.metadata,
                  **({"tool_calls": rec.message["tool_calls"]} if rec.message.get("tool_calls") else {})},
    )
