"""Server-sent-event chunks of streamed completions, with vLLM 0.32's chunk shapes.

The recorded exchanges (``tests/contracts/vllm/processed_logprobs__stream_*.json``) fix the shapes:

* completions: one chunk per choice and engine iteration that produced tokens, ``choices`` holding that
  one choice: ``{index, text, logprobs, finish_reason, stop_reason, prompt_token_ids, token_ids}``;
  ``prompt_token_ids`` only on a choice's first chunk (with ``return_token_ids``);
* chat: first a ``{"role": "assistant", "content": ""}`` delta per choice (with the top-level
  ``prompt_token_ids`` and ``prompt_text``), then ``{"content": ...}`` deltas, the last one with
  ``finish_reason`` and ``stop_reason``;
* ``stream_options.include_usage`` adds a final chunk with ``choices: []`` and ``usage``; the
  ``system_fingerprint`` goes on the final chunk (the usage chunk, else each choice's last chunk);
* then ``data: [DONE]``.

Text deltas are the growth of the decoded text: a trailing incomplete UTF-8 sequence (decoded as
U+FFFD) is held back until the next token, and so is the tail that could still become a stop string,
so the concatenated deltas equal the non-streamed ``text``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .codec import TextCodec
from .protocol import GenerationRequest
from .render import FINGERPRINT, chat_logprobs, completion_logprobs, output_text, request_id
from .sequence import Sequence


def sse(obj: Any) -> bytes:
    """One ``data:`` event."""
    data = obj if isinstance(obj, str) else json.dumps(obj, allow_nan=False)
    return f"data: {data}\n\n".encode()


class _Choice:
    __slots__ = ("tokens", "text", "done")

    def __init__(self) -> None:
        self.tokens = 0  # tokens already sent
        self.text = ""  # text already sent
        self.done = False


class Streamer:
    """Turns engine progress into chunks for one streamed request (``chat`` selects the chat shapes)."""

    def __init__(self, req: GenerationRequest, codec: TextCodec, model: str, *, chat: bool):
        self.req, self.codec, self.model, self.chat = req, codec, model, chat
        self.id = request_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.choices: dict[int, _Choice] = {}

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}

    def _text(self, seq: Sequence, n: int, finished: bool) -> str:
        if finished:
            return output_text(self.codec, seq)
        text = self.codec.decode_text(seq.output[:n])
        keep = len(text.rstrip("\ufffd"))
        if seq.params.stop:
            keep = min(keep, max(0, len(text) - (max(len(s) for s in seq.params.stop) - 1)))
        return text[:keep]

    def chunks(self, updates: list[tuple[Sequence, int, str | None]]) -> list[bytes]:
        """Chunks for the sequences that advanced: ``(sequence, its length then, its finish reason then)``."""
        out: list[bytes] = []
        for seq, n, reason in updates:
            st = self.choices.get(seq.index)
            if st is None:
                st = self.choices[seq.index] = _Choice()
                if self.chat:
                    out.append(sse({**self._head(), "choices": [
                        {"index": seq.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}],
                        "prompt_token_ids": list(seq.prompt) if self.req.return_token_ids else None,
                        "prompt_text": None}))
            if st.done:
                continue
            if n == st.tokens and reason is None:
                continue
            text = self._text(seq, n, reason is not None)
            delta = text[len(st.text):] if text.startswith(st.text) else ""
            out.append(sse(self._chunk(seq, st, n, delta, reason)))
            st.tokens, st.text = n, st.text + delta
            st.done = reason is not None
        return out

    def _chunk(self, seq: Sequence, st: _Choice, n: int, delta: str, reason: str | None) -> dict[str, Any]:
        req, first = self.req, st.tokens == 0 and not st.text
        ids = list(seq.output[st.tokens:n]) if req.return_token_ids else None
        if self.chat:
            lp = (chat_logprobs(self.codec, seq, req.top_logprobs, req.return_tokens_as_token_ids, start=st.tokens,
                                end=n) if req.want_logprobs else None)
            choice: dict[str, Any] = {"index": seq.index, "delta": {"content": delta}, "logprobs": lp,
                                      "finish_reason": reason}
            if reason is not None:
                choice["stop_reason"] = seq.stop_reason
            choice["token_ids"] = ids
        else:
            lp = None
            if seq.params.logprobs is not None:
                lp = completion_logprobs(self.codec, seq, seq.params.logprobs, False, req.return_tokens_as_token_ids,
                                         start=st.tokens, end=n, offset=len(st.text))
            choice = {"index": seq.index, "text": delta, "logprobs": lp, "finish_reason": reason,
                      "stop_reason": seq.stop_reason if reason is not None else None,
                      "prompt_token_ids": list(seq.prompt) if (first and req.return_token_ids) else None,
                      "token_ids": ids}
        body = {**self._head(), "choices": [choice]}
        if reason is not None and not req.include_usage:
            body["system_fingerprint"] = FINGERPRINT
        return body

    def tail(self, seqs: list[Sequence], policy_version: int) -> list[bytes]:
        """The usage chunk (when asked) and ``[DONE]``."""
        out = []
        if self.req.include_usage:
            p = sum(len(x.token_ids) for x in self.req.prompts)
            c = sum(len(s.output) for s in seqs)
            out.append(sse({**self._head(), "choices": [],
                            "usage": {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c},
                            "system_fingerprint": FINGERPRINT}))
        out.append(sse("[DONE]"))
        return out
