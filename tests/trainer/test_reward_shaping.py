"""Per-domain reward post-processing: clip, scale, then batch or running normalisation."""

from __future__ import annotations

import math

import pytest

from rft_api.spec import DomainMix
from rft_runtime.trainer.batch import TrainSequence
from rft_runtime.trainer.reward_shaping import EPS, RewardShaper


def seq(domain: str, reward: float | None, i: int = 0) -> TrainSequence:
    return TrainSequence(group=f"{domain}-{i}", prompt_ids=[1], response_ids=[2], response_mask=[1],
                         inference_logprobs=[-0.1], reward=reward, version=0, truncated=False,
                         episode_id=f"{domain}:{i}", domain=domain)


def mix(**settings) -> list[DomainMix]:
    return [DomainMix.model_validate({"domain": d, "weight": 1, **s}) for d, s in settings.items()]


def test_clip_then_scale_and_other_domains_untouched():
    shaper = RewardShaper(mix(code={"rewardClip": {"min": 0.0, "max": 1.0}, "rewardScale": 2.0}, math={}))
    seqs = [seq("code", -0.5), seq("code", 0.25), seq("code", 3.0), seq("code", None), seq("math", 7.0)]
    out, metrics = shaper(seqs)
    assert [s.reward for s in out] == [0.0, 0.5, 2.0, None, 7.0]
    assert [s.reward for s in seqs] == [-0.5, 0.25, 3.0, None, 7.0]  # the input is not changed
    assert metrics["domain/code/shaped_mean"] == pytest.approx(2.5 / 3) and "domain/math/shaped_mean" not in metrics


def test_batch_normalisation_standardises_each_domain_on_its_own():
    shaper = RewardShaper(mix(a={"rewardNormalization": "batch"}, b={"rewardNormalization": "batch", "rewardScale": 10}))
    out, _ = shaper([seq("a", 0.0), seq("a", 1.0), seq("b", 0.0), seq("b", 0.0), seq("b", 1.0), seq("b", 1.0)])
    sd = 0.5
    assert [s.reward for s in out[:2]] == pytest.approx([-0.5 / (sd + EPS), 0.5 / (sd + EPS)])
    assert [s.reward for s in out[2:]] == pytest.approx([-5 / (5 + EPS)] * 2 + [5 / (5 + EPS)] * 2)


def test_running_normalisation_uses_every_step_so_far_and_survives_a_checkpoint():
    steps = [[0.0, 1.0, 1.0], [0.0, 0.0], [1.0, 1.0, 1.0, 0.5]]
    shaper = RewardShaper(mix(a={"rewardNormalization": "running"}))
    seen: list[float] = []
    for k, rewards in enumerate(steps):
        if k == 2:  # resume from a checkpoint of the first two steps
            state = shaper.state_dict()
            shaper = RewardShaper(mix(a={"rewardNormalization": "running"}))
            shaper.load_state_dict(state)
        seen += rewards
        mu = sum(seen) / len(seen)
        sd = math.sqrt(sum((v - mu) ** 2 for v in seen) / len(seen))
        out, _ = shaper([seq("a", r, i) for i, r in enumerate(rewards)])
        assert [s.reward for s in out] == pytest.approx([(r - mu) / (sd + EPS) for r in rewards])
    assert shaper.state_dict()["a"]["count"] == 9


def test_without_settings_nothing_is_shaped():
    seqs = [seq("a", 0.5)]
    out, metrics = RewardShaper(mix(a={}))(seqs)
    assert out is seqs and metrics == {}
    assert RewardShaper(None)(seqs) == (seqs, {})
