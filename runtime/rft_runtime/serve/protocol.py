"""Request parsing and validation for the OpenAI-compatible routes.

Field names, defaults and limits follow vLLM's OpenAI server. Every rejected field raises an
:class:`~rft_runtime.serve.errors.APIError` (400) that names the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import APIError, bad_request, invalid_param

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below this mean greedy decoding
DEFAULT_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling parameters (one completion choice).

    ``max_tokens`` None means "up to the context limit" and is resolved by
    :func:`resolve_max_tokens` before the engine sees it.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per sampled token; None: no logprobs
    prompt_logprobs: int | None = None  # top alternatives per prompt token; None: none

    @property
    def greedy(self) -> bool:
        """True when the temperature selects greedy decoding."""
        return self.temperature < GREEDY_EPS


@dataclass
class PromptInput:
    """One prompt as token ids, with its text when the client sent text."""

    token_ids: list[int]
    text: str | None = None


@dataclass
class GenerationRequest:
    """A parsed completion or chat request: prompts × n choices sharing sampling parameters."""

    model: str | None
    prompts: list[PromptInput]
    n: int
    params: SamplingParams
    echo: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    # chat only
    top_logprobs: int = 0
    want_logprobs: bool = False
    stream: bool = False
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- field readers


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def get_int(body: dict, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    """Read an optional integer field, checking bounds; absent or JSON ``null`` gives ``default``."""
    v = body.get(name)
    if v is None:
        v = default
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not _is_int(v):
        raise invalid_param(name, v, "must be an integer")
    if lo is not None and v < lo:
        raise invalid_param(name, v, f"must be at least {lo}")
    if hi is not None and v > hi:
        raise invalid_param(name, v, f"must be at most {hi}")
    return v


def get_float(body: dict, name: str, default: float | None, lo: float | None = None, hi: float | None = None,
              lo_open: bool = False) -> float | None:
    """Read an optional number field, checking bounds (``lo_open``: the lower bound is excluded); absent or
    JSON ``null`` gives ``default``."""
    v = body.get(name)
    if v is None:
        v = default
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid_param(name, v, "must be a finite number")
    v = float(v)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise invalid_param(name, v, f"must be {'greater than' if lo_open else 'at least'} {lo}")
    if hi is not None and v > hi:
        raise invalid_param(name, v, f"must be at most {hi}")
    return v


def get_bool(body: dict, name: str, default: bool) -> bool:
    """Read an optional boolean field."""
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid_param(name, v, "must be a boolean")
    return v


def _get_logprobs_count(body: dict, name: str, max_logprobs: int) -> int | None:
    v = body.get(name)
    if v is None or v is False:
        return None
    if v is True:  # some clients send logprobs=true on completions
        return 0
    return get_int(body, name, None, lo=0, hi=max_logprobs)


def _get_stop(body: dict) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) and s for s in v):
        raise invalid_param("stop", v, "must be a non-empty string or a list of non-empty strings")
    return tuple(v)


def _get_stop_token_ids(body: dict, vocab_size: int) -> tuple[int, ...]:
    v = body.get("stop_token_ids")
    if v is None:
        return ()
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise invalid_param("stop_token_ids", v, "must be a list of integers")
    for t in v:
        if not 0 <= t < vocab_size:
            raise invalid_param("stop_token_ids", t, f"must hold token ids in [0, {vocab_size})")
    return tuple(v)


def parse_sampling(body: dict, *, vocab_size: int, max_logprobs: int, default_max_tokens: int | None,
                   logprobs: int | None) -> SamplingParams:
    """Sampling fields shared by completions and chat."""
    max_tokens = get_int(body, "max_tokens", default_max_tokens, lo=1)
    top_k = get_int(body, "top_k", 0, lo=-1)
    if get_int(body, "min_tokens", 0, lo=0):
        raise invalid_param("min_tokens", body["min_tokens"], "is not supported by the builtin server")
    seed = get_int(body, "seed", None)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise invalid_param("seed", seed, "must fit in a signed 64-bit integer")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=get_float(body, "temperature", 1.0, lo=0.0),
        top_p=get_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
        top_k=0 if top_k in (-1, 0) else top_k,
        seed=seed,
        stop_token_ids=_get_stop_token_ids(body, vocab_size),
        stop=_get_stop(body),
        ignore_eos=get_bool(body, "ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=_get_logprobs_count(body, "prompt_logprobs", max_logprobs),
    )


def _get_stream(body: dict) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage`` (options without ``stream`` are refused, as vLLM)."""
    stream = get_bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise invalid_param("stream_options", opts, "must be an object")
    if not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.")
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise invalid_param("stream_options", opts, "include_usage must be a boolean")
    return stream, usage


def _check_model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_param("model", model, "must be a string")
    return model


# --------------------------------------------------------------------------- prompts


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    """Reject ids outside the vocabulary with vLLM's message."""
    for t in ids:
        if not 0 <= t < vocab_size:
            raise APIError(400, f"Token id {t} is out of vocabulary", None)


def parse_prompt_field(prompt: Any) -> list[str | list[int]]:
    """Split ``prompt`` (string, token ids, or a list of either) into single prompts."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise invalid_param("prompt", prompt if not isinstance(prompt, list) else "[...]",
                        "must be a string, a non-empty list of token ids, or a non-empty list of either")


def parse_completion(body: Any, *, vocab_size: int, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> tuple[
        GenerationRequest, list[str | list[int]]]:
    """Parse ``/v1/completions``; prompts come back raw (text is tokenized by the caller)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    stream, usage = _get_stream(body)
    if "prompt" not in body:
        raise invalid_param("prompt", None, "is required")
    raw_prompts = parse_prompt_field(body["prompt"])
    logprobs = _get_logprobs_count(body, "logprobs", max_logprobs)
    echo = get_bool(body, "echo", False)
    params = parse_sampling(body, vocab_size=vocab_size, max_logprobs=max_logprobs, default_max_tokens=16,
                            logprobs=logprobs)
    if echo and logprobs is not None and params.prompt_logprobs is None:
        # vLLM: echo with logprobs also returns the prompt's logprobs
        params = replace(params, prompt_logprobs=logprobs)
    req = GenerationRequest(
        model=_check_model(body),
        prompts=[],
        n=get_int(body, "n", 1, lo=1, hi=256),
        params=params,
        echo=echo,
        return_token_ids=get_bool(body, "return_token_ids", False),
        return_tokens_as_token_ids=get_bool(body, "return_tokens_as_token_ids", False),
        stream=stream,
        include_usage=usage,
    )
    if stream and (echo or params.prompt_logprobs is not None):
        raise invalid_param("stream", True, "cannot be combined with echo or prompt_logprobs on the builtin server")
    return req, raw_prompts


def parse_messages(body: dict) -> list[dict]:
    """Validate ``messages`` (roles and text content; content parts of type text are joined)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise invalid_param("messages", msgs, "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise invalid_param(f"messages[{i}]", m, "must be an object with a string role")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise invalid_param(f"messages[{i}].content", p, "only text parts are supported")
                parts.append(p["text"])
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise invalid_param(f"messages[{i}].content", content, "must be a string or a list of text parts")
        out.append({**m, "content": content})
    return out


def parse_chat(body: Any, *, vocab_size: int, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> tuple[
        GenerationRequest, list[dict]]:
    """Parse ``/v1/chat/completions``; returns the request and the validated messages."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    stream, usage = _get_stream(body)
    messages = parse_messages(body)
    want = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", 0 if want else None, lo=0, hi=max_logprobs)
    if top and not want:
        raise invalid_param("top_logprobs", top, "requires logprobs=true")
    top = top or 0
    mt_body = dict(body)
    if body.get("max_completion_tokens") is not None:
        mt_body["max_tokens"] = body["max_completion_tokens"]
    params = parse_sampling(mt_body, vocab_size=vocab_size, max_logprobs=max_logprobs, default_max_tokens=None,
                            logprobs=top if want else None)
    req = GenerationRequest(
        model=_check_model(body),
        prompts=[],
        n=get_int(body, "n", 1, lo=1, hi=256),
        params=params,
        return_token_ids=get_bool(body, "return_token_ids", False),
        return_tokens_as_token_ids=get_bool(body, "return_tokens_as_token_ids", False),
        top_logprobs=top,
        want_logprobs=want,
        stream=stream,
        include_usage=usage,
        extra={
            "add_generation_prompt": get_bool(body, "add_generation_prompt", True),
            "continue_final_message": get_bool(body, "continue_final_message", False),
            "chat_template_kwargs": _get_dict(body, "chat_template_kwargs"),
            "tools": body.get("tools"),
            **({"chat_template": body["chat_template"]} if body.get("chat_template") is not None else {}),
        },
    )
    return req, messages


def _get_dict(body: dict, name: str) -> dict:
    v = body.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise invalid_param(name, v, "must be an object")
    return v


def resolve_max_tokens(params: SamplingParams, prompt_len: int, max_model_len: int,
                       prompt_field: str = "prompt") -> SamplingParams:
    """Check the context budget like vLLM and fill a missing ``max_tokens``."""
    if prompt_len == 0:
        raise invalid_param(prompt_field, "[]", "must not be empty")
    if prompt_len >= max_model_len:
        raise APIError(400, f"The prompt (total length {prompt_len}) is too long to fit into the model "
                            f"(context length {max_model_len}). Make sure that `max_model_len` is no smaller "
                            f"than the number of text tokens.", prompt_field)
    mt = params.max_tokens
    if mt is None:
        return replace(params, max_tokens=max_model_len - prompt_len)
    if mt > max_model_len:
        raise APIError(400, f"max_tokens={mt} cannot be greater than max_model_len={max_model_len}. "
                            f"Please request fewer output tokens. (parameter=max_tokens, value={mt})", "max_tokens")
    if prompt_len + mt > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                            f"requested {mt} output tokens and your prompt contains {prompt_len} input tokens, "
                            f"for a total of {prompt_len + mt} tokens. Please reduce the length of the input "
                            f"prompt or the number of requested output tokens. (parameter=max_tokens, value={mt})",
                       "max_tokens")
    return params
