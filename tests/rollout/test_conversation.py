"""Chat-template deltas and `TokenConversation` on the tiny model's real tokenizer."""

from __future__ import annotations

import copy

import pytest

from rft_runtime.rollout import ChatTemplateError, ChatTokenizer, TokenContractError, TokenConversation, engine_sample
from rft_runtime.types import Sample

from .conftest import load_fixture

USER = [{"role": "user", "content": "what is 2 + 3?"}]


def sample_for(conv: TokenConversation, ids: list[int], finish: str = "stop") -> Sample:
    return engine_sample(prompt_ids=conv.prompt_ids(), completion_ids=ids, logprobs=[-0.5] * len(ids),
                         finish_reason=finish, policy_version=0)


def test_first_prompt_matches_vllm_tokenize_fixture(chat_tokenizer):
    fx = load_fixture("processed_logprobs", "tokenize_chat")
    assert chat_tokenizer.encode_chat(fx["request"]["messages"]) == fx["response"]["tokens"]


def test_delta_equals_the_message_rendered_alone(chat_tokenizer):
    for msg in ({"role": "tool", "content": "5"}, {"role": "user", "content": "and 4 + 4?"}):
        assert chat_tokenizer.message_delta([msg]) == chat_tokenizer.encode_chat([msg], add_generation_prompt=True)
    tok = chat_tokenizer.tokenizer
    assert tok.decode(chat_tokenizer.assistant_closer()) == "<|im_end|>\n"
    assert chat_tokenizer.close_assistant([70, 71, 2]) == [201]  # eos sampled: only "\n" added
    assert chat_tokenizer.close_assistant([70, 71]) == [2, 201]  # truncated: whole closer


def test_conversation_equals_full_template_when_text_round_trips(chat_tokenizer):
    """With ASCII replies (where re-tokenising is harmless) appending deltas reproduces exactly what
    the template renders for the whole conversation: the delta construction is right."""
    tok = chat_tokenizer.tokenizer
    conv = TokenConversation.start(chat_tokenizer, USER)
    reply1 = tok.encode("<calc>2+3</calc>", add_special_tokens=False) + [2]
    conv.add_assistant(sample_for(conv, reply1))
    conv.add_messages([{"role": "tool", "content": "5"}])
    reply2 = tok.encode("The answer is 5", add_special_tokens=False) + [2]
    conv.add_assistant(sample_for(conv, reply2))
    conv.add_messages([{"role": "user", "content": "thanks"}])
    expected = chat_tokenizer.encode_chat([
        *USER,
        {"role": "assistant", "content": "<calc>2+3</calc>"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The answer is 5"},
        {"role": "user", "content": "thanks"},
    ])
    assert conv.ids == expected
    assert [conv.ids[t.start:t.end] for t in conv.turns] == [reply1, reply2]
    assert sum(conv.mask) == len(reply1) + len(reply2)
    assert all(m == 1 for t in conv.turns for m in conv.mask[t.start:t.end])
    assert [lp for lp, m in zip(conv.logprobs, conv.mask) if m] == [-0.5] * (len(reply1) + len(reply2))
    prompt, resp, mask, lps = conv.response_view()
    assert prompt == expected[: conv.prompt_len] and len(resp) == len(mask) == len(lps)
    assert resp[-1] == 2 and mask[-1] == 1  # the trailing user turn is not part of the response


def test_sampled_ids_survive_where_decode_encode_would_change_them(chat_tokenizer):
    tok = chat_tokenizer.tokenizer
    # 1. Invalid UTF-8: vLLM sampled these ids for the fixture prompt (ids 169 and 235 are lone
    #    bytes). Decoding gives U+FFFD, which re-encodes to three other byte tokens.
    sampled = load_fixture("processed_logprobs", "completions_tokens_in_logprobs")["response"]["choices"][0]["token_ids"]
    # 2. Byte-level merges: the model may emit "h","a","t" one byte at a time; re-encoding merges them.
    spelled = [tok.convert_tokens_to_ids(c) for c in "hat"]
    for ids in (sampled, spelled + [2]):
        retokenised = tok.encode(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)
        assert retokenised != [t for t in ids if t != 2]  # decode-then-encode CHANGES the ids
        conv = TokenConversation.start(chat_tokenizer, USER)
        conv.add_assistant(sample_for(conv, ids, "length"))
        conv.add_messages([{"role": "tool", "content": "ok"}])
        t = conv.turns[0]
        assert conv.ids[t.start:t.end] == ids  # ours kept the sampled ids
        next_prompt = conv.prompt_ids()
        assert next_prompt[: t.end] == conv.ids[: t.end]
        # and the naive rebuild from text would have produced a different prompt
        naive = chat_tokenizer.encode_chat([*USER, {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)},
                                            {"role": "tool", "content": "ok"}])
        assert naive != next_prompt


def test_conversation_guards(chat_tokenizer):
    conv = TokenConversation.start(chat_tokenizer, USER)
    with pytest.raises(TokenContractError, match="sample the assistant turn first"):
        conv.add_messages([{"role": "tool", "content": "x"}])
    wrong = engine_sample(prompt_ids=conv.ids[:-1], completion_ids=[5], logprobs=[-1.0], finish_reason="stop",
                          policy_version=0)
    with pytest.raises(TokenContractError, match="not this conversation"):
        conv.add_assistant(wrong)
    conv.add_assistant(sample_for(conv, [70, 2]))
    with pytest.raises(TokenContractError, match="two assistant turns"):
        conv.add_assistant(engine_sample(prompt_ids=conv.ids, completion_ids=[5], logprobs=[-1.0],
                                         finish_reason="stop", policy_version=0))
    with pytest.raises(TokenContractError, match="add a message"):
        conv.prompt_ids()
    fork = conv.fork()
    fork.add_messages([{"role": "user", "content": "more"}])
    assert len(fork.ids) > len(conv.ids) and not conv.awaiting_assistant
    fork.mask.append(1)
    with pytest.raises(TokenContractError, match="lengths differ"):
        fork.check()


def test_template_that_is_not_prefix_stable_is_refused(chat_tokenizer):
    tok = copy.deepcopy(chat_tokenizer.tokenizer)
    # A template whose header depends on the number of messages changes earlier tokens.
    tok.chat_template = "{{ messages|length }}" + tok.chat_template
    broken = ChatTokenizer(tok)
    with pytest.raises(ChatTemplateError, match="renders earlier turns differently"):
        broken.message_delta([{"role": "tool", "content": "5"}])


def test_anchor_falls_back_when_system_role_is_refused(chat_tokenizer):
    tok = copy.deepcopy(chat_tokenizer.tokenizer)
    tok.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        + tok.chat_template
    )
    ct = ChatTokenizer(tok)
    assert ct.message_delta([{"role": "tool", "content": "5"}]) == chat_tokenizer.message_delta([{"role": "tool", "content": "5"}])
