"""`TokenConversation`: a multi-turn conversation held as token ids with a response mask.

Assistant turns append the sampled ids exactly as the engine returned them (mask 1, with their
logprobs); every other turn appends the chat template's delta (mask 0, logprob 0.0). Sampled text is
never decoded and re-encoded to build the next prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..types import Sample
from .chat_template import ChatTokenizer
from .errors import TokenContractError


@dataclass(frozen=True)
class TurnSpan:
    """Where one sampled assistant turn sits in the conversation ids: `ids[start:end]`."""

    start: int
    end: int


@dataclass
class TokenConversation:
    """Token ids so far, aligned `mask` (1 = sampled by the model) and `logprobs` (0.0 where mask 0).

    `prompt_len` is the length of the first prompt; `turns` the spans of sampled turns; `messages` the
    chat history (assistant contents are display text, not a source of ids).
    """

    tokenizer: ChatTokenizer
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt_len: int = 0
    turns: list[TurnSpan] = field(default_factory=list)
    awaiting_assistant: bool = True

    @classmethod
    def start(
        cls,
        tokenizer: ChatTokenizer,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> "TokenConversation":
        """A conversation whose first prompt is `messages` rendered with the generation prompt."""
        if not messages:
            raise ValueError("a conversation needs at least one message")
        ids = tokenizer.encode_chat(messages, tools=tools, add_generation_prompt=True)
        return cls(
            tokenizer=tokenizer,
            ids=ids,
            mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            messages=[dict(m) for m in messages],
            prompt_len=len(ids),
        )

    def prompt_ids(self) -> list[int]:
        """The ids to send for the next assistant turn."""
        if not self.awaiting_assistant:
            raise TokenContractError("the last turn is an assistant turn; add a message before sampling again")
        return list(self.ids)

    def add_assistant(self, sample: Sample, message: Mapping[str, Any] | None = None) -> None:
        """Append a sampled turn. `sample.prompt_ids` must be exactly the conversation so far."""
        if not self.awaiting_assistant:
            raise TokenContractError("two assistant turns in a row: add the environment's message first")
        if sample.prompt_ids != self.ids:
            raise TokenContractError(
                f"sample was drawn for a prompt of {len(sample.prompt_ids)} ids that is not this "
                f"conversation ({len(self.ids)} ids)"
            )
        start = len(self.ids)
        self.ids.extend(sample.completion_ids)
        self.mask.extend([1] * len(sample.completion_ids))
        self.logprobs.extend(sample.logprobs)
        self.turns.append(TurnSpan(start, len(self.ids)))
        content = message if message is not None else {"role": "assistant", "content": self.tokenizer.decode(sample.completion_ids)}
        self.messages.append(dict(content))
        self.awaiting_assistant = False
        self.check()

    def add_messages(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append non-sampled messages (tool, environment, user) as template deltas, mask 0.

        An assistant message here is text the model did not sample (a few-shot example, an edited
        reply): it is rendered by the template like any other message and masked 0. Closes a preceding
        assistant turn with the template's closer first; ends with the generation prompt, ready for the
        next assistant turn.
        """
        if not messages:
            raise ValueError("add_messages needs at least one message")
        added: list[int] = []
        if not self.awaiting_assistant and self.turns:
            last = self.turns[-1]
            added += self.tokenizer.close_assistant(self.ids[last.start : last.end])
        elif self.awaiting_assistant:
            raise TokenContractError(
                "messages added while a generation prompt is open; sample the assistant turn first"
            )
        added += self.tokenizer.message_delta(messages, add_generation_prompt=True)
        self.ids.extend(added)
        self.mask.extend([0] * len(added))
        self.logprobs.extend([0.0] * len(added))
        self.messages.extend(dict(m) for m in messages)
        self.awaiting_assistant = True
        self.check()

    def fork(self) -> "TokenConversation":
        """An independent copy (for n samples continuing the same history)."""
        return TokenConversation(
            tokenizer=self.tokenizer,
            ids=list(self.ids),
            mask=list(self.mask),
            logprobs=list(self.logprobs),
            messages=[dict(m) for m in self.messages],
            prompt_len=self.prompt_len,
            turns=list(self.turns),
            awaiting_assistant=self.awaiting_assistant,
        )

    def response_view(self, start: int | None = None) -> tuple[list[int], list[int], list[int], list[float]]:
        """`(prompt_ids, response_ids, response_mask, response_logprobs)` split at `start`.

        `start` defaults to the first prompt's end; the response ends at the last sampled token
        (environment tokens after it were never seen by the model and are left out).
        """
        start = self.prompt_len if start is None else start
        if not self.turns:
            return list(self.ids[:start]), [], [], []
        end = self.turns[-1].end
        if not 0 <= start <= end:
            raise ValueError(f"response start {start} outside [0, {end}]")
        return list(self.ids[:start]), self.ids[start:end], self.mask[start:end], self.logprobs[start:end]

    def check(self) -> None:
        """Raise TokenContractError unless ids, mask and logprobs are aligned and spans are consistent."""
        if not len(self.ids) == len(self.mask) == len(self.logprobs):
            raise TokenContractError(
                f"conversation lengths differ: {len(self.ids)} ids, {len(self.mask)} mask, "
                f"{len(self.logprobs)} logprobs"
            )
        if sum(self.mask) != sum(t.end - t.start for t in self.turns):
            raise TokenContractError("response mask does not match the sampled turns")
