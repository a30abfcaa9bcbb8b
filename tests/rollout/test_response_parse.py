"""Token-contract parsing of recorded vLLM responses (unit tier: no server)."""

from __future__ import annotations

import copy
import math

import pytest

from rft_runtime.rollout import SampleAborted, SamplingParams, TokenContractError, engine_sample
from rft_runtime.rollout.response import parse_completions

from .conftest import load_fixture


def parse(fx, *, n=1, headers=None, policy_version=None, require_prompt_echo=True, max_tokens=None):
    req = fx["request"]
    return parse_completions(
        fx["response"], headers or {}, prompt_ids=req["prompt"], n=n,
        max_tokens=max_tokens or req["max_tokens"], seeds=[req.get("seed")] * n,
        policy_version=policy_version, server="http://x", require_prompt_echo=require_prompt_echo,
    )


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_tokens_in_logprobs_fixture(mode):
    fx = load_fixture(mode, "completions_tokens_in_logprobs")
    [s] = parse(fx, policy_version=4)
    choice = fx["response"]["choices"][0]
    assert s.prompt_ids == fx["request"]["prompt"]
    assert s.completion_ids == choice["token_ids"] == [169, 207, 94, 264, 4, 235]
    assert s.logprobs == choice["logprobs"]["token_logprobs"]
    assert s.finish_reason == "length" and s.truncated
    assert s.policy_version == 4  # vLLM does not report one: the caller's version is recorded
    assert s.seed == 7


def test_n2_fixture_parses_both_choices_in_index_order():
    fx = load_fixture("processed_logprobs", "completions_n2")
    resp = copy.deepcopy(fx["response"])
    resp["choices"].reverse()  # order in the list must not matter, only `index`
    out = parse_completions(resp, {}, prompt_ids=fx["request"]["prompt"], n=2, max_tokens=6,
                            seeds=[7, 8], policy_version=None, server="s")
    assert [s.completion_ids for s in out] == [[169, 207, 94, 264, 4, 235], [15, 119, 269, 341, 210, 135]]
    assert out[1].logprobs[0] == pytest.approx(-5.947780609130859)
    with pytest.raises(TokenContractError, match="n=3"):
        parse_completions(resp, {}, prompt_ids=fx["request"]["prompt"], n=3, max_tokens=6, seeds=[1, 2, 3],
                          policy_version=None, server="s")


def test_stop_eos_fixture_without_token_id_strings():
    # return_tokens_as_token_ids was not sent: tokens are text; ids come from token_ids only.
    fx = load_fixture("processed_logprobs", "completions_stop_eos")
    [s] = parse(fx)
    assert len(s.completion_ids) == 40 == len(s.logprobs)
    assert s.completion_ids[30] == 1  # the model sampled <|im_start|> mid-completion; kept as an id
    assert s.finish_reason == "length"


def test_length_truncated_fixture():
    fx = load_fixture("processed_logprobs", "completions_length_truncated")
    [s] = parse(fx)
    assert s.completion_ids == [169] and s.truncated


def test_echoed_prompt_must_equal_sent_prompt():
    fx = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")
    bad = copy.deepcopy(fx)
    bad["response"]["choices"][0]["prompt_token_ids"] = fx["request"]["prompt"][:-1]
    with pytest.raises(TokenContractError, match="echoed prompt_token_ids differ"):
        parse(bad)
    missing = copy.deepcopy(fx)
    del missing["response"]["choices"][0]["prompt_token_ids"]
    with pytest.raises(TokenContractError, match="did not echo"):
        parse(missing)
    assert parse(missing, require_prompt_echo=False)[0].completion_ids == [169, 207, 94, 264, 4, 235]


@pytest.mark.parametrize(
    "tamper, match",
    [
        (lambda c: c["logprobs"]["token_logprobs"].pop(), "6 completion ids but 5 logprobs"),
        (lambda c: c["logprobs"]["tokens"].__setitem__(2, "token_id:95"), "disagree with logprob tokens"),
        (lambda c: c.pop("token_ids") and c["logprobs"]["tokens"].__setitem__(0, "x"), "no 'token_ids'"),
        (lambda c: c["token_ids"].__setitem__(0, -3), "is not a token id"),
        (lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, None), "is not a number"),
        (lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, math.nan), "not a finite log-probability"),
        (lambda c: c.__setitem__("finish_reason", None), "unexpected finish_reason"),
        (lambda c: c.pop("logprobs"), "no logprobs.token_logprobs"),
    ],
)
def test_contract_violations_raise(tamper, match):
    fx = copy.deepcopy(load_fixture("processed_logprobs", "completions_tokens_in_logprobs"))
    tamper(fx["response"]["choices"][0])
    with pytest.raises(TokenContractError, match=match):
        parse(fx)


def test_token_ids_from_token_strings_when_token_ids_absent():
    fx = copy.deepcopy(load_fixture("processed_logprobs", "completions_tokens_in_logprobs"))
    del fx["response"]["choices"][0]["token_ids"]
    assert parse(fx)[0].completion_ids == [169, 207, 94, 264, 4, 235]


def test_more_tokens_than_max_tokens_raises():
    fx = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")
    with pytest.raises(TokenContractError, match="exceed max_tokens=5"):
        parse(fx, max_tokens=5)


def test_abort_is_its_own_error():
    fx = copy.deepcopy(load_fixture("processed_logprobs", "completions_tokens_in_logprobs"))
    fx["response"]["choices"][0]["finish_reason"] = "abort"
    with pytest.raises(SampleAborted):
        parse(fx)


def test_policy_version_body_then_header_then_caller():
    fx = copy.deepcopy(load_fixture("processed_logprobs", "completions_tokens_in_logprobs"))
    assert parse(fx, headers={"x-policy-version": "9"}, policy_version=1)[0].policy_version == 9
    fx["response"]["policy_version"] = 11
    assert parse(fx, headers={"x-policy-version": "9"}, policy_version=1)[0].policy_version == 11
    fx["response"]["policy_version"] = "eleven"
    with pytest.raises(TokenContractError, match="policy_version"):
        parse(fx)


def test_sample_out_checks_lengths():
    with pytest.raises(TokenContractError, match="2 completion ids but 1 logprobs"):
        engine_sample(prompt_ids=[1], completion_ids=[5, 6], logprobs=[-1.0], finish_reason="stop", policy_version=None)
    with pytest.raises(TokenContractError, match="finish_reason"):
        engine_sample(prompt_ids=[1], completion_ids=[5], logprobs=[-1.0], finish_reason="tool_calls",
                      policy_version=None)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
     ({"top_k": 0}, "top_k"), ({"seed": -1}, "seed"), ({"stop_token_ids": (1, -2)}, "stop_token_ids"),
     ({"extra": {"n": 4}}, "extra")],
)
def test_sampling_params_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"sampling.{field}"):
        SamplingParams(**kwargs)


def test_sampling_request_fields():
    body = SamplingParams(max_tokens=6, temperature=0.7, stop_token_ids=(2,), top_k=5).request_fields(seed=7)
    assert body == {"max_tokens": 6, "temperature": 0.7, "logprobs": 1, "return_token_ids": True,
                    "return_tokens_as_token_ids": True, "seed": 7, "stop_token_ids": [2], "top_k": 5}
