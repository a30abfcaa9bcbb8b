"""Response bodies with vLLM's shapes for completions and chat completions.

Shapes follow the recorded vLLM 0.32 fixtures in ``shared/contracts/vllm`` key by key. Extra to vLLM
is the top-level ``policy_version`` (the weights that produced the response).
"""

from __future__ import annotations

import random
import time
from typing import Any

from .codec import TextCodec
from .protocol import GenerationRequest, PromptInput
from .sequence import GenerationResult, Sequence

FINGERPRINT = "rft-builtin"
_FLOOR = -9999.0  # vLLM/OpenAI render -inf logprobs as -9999.0


def _lp(v: float) -> float:
    return max(v, _FLOOR)


def request_id(prefix: str) -> str:
    """A fresh id like vLLM's (``cmpl-<16 hex>``)."""
    return f"{prefix}-{random.getrandbits(64):016x}"


def output_text(codec: TextCodec, seq: Sequence) -> str:
    """Completion text: special tokens skipped, a final stop token dropped, cut before a stop string."""
    ids = seq.output
    if seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str) and ids:
        ids = ids[:-1]
    text = codec.decode_text(ids)
    if isinstance(seq.stop_reason, str):
        cut = text.find(seq.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


def _step_candidates(chosen: int, lp: float, top: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The chosen token first, then the top alternatives, each token once (vLLM's logprob dict order)."""
    out = {chosen: lp}
    for tid, v in top:
        out.setdefault(tid, v)
    return list(out.items())


def prompt_logprobs_body(codec: TextCodec, seq: Sequence) -> list[dict | None] | None:
    """``prompt_logprobs`` as vLLM returns it: ``[None, {"id": {logprob, rank, decoded_token}}, ...]``."""
    if seq.prompt_logprobs is None:
        return None
    out: list[dict | None] = []
    for t, entry in enumerate(seq.prompt_logprobs):
        if entry is None:
            out.append(None)
            continue
        ctx = seq.prompt[:t]
        out.append({str(tid): {"logprob": _lp(v), "rank": rank, "decoded_token": codec.piece(ctx, tid)}
                    for tid, (v, rank) in entry.items()})
    return out


def completion_logprobs(codec: TextCodec, seq: Sequence, k: int, echo: bool, as_ids: bool, *, start: int = 0,
                        end: int | None = None, offset: int = 0) -> dict[str, list]:
    """The completions ``logprobs`` object: text_offset, token_logprobs, tokens, top_logprobs (of the
    generated tokens ``start:end``, text offsets counted from ``offset``, when streaming)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict | None] = []
    steps: list[tuple[int, list[tuple[int, float]] | None, list[int] | None]] = []
    if echo:
        plps = seq.prompt_logprobs or [None] * len(seq.prompt)
        for t, tid in enumerate(seq.prompt):
            entry = plps[t] if t < len(plps) else None
            cands = None if entry is None else [(i, v) for i, (v, _r) in entry.items()]
            steps.append((tid, cands, None if as_ids else seq.prompt[:t]))
    for i in range(start, len(seq.output) if end is None else end):
        tid = seq.output[i]
        top = seq.top[i] if i < len(seq.top) else []
        # the context (for a token's text piece) is only built where labels are text, not token ids
        steps.append((tid, _step_candidates(tid, seq.logprobs[i], top),
                      None if as_ids else seq.prompt + seq.output[:i]))
    offsets: list[int] = []
    for tid, cands, ctx in steps:
        label = codec.token_label(ctx, tid, as_ids)
        offsets.append(offset if not offsets else offsets[-1] + len(tokens[-1]))
        tokens.append(label)
        if cands is None:
            token_lps.append(None)
            tops.append(None)
            continue
        token_lps.append(_lp(cands[0][1]))
        top_map: dict[str, float] = {}
        for tok, v in cands[: k + 1]:
            top_map[codec.token_label(ctx, tok, as_ids)] = _lp(v)
        tops.append(top_map)
    return {"text_offset": offsets, "token_logprobs": token_lps, "tokens": tokens, "top_logprobs": tops}


def _usage(prompts: list[PromptInput], seqs: list[Sequence]) -> dict[str, Any]:
    p = sum(len(x.token_ids) for x in prompts)
    c = sum(len(s.output) for s in seqs)
    return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c, "prompt_tokens_details": None,
            "completion_tokens_details": None}


def completion_body(req: GenerationRequest, result: GenerationResult, codec: TextCodec, model: str) -> dict:
    """The ``/v1/completions`` response for a finished request."""
    choices = []
    for idx, seq in enumerate(result.sequences):
        prompt = req.prompts[idx // req.n]
        text = output_text(codec, seq)
        if req.echo and prompt.text is not None:  # vLLM echoes text prompts only, not token-id prompts
            text = prompt.text + text
        lp = None
        if seq.params.logprobs is not None:
            lp = completion_logprobs(codec, seq, seq.params.logprobs, req.echo, req.return_tokens_as_token_ids)
        choices.append({
            "index": idx,
            "text": text,
            "logprobs": lp,
            "finish_reason": seq.finish_reason,
            "stop_reason": seq.stop_reason,
            "token_ids": list(seq.output) if req.return_token_ids else None,
            "prompt_logprobs": prompt_logprobs_body(codec, seq),
            "prompt_token_ids": list(seq.prompt) if req.return_token_ids else None,
            "routed_experts": None,
        })
    return {
        "id": request_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(req.prompts, result.sequences),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
        "policy_version": result.policy_version,
    }


def _chat_token(label: str, v: float) -> dict[str, Any]:
    return {"token": label, "logprob": _lp(v), "bytes": list(label.encode("utf-8", errors="replace"))}


def chat_logprobs(codec: TextCodec, seq: Sequence, top_n: int, as_ids: bool, *, start: int = 0,
                  end: int | None = None) -> dict[str, list]:
    """The chat ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}`` (of the
    generated tokens ``start:end`` when streaming)."""
    content = []
    for i in range(start, len(seq.output) if end is None else end):
        tid = seq.output[i]
        ctx = seq.prompt + seq.output[:i]
        cands = _step_candidates(tid, seq.logprobs[i], seq.top[i] if i < len(seq.top) else [])
        entry = _chat_token(codec.token_label(ctx, tid, as_ids), seq.logprobs[i])
        entry["top_logprobs"] = [_chat_token(codec.token_label(ctx, t, as_ids), v) for t, v in cands[:top_n]]
        content.append(entry)
    return {"content": content}


def chat_body(req: GenerationRequest, result: GenerationResult, codec: TextCodec, model: str) -> dict:
    """The ``/v1/chat/completions`` response for a finished request."""
    choices = []
    for idx, seq in enumerate(result.sequences):
        choices.append({
            "index": idx,
            "message": {"role": "assistant", "content": output_text(codec, seq), "refusal": None,
                        "annotations": None, "audio": None, "function_call": None, "reasoning": None},
            "logprobs": chat_logprobs(codec, seq, req.top_logprobs, req.return_tokens_as_token_ids)
            if req.want_logprobs else None,
            "finish_reason": seq.finish_reason,
            "stop_reason": seq.stop_reason,
            "token_ids": list(seq.output) if req.return_token_ids else None,
            "routed_experts": None,
        })
    first = result.sequences[0]
    return {
        "id": request_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(req.prompts, result.sequences),
        "prompt_logprobs": prompt_logprobs_body(codec, first),
        "prompt_token_ids": list(first.prompt) if req.return_token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
        "policy_version": result.policy_version,
    }
