"""Episodes → training tensors: shapes, masks, multi-turn merging, contract violations."""

from __future__ import annotations

import pytest
import torch

from rft_runtime.coordinator.episodes import EpisodeFormatError, parse_episode
from rft_runtime.trainer.batch import BatchError, collate, sequences_from_episode, sequences_from_groups


def test_single_turn_sequences_and_masks(groups):
    seqs = sequences_from_groups(groups(2, 4))
    assert len(seqs) == 8
    assert seqs[0].group == "t0@0:default" and seqs[4].group == "t1@1:default"
    b = collate(seqs, pad_id=0)
    assert b.input_ids.shape[0] == 8 and b.loss_mask.shape == (8, b.input_ids.shape[1] - 1)
    for i, s in enumerate(seqs):
        p, r = len(s.prompt_ids), len(s.response_ids)
        # position p-1 predicts the first response token
        assert b.loss_mask[i].nonzero().flatten().tolist() == list(range(p - 1, p - 1 + r))
        assert b.targets[i, p - 1 : p - 1 + r].tolist() == s.response_ids
        assert torch.allclose(b.inference_logprobs[i, p - 1 : p - 1 + r], torch.tensor(s.inference_logprobs))
        assert int(b.attention_mask[i].sum()) == p + r
    sub = b.select([1, 3])
    assert sub.input_ids.shape[1] == int(b.lengths[[1, 3]].max())


def test_multi_turn_merge_masks_environment_tokens(episode):
    ep = episode("t@0", 0, reward=1.0, steps=2, resp_len=3)
    (s,) = sequences_from_episode(ep, "t@0")
    assert s.response_mask == [1, 1, 1, 0, 0, 1, 1, 1]
    assert s.model_tokens == 6
    assert s.inference_logprobs[3:5] == [0.0, 0.0]


def test_none_reward_and_version_are_kept(episode):
    ep = episode("t@0", 0, reward=None, version=3)
    (s,) = sequences_from_episode(ep, "t@0")
    assert s.reward is None and s.version == 3


def test_contract_violations_name_the_episode():
    from tests.trainer.conftest import episode_json

    ep = episode_json("t@0", 0, reward=1.0)
    ep["trajectories"][0]["steps"][0]["logprobs"].pop()
    with pytest.raises(EpisodeFormatError, match="t@0:0.*logprobs"):  # refused where it is posted
        parse_episode(ep)
    ep = episode_json("t@0", 2, reward=1.0)
    ep["trajectories"][0]["steps"][0]["response_mask"][0] = 2
    with pytest.raises(EpisodeFormatError, match="response_mask"):
        parse_episode(ep)
    ep = episode_json("t@0", 1, reward=1.0, steps=2)
    ep["trajectories"][0]["steps"][1]["prompt_ids"][0] += 1
    # a turn whose prompt does not extend the previous turn (re-tokenised, or a separate call) is a sample of
    # its own (step-wise): nothing the model did not see is merged (tests/trainer/test_stepwise.py)
    assert [s.trajectory_step for s in sequences_from_episode(parse_episode(ep), "t@0")] == [0, 1]
    with pytest.raises(BatchError, match="zero sequences"):
        collate([])
