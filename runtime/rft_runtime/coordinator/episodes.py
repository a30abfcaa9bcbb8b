"""Posted episodes at the coordinator's boundary: triage of the raw JSON, then one typed parse.

The coordinator never builds episodes; it checks what rollout workers post. An episode (rLLM's shape,
see :mod:`rft_runtime.rollout.episodes`) is a JSON object with at least::

    {"id": "<task_key>:<rollout_idx>", "task_id": "<task_key>", "rollout_idx": 0,
     "trajectories": [{"name": "default", "reward": 1.0, "steps": [{"policy_version": 3, ...}]}], ...}

:func:`episode_id`, :func:`episode_task_key` and :func:`episode_rollout_idx` read the three fields
that decide where a post belongs (before the full check); :func:`parse_episode` checks the whole
episode against :class:`rft_runtime.types.Episode` (the token contract: lengths, masks, logprobs,
ids). From then on the coordinator and the trainer hold the typed ``Episode``.
"""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import ValidationError

from ..types import Episode


class EpisodeFormatError(ValueError):
    """A posted episode lacks a field the coordinator needs; the message names the field."""


def _require(ep: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(ep, Mapping):
        raise EpisodeFormatError(f"episode must be a JSON object, got {type(ep).__name__}")
    if name not in ep:
        raise EpisodeFormatError(f"episode field {name!r} is missing")
    v = ep[name]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise EpisodeFormatError(f"episode field {name!r} has type {type(v).__name__}")
    return v


def episode_id(ep: Mapping[str, Any]) -> str:
    """The episode id (the idempotency key of posting)."""
    v = _require(ep, "id", str)
    if not v:
        raise EpisodeFormatError("episode field 'id' is empty")
    return v


def episode_task_key(ep: Mapping[str, Any]) -> str:
    """The task key the episode belongs to (its ``task_id``)."""
    return _require(ep, "task_id", str)


def episode_rollout_idx(ep: Mapping[str, Any]) -> int:
    """The sample index within its group (``rollout_idx``)."""
    return _require(ep, "rollout_idx", int)


def parse_episode(ep: Mapping[str, Any]) -> Episode:
    """The episode as a :class:`rft_runtime.types.Episode` (the token contract is checked);
    raises :class:`EpisodeFormatError` naming the first problem."""
    try:
        episode = Episode.model_validate(dict(ep))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise EpisodeFormatError(f"episode {ep.get('id')!r}: {where}: {first.get('msg')}"
                                 + (f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else "")) from None
    for t, traj in enumerate(episode.trajectories):  # the token contract: every sample names its policy
        for i, step in enumerate(traj.steps):
            if step.policy_version is None:
                raise EpisodeFormatError(f"episode {episode.id!r}: trajectories.{t}.steps.{i}.policy_version is "
                                         "required (the version of the weights that sampled it)")
    return episode


def episode_version(ep: Episode, default: int | None = None) -> int | None:
    """The OLDEST policy version that produced any step of the episode (its staleness is judged
    by it); steps without a version count as ``default``."""
    vs = [default if s.policy_version is None else s.policy_version for t in ep.trajectories for s in t.steps]
    known = [v for v in vs if v is not None]
    return min(known) if known else default
