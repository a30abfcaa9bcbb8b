"""From groups of episodes (typed :class:`rft_runtime.types.Episode`, checked by the coordinator) to
padded training tensors.

One training sequence per trajectory: its steps are merged into one token sequence (the first
step's prompt, then every step's response; environment/tool tokens between turns get response
mask 0 and are not trained on). A step-wise trajectory, whose calls do not continue each other,
gives one sequence per chain of calls, all with the trajectory's reward, group and advantage.
The reward of a sequence is its trajectory's; ``None`` (not applicable) stays None (NaN in
tensors) and is excluded from baselines.
Advantage groups are keyed ``"{task_key}:{trajectory.name}"``.

Tensors are right-padded with the pad id; per-token tensors have width ``L - 1`` where position
``t`` is the prediction of ``input_ids[:, t + 1]``.

Defence in depth (the coordinator refuses these at its boundary): :func:`sequences_from_groups`
drops, with a logged reason, an episode whose reward is not finite, whose token ids lie outside the
vocabulary or whose length exceeds the model's, instead of letting it crash the step;
:func:`collate` refuses out-of-vocabulary ids with :class:`BatchError` before building tensors.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

from ..algos import group_key
from ..types import Episode

ERROR_FLAGS = ("timeout", "runtime_error", "parse_error", "rollout_error")

log = logging.getLogger(__name__)


class BatchError(ValueError):
    """An episode violates the token contract; the message names the episode and field."""


@dataclass
class TrainSequence:
    """One trajectory flattened for training."""

    group: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    inference_logprobs: list[float]
    reward: float | None
    version: int | None
    truncated: bool
    episode_id: str
    error: str | None = None
    error_flags: dict[str, bool] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    domain: str = "default"
    """The task's domain (the episode's ``metadata.domain``), for per-domain reward statistics."""
    trajectory_step: int = 0
    """0 for a trajectory's first sample; ``k > 0`` for the ``k``-th further sample of a step-wise
    trajectory (:meth:`rft_runtime.types.Trajectory.segments`), which follows it and shares its advantage."""

    @property
    def model_tokens(self) -> int:
        """Tokens the policy generated (mask 1)."""
        return int(sum(self.response_mask))


def sequences_from_episode(episode: Episode, task_key: str | None = None) -> list[TrainSequence]:
    """The training sequences of one episode: one per trajectory (its turns merged into one masked
    sequence), or, for a step-wise trajectory whose calls do not continue each other, one per chain
    of calls (:meth:`rft_runtime.types.Trajectory.segments`), in order, sharing the trajectory's
    reward and group (``trajectory_step`` > 0 marks the later ones)."""
    eid = episode.id
    key = task_key or episode.task_id
    out: list[TrainSequence] = []
    for i, traj in enumerate(episode.trajectories):
        try:
            segments = traj.segments()
        except ValueError as e:
            raise BatchError(f"episode {eid} trajectories[{i}]: {e}") from None
        if traj.reward is not None and not math.isfinite(traj.reward):
            raise BatchError(f"episode {eid} trajectories[{i}]: reward must be finite or null")
        out.extend(TrainSequence(
            group=group_key(key, traj.name), prompt_ids=list(m.prompt_ids), response_ids=list(m.response_ids),
            response_mask=list(m.response_mask), inference_logprobs=list(m.logprobs), reward=traj.reward,
            version=m.policy_version, truncated=m.truncated, episode_id=episode.id,
            error=episode.errors.message if episode.errors.any else None,
            error_flags={k: bool(getattr(episode.errors, k)) for k in ERROR_FLAGS},
            metrics=dict(episode.metrics), domain=str(episode.metadata.get("domain") or "default"),
            trajectory_step=j,
        ) for j, m in enumerate(segments))
    return out


def _poison(s: TrainSequence, vocab_size: int | None, max_len: int | None) -> str | None:
    if vocab_size is not None:
        bad = next((t for t in (*s.prompt_ids, *s.response_ids) if t >= vocab_size), None)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (size {vocab_size})"
    n = len(s.prompt_ids) + len(s.response_ids)
    if max_len is not None and n > max_len:
        return f"{n} tokens exceed the model's {max_len}"
    return None


def sequences_from_groups(groups: Iterable[Any], *, vocab_size: int | None = None, max_len: int | None = None,
                          on_drop: Callable[[str], None] | None = None) -> list[TrainSequence]:
    """All sequences of groups (objects with ``key`` and ``episodes``), in group then index order.

    An episode that cannot be trained on (a BatchError, a non-finite reward, an id outside
    ``vocab_size``, more than ``max_len`` tokens) is dropped whole with its reason logged and
    handed to ``on_drop``; the rest of its group is kept.
    """
    out: list[TrainSequence] = []
    for g in groups:
        for ep in g.episodes:
            try:
                seqs = sequences_from_episode(ep, g.key)
                problem = next((p for p in (_poison(s, vocab_size, max_len) for s in seqs) if p), None)
            except BatchError as e:
                problem = str(e)
            if problem is None:
                out.extend(seqs)
                continue
            reason = problem if problem.startswith(f"episode {ep.id}") else f"episode {ep.id}: {problem}"
            log.warning("dropping an episode the trainer cannot use: %s", reason)
            if on_drop is not None:
                on_drop(reason)
    return out


@dataclass
class TrainBatch:
    """Padded tensors of a list of sequences (see the module docstring for shapes)."""

    input_ids: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] long
    loss_mask: torch.Tensor  # [B, L-1] bool: targets that are model tokens
    inference_logprobs: torch.Tensor  # [B, L-1] float, 0 off-mask
    lengths: torch.Tensor  # [B] real tokens (prompt + response)
    response_lengths: torch.Tensor  # [B] model tokens
    prompt_lengths: torch.Tensor | None = None  # [B] tokens of each row's prompt (None: not known)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def targets(self) -> torch.Tensor:
        """[B, L-1]: the token each position predicts."""
        return self.input_ids[:, 1:]

    def select(self, idx: Sequence[int] | torch.Tensor) -> "TrainBatch":
        """Rows ``idx``, trimmed to their longest sequence."""
        idx_t = torch.as_tensor(list(idx) if not isinstance(idx, torch.Tensor) else idx, dtype=torch.long)
        width = int(self.lengths[idx_t].max()) if len(idx_t) else 1
        return TrainBatch(
            input_ids=self.input_ids[idx_t, :width],
            attention_mask=self.attention_mask[idx_t, :width],
            loss_mask=self.loss_mask[idx_t, : width - 1],
            inference_logprobs=self.inference_logprobs[idx_t, : width - 1],
            lengths=self.lengths[idx_t],
            response_lengths=self.response_lengths[idx_t],
            prompt_lengths=None if self.prompt_lengths is None else self.prompt_lengths[idx_t],
        )


def collate(seqs: Sequence[TrainSequence], pad_id: int = 0, max_len: int | None = None,
            vocab_size: int | None = None) -> TrainBatch:
    """Pad sequences into a :class:`TrainBatch`; ``max_len`` bounds prompt + response and
    ``vocab_size`` the token ids (both refused with :class:`BatchError`)."""
    if not seqs:
        raise BatchError("cannot build a batch from zero sequences")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in seqs]
    for s in seqs:
        if not s.prompt_ids:
            raise BatchError(f"episode {s.episode_id}: empty prompt_ids")
        problem = _poison(s, vocab_size, max_len)
        if problem:
            raise BatchError(f"episode {s.episode_id}: {problem}")
    width = max(lengths)
    b = len(seqs)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1), dtype=torch.bool)
    inf = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        attn[i, : p + r] = 1
        if r:
            mask[i, p - 1 : p - 1 + r] = torch.tensor(s.response_mask, dtype=torch.bool)
            inf[i, p - 1 : p - 1 + r] = torch.tensor(s.inference_logprobs, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids, attention_mask=attn, loss_mask=mask, inference_logprobs=inf,
        lengths=torch.tensor(lengths, dtype=torch.long),
        response_lengths=torch.tensor([s.model_tokens for s in seqs], dtype=torch.long),
        prompt_lengths=torch.tensor([len(s.prompt_ids) for s in seqs], dtype=torch.long),
    )
