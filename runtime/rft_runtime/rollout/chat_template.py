"""Local tokenisation with the model's chat template, and the token deltas of later turns.

First turn: `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`.

Later turns are never re-rendered from text. A non-assistant message (tool result, environment
observation, user reply) is appended as the template's *delta* for that message: render a fixed
anchor conversation that ends with a closed assistant turn, render it again with the new messages
(and the generation prompt), check that the first token sequence is a prefix of the second, and
keep the tokens after it. For a Qwen-style im_start template the delta of `{"role": "tool", ...}`
is exactly `<|im_start|>tool\n...<|im_end|>\n<|im_start|>assistant\n`, what the template renders
for the message alone; the anchor (which starts with a system message) keeps templates that inject a
default system prompt before a lone message (Qwen2.5) from leaking it into the delta. A template
whose rendering of earlier turns changes when messages are added is refused with
`ChatTemplateError` instead of silently producing ids the model never saw.

Between a sampled assistant turn and the next delta the template's *closer* goes in: what the
template writes after an assistant message's content (Qwen: `<|im_end|>\n`). Whatever prefix of it
the model already sampled (normally the end-of-turn token) is not repeated.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from .errors import ChatTemplateError

_SENTINEL = "\u2063RFT-ASSISTANT-SENTINEL\u2063"
_ANCHORS: tuple[tuple[dict[str, str], ...], ...] = (
    (
        {"role": "system", "content": "anchor"},
        {"role": "user", "content": "anchor"},
        {"role": "assistant", "content": "anchor"},
    ),
    ({"role": "user", "content": "anchor"}, {"role": "assistant", "content": "anchor"}),
)


class ChatTokenizer:
    """A Hugging Face tokenizer plus the chat-template operations the rollout needs."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.eos_token_id: int | None = tokenizer.eos_token_id
        self._anchor: tuple[dict[str, str], ...] | None = None
        self._anchor_ids: list[int] | None = None
        self._closer: list[int] | None = None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> "ChatTokenizer":
        """Load the tokenizer from a local model directory (never from a hub)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """Token ids of `messages` rendered by the chat template."""
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": True}
        if tools:
            kwargs["tools"] = list(tools)
        out = self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)
        if isinstance(out, Mapping):  # transformers >= 5 returns a BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False) -> str:
        """The template's text for `messages` (for the closer computation and for display)."""
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def encode_text(self, text: str) -> list[int]:
        """Ids of template-produced text (special tokens recognised, none added)."""
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Display text of ids (special tokens skipped). Never fed back into the tokenizer."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def message_delta(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids to append after a closed assistant turn for new (non-sampled) `messages`."""
        if not messages:
            raise ValueError("message_delta needs at least one message")
        anchor, anchor_ids = self._anchor_conversation()
        full = self.encode_chat([*anchor, *messages], add_generation_prompt=add_generation_prompt)
        if full[: len(anchor_ids)] != anchor_ids:
            raise ChatTemplateError(
                "the chat template renders earlier turns differently once messages are added "
                f"(roles {[m.get('role') for m in messages]}); token ids cannot be appended safely"
            )
        return full[len(anchor_ids):]

    def assistant_closer(self) -> list[int]:
        """Ids the template writes after an assistant message's content (Qwen: `<|im_end|>\\n`)."""
        if self._closer is None:
            anchor, _ = self._anchor_conversation()
            msgs = [*anchor[:-1], {"role": "assistant", "content": _SENTINEL}]
            text = self.render_text(msgs)
            if text.count(_SENTINEL) != 1:
                raise ChatTemplateError("cannot locate the assistant content in the chat template output")
            self._closer = self.encode_text(text.split(_SENTINEL, 1)[1])
        return list(self._closer)

    def close_assistant(self, completion_ids: Sequence[int]) -> list[int]:
        """Ids to append after sampled `completion_ids` to end the assistant turn.

        The longest prefix of the closer that the completion already ends with (the end-of-turn token
        the model sampled) is not repeated; a truncated turn gets the whole closer.
        """
        closer = self.assistant_closer()
        ids = list(completion_ids)
        for k in range(len(closer), 0, -1):
            if len(ids) >= k and ids[-k:] == closer[:k]:
                return closer[k:]
        return closer

    def _anchor_conversation(self) -> tuple[tuple[dict[str, str], ...], list[int]]:
        if self._anchor is None:
            errors = []
            for anchor in _ANCHORS:
                try:
                    ids = self.encode_chat(anchor, add_generation_prompt=False)
                except Exception as e:  # a template may refuse the system role
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                self._anchor, self._anchor_ids = anchor, ids
                break
            else:
                raise ChatTemplateError(f"the chat template cannot render an anchor conversation: {errors}")
        assert self._anchor_ids is not None
        return self._anchor, self._anchor_ids
