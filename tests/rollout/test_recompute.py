"""`rollout.tokens: recompute`: samples drawn through the plain chat route of our builtin server, ids
rebuilt by re-tokenisation and logprobs by one prefill at the same policy version.

The drift test measures, on multi-turn conversations with the same seeds, how far the rebuilt tokens
are from those the exact pattern samples. On the tiny model (random weights, a byte-level tokenizer
with many merges) nearly every turn drifts: its replies are arbitrary bytes, whose text re-encodes to
other tokens (docs/rollout-tokens.md has the numbers). What must hold whatever the drift: every rebuilt
token's logprob is the model's logprob of that token in the rebuilt sequence, and the rebuilt ids are
exactly the reply's text encoded (plus the end-of-turn token it stopped on).
"""

from __future__ import annotations

import random

from rft_runtime.data.task import Task
from rft_runtime.rollout import EvaluatorBundle, InferenceClient, RolloutWorker, SamplingParams

from .test_logprob_parity import LIVE_TOL, model, recompute  # noqa: F401  (module fixture reused)
from .test_worker import _continue_loop

TASKS = [Task(task_id=f"d{i}", prompt=p, ground_truth="5")
         for i, p in enumerate(["what is 2 + 3?", "add 1 and 4", "7 - 2 = ?", "say five"])]
SAMPLING = SamplingParams(max_tokens=6, temperature=1.0, seed=11)


async def _run(url, chat_tokenizer, tokens, *, turns=None, n=4):
    inference = InferenceClient(url, "tiny", rng=random.Random(0))
    bundle = EvaluatorBundle("inline", rollout=_continue_loop(turns)) if turns else None
    w = RolloutWorker(inference, chat_tokenizer, bundle=bundle, tokens=tokens)
    try:
        eps = [ep for t in TASKS for ep in await w.rollout_task(t, n, SAMPLING, policy_version=5)]
    finally:
        w.close()
        await inference.aclose()
    return eps, w


def _check_rebuilt(step, chat_tokenizer, sampler, model, tol=LIVE_TOL):  # noqa: F811
    """The step's ids are its text re-encoded (plus the end token), its logprobs the model's."""
    body = step.response_ids
    if step.finish_reason == "stop":
        assert body[-1] == sampler.end_of_turn_id
        body = body[:-1]
    assert body == chat_tokenizer.encode_text(step.response_text)
    if step.response_ids:
        ref = recompute(model, step.prompt_ids, step.response_ids, None)
        assert max(abs(a - b) for a, b in zip(ref, step.logprobs)) < tol
    assert all(lp <= 0 for lp in step.logprobs) and len(step.logprobs) == len(step.response_ids)


async def test_single_turn_recompute_on_builtin_server(builtin_server, chat_tokenizer, model):  # noqa: F811
    eps, w = await _run(builtin_server, chat_tokenizer, "recompute")
    exact, _ = await _run(builtin_server, chat_tokenizer, "exact")
    n = len(eps)
    assert w.recompute.stats["chat_requests"] == n and w.recompute.stats["prefills"] <= n
    assert w.recompute.stats["redrawn"] == 0
    for ep, ex in zip(eps, exact):
        assert not ep.errors.any
        [step] = ep.trajectories[0].steps
        [ex_step] = ex.trajectories[0].steps
        assert step.prompt_ids == ex_step.prompt_ids  # the prompt is rendered the same way in both patterns
        assert step.policy_version == ex_step.policy_version and step.metadata["seed"] == ex_step.metadata["seed"]
        # the same seed on the same prompt: the server sampled the same reply, shown as the same text
        assert chat_tokenizer.decode(step.response_ids) == chat_tokenizer.decode(ex_step.response_ids).rstrip("\ufffd")
        _check_rebuilt(step, chat_tokenizer, w.recompute, model)


async def test_multi_turn_drift_is_measured(builtin_server, chat_tokenizer, model):  # noqa: F811
    exact, _ = await _run(builtin_server, chat_tokenizer, "exact", turns=3)
    rebuilt, w = await _run(builtin_server, chat_tokenizer, "recompute", turns=3)
    turns = same = sampled = kept = drifted = 0
    for ex, rc in zip(exact, rebuilt):
        assert not rc.errors.any and ex.id == rc.id
        [ex_traj], [rc_traj] = ex.trajectories, rc.trajectories
        assert len(ex_traj.steps) == len(rc_traj.steps) == 3
        for k, (a, b) in enumerate(zip(ex_traj.steps, rc_traj.steps)):
            _check_rebuilt(b, chat_tokenizer, w.recompute, model)
            turns += 1
            same += a.response_ids == b.response_ids
            sampled += len(a.response_ids)
            kept += sum(x == y for x, y in zip(a.response_ids, b.response_ids))
            kept_flag = b.metadata["sampled_ids_kept"]  # the engine's own ids, returned alongside the text
            if k == 0:  # the same prompt and seed in both patterns: the engine sampled what the exact run kept
                assert a.prompt_ids == b.prompt_ids
                assert kept_flag == (a.response_ids == b.response_ids)
            drifted += not kept_flag
            if a.response_ids == b.response_ids and a.prompt_ids == b.prompt_ids:
                assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < LIVE_TOL
        flags = [not s.metadata["sampled_ids_kept"] for s in rc_traj.steps]
        assert rc.metrics["retokenize_drift"] == sum(flags) / len(flags)  # the episode's share, for the trainer
        assert "retokenize_drift" not in ex.metrics
        # the merged trajectory is one token sequence: later prompts extend the rebuilt earlier turns
        merged = rc_traj.merged()
        assert sum(merged.response_mask) == sum(len(s.response_ids) for s in rc_traj.steps)
    print(f"re-tokenisation drift over {turns} turns: {drifted} rebuilt turns differ from what the engine sampled "
          f"({drifted / turns:.0%}); against the exact run, {turns - same} turns differ and {sampled - kept} of "
          f"{sampled} sampled tokens are not kept at their position")
    assert turns == len(TASKS) * 4 * 3
    assert w.recompute.stats["measured"] == turns and w.recompute.stats["drifted"] == drifted


def test_recompute_refused_below_temperature_one():
    import pytest

    from rft_api.spec import RolloutSpec

    with pytest.raises(ValueError, match="rollout.tokens recompute needs rollout.temperature 1.0"):
        RolloutSpec.model_validate({"tokens": "recompute", "temperature": 0.7})
    assert RolloutSpec.model_validate({"tokens": "recompute"}).tokens == "recompute"
