"""The OpenAI-shaped chat client handed to evaluator bundles; training-aware underneath.

`await client.chat.completions.create(model=..., messages=[...], n=..., ...)` returns a
`ChatCompletion` like the OpenAI Python client's. Underneath it tokenises locally with the chat
template, samples through `InferenceClient` with token ids, and records every sample's token
contract in the rollout's `RolloutRecorder`. A call whose messages extend a conversation this client
returned continues that conversation's token ids (see `recorder.py`), so earlier assistant turns are
never re-tokenised.

Sampling settings: the job's temperature/top_p/top_k always apply (the trainer recomputes logprobs at
the job's temperature; a different per-call value is ignored with a warning); `max_tokens` /
`max_completion_tokens` may only lower the job's limit; `seed`, `stop` and `n` are honoured.
Settings that change the sampling distribution in ways the trainer cannot reproduce
(`logit_bias`, non-zero `frequency_penalty`/`presence_penalty`, `extra_body` keys other than a few
stop/detokenisation switches) and `stream=True` are refused.

With a `RecomputeSampler` (`rollout.tokens: recompute`) each sample is drawn through the engine's
plain `/v1/chat/completions` route instead, and its ids and logprobs are rebuilt (see `recompute.py`);
the conversation, recording and limits are the same.

Limits from the job: a new conversation whose prompt has more than `rollout.maxPromptTokens` tokens
raises `PromptTooLong`; a request for assistant turn `rollout.maxTurns + 1` of a conversation raises
`MaxTurnsReached` (the worker ends the episode there with termination reason `max_turns`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any, Mapping, Sequence

from ..types import Sample
from .chat_template import ChatTokenizer
from .client import InferenceClient
from .conversation import TokenConversation
from .errors import MaxTurnsReached, PromptTooLong
from .openai_types import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionTokenLogprob,
    Choice,
    ChoiceLogprobs,
    CompletionUsage,
    TopLogprob,
)
from .recompute import RecomputeSampler
from .recorder import DEFAULT_TRAJECTORY, RecordedSample, RolloutRecorder, message_dict
from .sampling import SamplingParams
from .tool_calls import ToolParser, parse_hermes_tool_calls

log = logging.getLogger(__name__)

# Accepted for compatibility with the OpenAI client; they do not change sampling.
_NO_EFFECT = frozenset(
    {"user", "metadata", "store", "parallel_tool_calls", "timeout", "extra_headers", "extra_query",
     "service_tier", "tool_choice", "top_logprobs", "stream_options", "modalities", "prediction"}
)
_REFUSED_NONZERO = ("frequency_penalty", "presence_penalty")
# extra_body keys passed to the engine: none of them changes the sampling distribution.
_EXTRA_BODY_ALLOWED = frozenset(
    {"stop_token_ids", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
     "spaces_between_special_tokens"}
)


class ChatClient:
    """Async OpenAI-shaped chat client recording into `recorder` (one per rollout)."""

    def __init__(
        self,
        inference: InferenceClient,
        tokenizer: ChatTokenizer,
        *,
        sampling: SamplingParams,
        policy_version: int | None = None,
        recorder: RolloutRecorder | None = None,
        trajectory: str = DEFAULT_TRAJECTORY,
        tool_parser: ToolParser = parse_hermes_tool_calls,
        max_prompt_tokens: int | None = None,
        max_turns: int | None = None,
        recompute: RecomputeSampler | None = None,
        stepwise: bool = False,
    ) -> None:
        self.inference = inference
        self.stepwise = stepwise
        """New conversations join trajectory `trajectory` as further steps instead of starting a
        trajectory of their own (the recording gateway's calls: an agent's separate calls are the
        steps of one trajectory, see `recorder.py`)."""
        self.base_url: str | None = None
        """The recording gateway's OpenAI base URL for this episode (`gateway.py`), once opened."""
        self.api_key: str | None = None
        """The episode's key for `base_url`."""
        self.recompute = recompute
        self.max_prompt_tokens = max_prompt_tokens
        self.max_turns = max_turns
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.policy_version = policy_version
        self.recorder = recorder if recorder is not None else RolloutRecorder()
        self.trajectory = trajectory
        self.tool_parser = tool_parser
        self.chat = _Chat(self)
        self._warned: set[str] = set()

    def with_trajectory(self, name: str) -> "ChatClient":
        """A view of this client whose new conversations are recorded as trajectory `name`."""
        if not name or not isinstance(name, str):
            raise ValueError("trajectory name must be a non-empty string")
        view = ChatClient(
            self.inference, self.tokenizer, sampling=self.sampling, policy_version=self.policy_version,
            recorder=self.recorder, trajectory=name, tool_parser=self.tool_parser,
            max_prompt_tokens=self.max_prompt_tokens, max_turns=self.max_turns, recompute=self.recompute,
            stepwise=self.stepwise,
        )
        view._warned = self._warned
        view.base_url, view.api_key = self.base_url, self.api_key
        return view

    def openai_env(self) -> dict[str, str]:
        """`OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL` of this episode's gateway endpoint,
        for an agent run as a subprocess (``env={**os.environ, **client.openai_env()}``)."""
        if self.base_url is None or self.api_key is None:
            raise RuntimeError("this client has no gateway endpoint (only bundle rollouts get one)")
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.inference.model}

    async def create_chat_completion(
        self,
        *,
        messages: Sequence[Any],
        model: str | None = None,
        n: int | None = 1,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        logprobs: bool | None = None,
        stream: bool | None = None,
        logit_bias: Mapping[str, float] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> ChatCompletion:
        """Sample `n` assistant replies to `messages`; see the module docstring for the rules."""
        n = 1 if n is None else n
        _check_arguments(messages, n, stream, logit_bias, kwargs)
        extra = dict(extra_body or {})
        self._warn_job_owned({"temperature": temperature, "top_p": top_p, "top_k": extra.pop("top_k", None)})
        refused = sorted(set(extra) - _EXTRA_BODY_ALLOWED)
        if refused:
            raise ValueError(
                f"extra_body key(s) {refused} are refused: only {sorted(_EXTRA_BODY_ALLOWED)} (and top_k, "
                "which the job owns) may be passed, so the trainer can reproduce the sampling logprobs"
            )
        sampling = self._call_sampling(max_tokens, max_completion_tokens, stop, extra)

        parent, conversation = self._conversation_for(messages, tools)
        if parent is None and self.max_prompt_tokens is not None and len(conversation.ids) > self.max_prompt_tokens:
            raise PromptTooLong(len(conversation.ids), self.max_prompt_tokens)
        if parent is not None and self.max_turns is not None and parent.turn >= self.max_turns:
            raise MaxTurnsReached(self.max_turns)
        seeds = [seed + i for i in range(n)] if seed is not None else None
        if self.recompute is not None:  # rollout.tokens: recompute (recompute.py)
            samples = await self.recompute.sample(
                [message_dict(m) for m in messages], conversation.prompt_ids(), n, sampling, tools=tools,
                policy_version=self.policy_version, seeds=seeds,
            )
        else:
            samples = await self.inference.complete(
                conversation.prompt_ids(), n, sampling, policy_version=self.policy_version, seeds=seeds
            )
        choices = []
        for i, sample in enumerate(samples):
            choices.append(self._record(i, sample, conversation, messages, parent, bool(tools), bool(logprobs)))
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
            choices=choices,
            created=int(time.time()),
            model=model or self.inference.model,
            usage=CompletionUsage(
                prompt_tokens=len(conversation.ids),
                completion_tokens=sum(len(s.completion_ids) for s in samples),
                total_tokens=len(conversation.ids) + sum(len(s.completion_ids) for s in samples),
            ),
            prompt_token_ids=list(conversation.ids),
        )

    def _call_sampling(
        self, max_tokens: int | None, max_completion_tokens: int | None, stop: Any, extra: dict[str, Any]
    ) -> SamplingParams:
        limit = self.sampling.max_tokens
        for name, v in (("max_tokens", max_tokens), ("max_completion_tokens", max_completion_tokens)):
            if v is not None:
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
                limit = min(limit, v)
        if stop is not None:
            extra["stop"] = [stop] if isinstance(stop, str) else list(stop)
        stop_ids = tuple(self.sampling.stop_token_ids)
        for t in extra.pop("stop_token_ids", None) or ():
            if t not in stop_ids:
                stop_ids += (t,)
        return dataclasses.replace(
            self.sampling, max_tokens=limit, stop_token_ids=stop_ids, extra={**self.sampling.extra, **extra}
        )

    def _warn_job_owned(self, values: dict[str, Any]) -> None:
        for name, v in values.items():
            job = getattr(self.sampling, name)
            if v is not None and v != job and name not in self._warned:
                self._warned.add(name)
                log.warning("bundle asked for %s=%r; the job's %s=%r applies (the trainer uses it)", name, v, name, job)

    def _conversation_for(
        self, messages: Sequence[Any], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[RecordedSample | None, TokenConversation]:
        found = self.recorder.find(messages)
        if found is None:
            return None, TokenConversation.start(self.tokenizer, [message_dict(m) for m in messages], tools=tools)
        parent, k = found
        rest = [message_dict(m) for m in messages[k:]]
        if not rest:
            raise ValueError(
                "messages end with an assistant turn this client sampled; add the next user/tool message "
                "before asking for another reply"
            )
        conversation = parent.conversation.fork()
        conversation.add_messages(rest)
        return parent, conversation

    def _record(
        self,
        i: int,
        sample: Sample,
        conversation: TokenConversation,
        messages: Sequence[Any],
        parent: RecordedSample | None,
        parse_tools: bool,
        want_logprobs: bool,
    ) -> Choice:
        text = self.tokenizer.decode(sample.completion_ids)
        content: str | None = text
        tool_calls = None
        finish = sample.finish_reason
        if parse_tools:
            content, calls = self.tool_parser(text, f"call_{len(self.recorder.samples)}")
            if calls:
                tool_calls = calls
                finish = "tool_calls" if finish == "stop" else finish
        message = ChatCompletionMessage(content=content, tool_calls=tool_calls)
        as_dict = message_dict(message)
        conv = conversation.fork()
        conv.add_assistant(sample, as_dict)
        self.recorder.record(
            sample, conv, message=as_dict, message_obj=message, history=messages, parent=parent,
            trajectory_name=self.trajectory if parent is None else self.recorder.trajectories[parent.trajectory].name,
            stepwise=self.stepwise,
        )
        return Choice(
            index=i,
            message=message,
            finish_reason=finish,  # type: ignore[arg-type]
            logprobs=self._logprobs(sample) if want_logprobs else None,
            token_ids=list(sample.completion_ids),
        )

    def _logprobs(self, sample: Sample) -> ChoiceLogprobs:
        out = []
        for tid, lp in zip(sample.completion_ids, sample.logprobs):
            tok = self.tokenizer.tokenizer.convert_ids_to_tokens(tid)
            out.append(ChatCompletionTokenLogprob(token=str(tok), logprob=lp, top_logprobs=[TopLogprob(str(tok), lp)]))
        return ChoiceLogprobs(content=out)


def _check_arguments(messages: Any, n: Any, stream: Any, logit_bias: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse what the training-aware client cannot honour, naming the argument."""
    unknown = sorted(set(kwargs) - _NO_EFFECT - set(_REFUSED_NONZERO))
    if unknown:
        raise TypeError(f"chat.completions.create() got unsupported argument(s): {', '.join(unknown)}")
    if stream:
        raise ValueError("stream=True is not supported by the training-aware client")
    if logit_bias:
        raise ValueError("logit_bias is refused: the trainer could not reproduce the sampling logprobs")
    for name in _REFUSED_NONZERO:
        if kwargs.get(name):
            raise ValueError(f"{name} is refused: the trainer could not reproduce the sampling logprobs")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not messages:
        raise ValueError("messages must be a non-empty list")


class _Completions:
    def __init__(self, client: ChatClient) -> None:
        self._client = client

    async def create(self, **kwargs: Any) -> ChatCompletion:
        """`client.chat.completions.create(...)` of the OpenAI async client."""
        return await self._client.create_chat_completion(**kwargs)


class _Chat:
    def __init__(self, client: ChatClient) -> None:
        self.completions = _Completions(client)


class SyncChatClient:
    """Blocking facade over `ChatClient` for synchronous bundle code running in a worker thread.

    Calls are executed on `loop` (the worker's event loop, running in another thread).
    """

    def __init__(self, client: ChatClient, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self.chat = _SyncChat(self)

    def with_trajectory(self, name: str) -> "SyncChatClient":
        """Sync view recording new conversations as trajectory `name`."""
        return SyncChatClient(self._client.with_trajectory(name), self._loop)

    @property
    def base_url(self) -> str | None:
        """The episode's recording-gateway base URL (see `ChatClient.base_url`)."""
        return self._client.base_url

    @property
    def api_key(self) -> str | None:
        """The episode's key for `base_url`."""
        return self._client.api_key

    def openai_env(self) -> dict[str, str]:
        """See `ChatClient.openai_env`."""
        return self._client.openai_env()

    def create(self, **kwargs: Any) -> ChatCompletion:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError(
                "the sync chat client was called on the event loop's thread; make the rollout "
                "`async def` and `await client.chat.completions.create(...)`"
            )
        fut = asyncio.run_coroutine_threadsafe(self._client.create_chat_completion(**kwargs), self._loop)
        return fut.result()


class _SyncCompletions:
    def __init__(self, client: SyncChatClient) -> None:
        self._client = client

    def create(self, **kwargs: Any) -> ChatCompletion:
        """`client.chat.completions.create(...)` of the OpenAI sync client."""
        return self._client.create(**kwargs)


class _SyncChat:
    def __init__(self, client: SyncChatClient) -> None:
        self.completions = _SyncCompletions(client)
