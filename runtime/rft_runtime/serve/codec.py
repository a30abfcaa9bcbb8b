"""Text <-> token ids for the server: prompts, chat templates, output text and logprob token strings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import APIError

_REPLACEMENT = "\ufffd"
_PIECE_CONTEXT = 4  # a UTF-8 character spans at most 4 byte-level tokens


class TextCodec:
    """Wraps a Hugging Face tokenizer with the conversions the OpenAI routes need."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text prompt."""
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def apply_chat(self, messages: list[dict], *, add_generation_prompt: bool = True,
                   continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
                   tools: Any = None) -> list[int]:
        """Token ids of ``messages`` rendered with the tokenizer's chat template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "The model's tokenizer has no chat template", "messages")
        if continue_final_message and add_generation_prompt:
            raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true",
                           "continue_final_message")
        try:
            out = self.tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tools=tools, **(chat_template_kwargs or {}))
        except Exception as exc:  # template errors (missing fields, raise_exception) are the client's
            raise APIError(400, f"Could not apply the chat template: {exc}", "messages") from exc
        if isinstance(out, Mapping):
            out = out["input_ids"]
        return [int(t) for t in out]

    def decode_text(self, ids: Sequence[int]) -> str:
        """Output text as vLLM renders it: special tokens skipped, and a trailing incomplete UTF-8
        character (up to 3 tokens) held back, as vLLM's incremental detokenizer does."""
        ids = list(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not text.endswith(_REPLACEMENT):
            return text
        for cut in range(1, min(3, len(ids)) + 1):
            head = self.tokenizer.decode(ids[:-cut], skip_special_tokens=True)
            if not head.endswith(_REPLACEMENT):
                return head
        return text

    def piece(self, context: Sequence[int] | None, token_id: int) -> str:
        """The text one token adds after ``context``, as vLLM shows it in logprobs.

        A token that ends in an incomplete UTF-8 sequence shows as ``""``; the token that completes the
        character shows the whole character.
        """
        prev = list(context[-_PIECE_CONTEXT:]) if context else []
        new = self.tokenizer.decode(prev + [token_id], skip_special_tokens=False)
        if new.endswith(_REPLACEMENT):
            return ""
        old = self.tokenizer.decode(prev, skip_special_tokens=False) if prev else ""
        k = 0
        limit = min(len(old), len(new))
        while k < limit and old[k] == new[k]:
            k += 1
        return new[k:]

    def pieces(self, context: Sequence[int], ids: Sequence[int]) -> list[str]:
        """:meth:`piece` for each of ``ids`` following ``context`` and each other."""
        seq = list(context[-_PIECE_CONTEXT:]) if context else []
        out = []
        for t in ids:
            out.append(self.piece(seq, t))
            seq = (seq + [t])[-_PIECE_CONTEXT:]
        return out

    def token_label(self, context: Sequence[int] | None, token_id: int, as_id: bool) -> str:
        """``token_id:N`` when ``as_id`` (vLLM's return_tokens_as_token_ids), else :meth:`piece`."""
        return f"token_id:{token_id}" if as_id else self.piece(context, token_id)


def eos_ids(*values: Any) -> frozenset[int]:
    """The end-of-sequence ids named by ``values`` (each an id, a list of ids, or None), e.g. the
    tokenizer's, the generation config's and the model config's."""
    out: set[int] = set()
    for v in values:
        if isinstance(v, int):
            out.add(v)
        elif isinstance(v, (list, tuple)):
            out.update(int(x) for x in v if isinstance(x, int))
    return frozenset(out)
