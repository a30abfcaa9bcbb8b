"""rLLM-style step-wise trajectories: steps that are separate calls (non-cumulative context) train as
samples of their own, sharing their trajectory's advantage; a cumulative multi-turn trajectory stays
one masked sequence."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from rft_runtime.algos import compute_advantages
from rft_runtime.trainer.batch import collate, sequences_from_groups
from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer
from rft_runtime.trainer.signals import advantages
from rft_runtime.types import Episode

from .conftest import FakeGroup, make_episode

GRPO = SimpleNamespace(advantage_estimator="grpo", advantage_whitening="sequence")


def _step(rng: random.Random, prompt_len: int, resp_len: int) -> dict:
    resp = [rng.randrange(3, 250) for _ in range(resp_len)]
    return {"prompt_ids": [rng.randrange(3, 250) for _ in range(prompt_len)], "response_ids": resp,
            "logprobs": [-rng.uniform(0.1, 3.0) for _ in resp], "policy_version": 0}


def stepwise_episode(task: str, idx: int, reward: float) -> Episode:
    """A summarising agent: step 2's prompt is a fresh context (the summary request), not step 1's."""
    rng = random.Random(f"{task}:{idx}")
    return Episode.model_validate({"id": f"{task}:{idx}", "trajectories": [
        {"name": "default", "reward": reward, "steps": [_step(rng, 6, 4 + idx), _step(rng, 5, 3)]}]})


def test_two_non_cumulative_steps_are_two_samples_with_one_advantage(tiny_model):
    eps = [stepwise_episode("sum", i, float(i % 2)) for i in range(4)]
    multi = [make_episode("calc", i, reward=float(i < 2), steps=2) for i in range(4)]  # cumulative: 2 turns
    seqs = sequences_from_groups([FakeGroup("sum", eps), FakeGroup("calc", multi)])
    stepwise, cumulative = seqs[:8], seqs[8:]
    assert len(cumulative) == 4 and all(s.trajectory_step == 0 and 0 in s.response_mask for s in cumulative)
    assert [s.trajectory_step for s in stepwise] == [0, 1] * 4
    for k, ep in enumerate(eps):
        first, second = stepwise[2 * k], stepwise[2 * k + 1]
        assert first.episode_id == second.episode_id == ep.id and first.reward == second.reward == ep.reward
        assert (first.prompt_ids, first.response_ids) == (ep.trajectories[0].steps[0].prompt_ids,
                                                          ep.trajectories[0].steps[0].response_ids)
        assert second.prompt_ids == ep.trajectories[0].steps[1].prompt_ids and second.response_mask == [1] * 3

    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    adv = advantages(seqs, rewards, GRPO)
    # each trajectory counts once in its group's baseline: the advantages of four single samples
    per_trajectory = compute_advantages("grpo", torch.tensor([ep.reward for ep in eps], dtype=torch.float64),
                                        ["sum:default"] * 4).advantages.float()
    assert torch.equal(adv.advantages[:8], per_trajectory.repeat_interleave(2))
    assert torch.equal(adv.advantages[8:], compute_advantages("grpo", rewards[8:], [s.group for s in cumulative])
                       .advantages.float())
    assert bool(adv.valid.all()) and float(adv.advantages[:8].abs().min()) > 0

    batch = collate(seqs)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    learner = Learner(tiny_model, LearnerConfig(micro_batch_size=4),
                      build_optimizer([p for p in tiny_model.parameters() if p.requires_grad], 1e-3, 0.0))
    metrics = learner.update(batch, adv.advantages, adv.valid, learner.logprobs(batch))
    assert metrics["grad_norm"] > 0 and metrics["loss_tokens"] == float(sum(s.model_tokens for s in seqs))
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tiny_model.named_parameters())


def test_a_step_rejoins_the_chain_it_continues():
    """Interleaved calls (main turn, a side call, the main conversation's next turn) are two samples:
    the main chain merged with its tool tokens masked, and the side call."""
    rng = random.Random(0)
    main = _step(rng, 6, 3)
    side = _step(rng, 4, 2)
    env = [7, 8]
    cont = {**_step(rng, 1, 3), "prompt_ids": main["prompt_ids"] + main["response_ids"] + env}
    ep = Episode.model_validate({"id": "t:0", "trajectories": [{"name": "default", "reward": 1.0,
                                                                 "steps": [main, side, cont]}]})
    merged_main, alone = ep.trajectories[0].segments()
    assert merged_main.response_ids == main["response_ids"] + env + cont["response_ids"]
    assert merged_main.response_mask == [1] * 3 + [0, 0] + [1] * 3
    assert alone.prompt_ids == side["prompt_ids"] and alone.response_ids == side["response_ids"]
    with pytest.raises(ValueError, match="does not extend"):
        ep.trajectories[0].merged()
