"""Reading the fields the coordinator needs from an episode in its JSON form.

The coordinator never builds episodes; it only checks and stores what rollout workers post. An
episode (rLLM's shape, see :mod:`rft_runtime.rollout.episodes`) is a JSON object with at least::

    {"id": "<task_key>:<rollout_idx>", "task_id": "<task_key>", "rollout_idx": 0,
     "trajectories": [{"name": "default", "reward": 1.0, "steps": [{"policy_version": 3, ...}]}], ...}

:func:`validate_episode` checks a posted episode against :class:`rft_runtime.types.Episode` (the
token contract: lengths, masks, logprobs, ids) and returns its normalised JSON form. The other
functions are the one place that knows the field names the coordinator reads.
"""

from __future__ import annotations

from typing import Any, Mapping


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


def episode_versions(ep: Mapping[str, Any]) -> list[int | None]:
    """The policy version of every step of every trajectory (None where a step has none)."""
    trajs = _require(ep, "trajectories", list)
    out: list[int | None] = []
    for i, t in enumerate(trajs):
        if not isinstance(t, Mapping) or not isinstance(t.get("steps"), list):
            raise EpisodeFormatError(f"episode field 'trajectories[{i}].steps' is missing")
        for s in t["steps"]:
            v = s.get("policy_version", s.get("weight_version")) if isinstance(s, Mapping) else None
            out.append(v if isinstance(v, int) and not isinstance(v, bool) else None)
    return out


def episode_version(ep: Mapping[str, Any], default: int | None = None) -> int | None:
    """The OLDEST policy version that produced any step of the episode (its staleness is judged
    by it); steps without a version count as ``default``."""
    vs = [default if v is None else v for v in episode_versions(ep)]
    known = [v for v in vs if v is not None]
    return min(known) if known else default


def parse_episode(ep: Mapping[str, Any]) -> Any:
    """The episode as a :class:`rft_runtime.types.Episode` (the token contract is checked);
    raises :class:`EpisodeFormatError` naming the first problem."""
    from pydantic import ValidationError

    from ..types import Episode

    try:
        return Episode.model_validate(dict(ep))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise EpisodeFormatError(f"episode {ep.get('id')!r}: {where}: {first.get('msg')}"
                                 + (f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else "")) from None


def validate_episode(ep: Mapping[str, Any]) -> dict[str, Any]:
    """The episode checked against the shared type and normalised to its JSON form."""
    return parse_episode(ep).model_dump(mode="json")


def episode_reward(ep: Mapping[str, Any]) -> float | None:
    """The episode's reward: its main trajectory's (``default``, else the first)."""
    trajs = ep.get("trajectories") or []
    if not trajs:
        return ep.get("reward")
    main = next((t for t in trajs if t.get("name") == "default"), trajs[0])
    r = main.get("reward")
    return ep.get("reward") if r is None else r
