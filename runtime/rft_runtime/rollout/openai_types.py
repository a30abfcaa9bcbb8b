"""Response objects shaped like the OpenAI Python client's `ChatCompletion` (attribute access and
`model_dump()`), so bundle code written for that client reads them unchanged.

Two vLLM-style extras ride along: `ChatCompletion.prompt_token_ids` and `Choice.token_ids`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal


class _Dumpable:
    def model_dump(self, exclude_none: bool = False) -> dict[str, Any]:
        """A plain dict, like pydantic's `model_dump` on the OpenAI types."""
        d = dataclasses.asdict(self)  # type: ignore[call-overload]
        return _drop_none(d) if exclude_none else d

    def to_dict(self) -> dict[str, Any]:
        """Alias of `model_dump(exclude_none=True)`."""
        return self.model_dump(exclude_none=True)


def _drop_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_none(x) for x in v]
    return v


@dataclass
class Function(_Dumpable):
    name: str
    arguments: str


@dataclass
class ChatCompletionMessageToolCall(_Dumpable):
    id: str
    function: Function
    type: Literal["function"] = "function"


@dataclass
class ChatCompletionMessage(_Dumpable):
    content: str | None
    role: Literal["assistant"] = "assistant"
    tool_calls: list[ChatCompletionMessageToolCall] | None = None
    refusal: str | None = None


@dataclass
class TopLogprob(_Dumpable):
    token: str
    logprob: float
    bytes: list[int] | None = None


@dataclass
class ChatCompletionTokenLogprob(_Dumpable):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = field(default_factory=list)


@dataclass
class ChoiceLogprobs(_Dumpable):
    content: list[ChatCompletionTokenLogprob] | None = None


@dataclass
class Choice(_Dumpable):
    index: int
    message: ChatCompletionMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None
    token_ids: list[int] | None = None


@dataclass
class CompletionUsage(_Dumpable):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass
class ChatCompletion(_Dumpable):
    id: str
    choices: list[Choice]
    created: int
    model: str
    usage: CompletionUsage
    object: Literal["chat.completion"] = "chat.completion"
    prompt_token_ids: list[int] | None = None
    system_fingerprint: str | None = None
