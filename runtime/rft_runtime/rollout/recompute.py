"""The recompute token pattern (``rollout.tokens: recompute``): sample as a plain chat client, rebuild
the training data afterwards.

The exact pattern (the default) samples with token-id prompts on ``/v1/completions`` and keeps the
engine's own completion ids and processed logprobs. Here each sample is instead what any
OpenAI-compatible client gets in production: one ``/v1/chat/completions`` request with the
conversation as messages, answered with text and a finish reason, no token ids, no logprobs. The
training data is then rebuilt from that text, against the same policy version:

1. **ids.** The prompt is the conversation rendered by the model's chat template (the ids the
   :class:`~rft_runtime.rollout.conversation.TokenConversation` holds, the same as the exact
   pattern's); the completion is the reply's text encoded by the tokenizer, plus the end-of-turn token
   when the engine stopped on it (``finish_reason: stop`` with no stop string; a ``stop_token_ids``
   hit appends that id; a stop *string* is not in the text and is not appended).
2. **logprobs.** One prefill request, ``/v1/completions`` with the prompt and completion ids as the
   prompt, ``prompt_logprobs: 0`` and ``max_tokens: 1``, at the policy version that sampled (the
   adapter of that version, or the served version the engine reports). Its prompt logprobs at the
   completion positions are the sample's logprobs. Engines return prompt logprobs before temperature
   (raw ``log_softmax``), so the pattern needs ``rollout.temperature: 1`` (the API refuses others).
   When the engine answers the prefill at another policy version than the chat request (a publication
   in between), the sample is drawn again, at most ``max_attempts`` times.

What it costs (docs/rollout-tokens.md): the re-encoded ids can differ from those the engine sampled
(re-tokenisation drift: a non-canonical or partial-UTF-8 tokenisation, text the server strips), so the
trainer may train on tokens the model never sampled, with the logprobs the model gives *them*; and
one extra prefill of the whole sequence per sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..types import Sample
from .chat_template import ChatTokenizer
from .client import InferenceClient
from .concurrency import run_all
from .errors import ReplicaBehind, RolloutInfraError, SampleAborted, TokenContractError
from .response import response_policy_version
from .sampling import SamplingParams, engine_sample

# SamplingParams.extra keys that are sampling settings of a chat request too (vLLM's names).
_CHAT_EXTRA = frozenset({"stop", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                         "spaces_between_special_tokens", "min_tokens", "repetition_penalty"})


@dataclass(frozen=True)
class _Reply:
    text: str
    finish: str
    stop_reason: int | str | None
    version: int | None
    server: str
    sampled_ids: list[int] | None


class RecomputeSampler:
    """Draws samples through the plain chat route and rebuilds their ids and logprobs (see the module
    docstring). ``stats`` counts chat requests, prefills, re-drawn samples and rebuilt tokens.

    With ``measure_drift`` the chat request also asks for ``return_token_ids`` (builtin and vLLM
    answer it; the rebuild never uses them): each sample's ``metadata["sampled_ids_kept"]`` then says
    whether the rebuilt ids are those the engine sampled, and ``stats`` counts the samples measured
    and drifted."""

    def __init__(self, inference: InferenceClient, tokenizer: ChatTokenizer, *, max_attempts: int = 3,
                 measure_drift: bool = True) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.inference = inference
        self.tokenizer = tokenizer
        self.max_attempts = max_attempts
        self.measure_drift = measure_drift
        closer = tokenizer.assistant_closer()
        end = closer[0] if closer else tokenizer.eos_token_id
        if end is None:
            raise TokenContractError("the tokenizer has neither an assistant closer nor an eos token: "
                                     "the end of a reply cannot be rebuilt")
        self.end_of_turn_id: int = int(end)
        self.stats = {"chat_requests": 0, "prefills": 0, "redrawn": 0, "rebuilt_tokens": 0, "measured": 0, "drifted": 0}

    async def sample(
        self,
        messages: Sequence[Mapping[str, Any]],
        prompt_ids: list[int],
        n: int,
        sampling: SamplingParams,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        policy_version: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Sample]:
        """``n`` samples of the reply to ``messages``, whose rendering is ``prompt_ids``; one chat
        request and one prefill each, concurrently, in seed order."""
        if sampling.temperature != 1.0:
            raise ValueError(f"rollout.tokens=recompute needs rollout.temperature 1.0 (engines return prompt "
                             f"logprobs before temperature), got {sampling.temperature}")
        if seeds is None:
            seeds = [sampling.seed + i if sampling.seed is not None else self.inference.new_seed() for i in range(n)]
        elif len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for n={n}")
        msgs = [dict(m) for m in messages]
        return await run_all([self._one(msgs, list(prompt_ids), sampling, tools, policy_version, s) for s in seeds])

    async def _one(self, messages: list[dict[str, Any]], prompt_ids: list[int], sampling: SamplingParams,
                   tools: Sequence[Mapping[str, Any]] | None, policy_version: int | None, seed: int | None) -> Sample:
        for _ in range(self.max_attempts):
            reply = await self._chat(messages, sampling, tools, policy_version, seed)
            completion = self.rebuild_ids(reply.text, reply.finish, reply.stop_reason)
            logprobs, prefill_version = await self.prefill(prompt_ids, completion, reply.version)
            if reply.version is None or prefill_version is None or prefill_version == reply.version:
                sample = engine_sample(
                    prompt_ids=prompt_ids, completion_ids=completion, logprobs=logprobs, finish_reason=reply.finish,
                    policy_version=reply.version if reply.version is not None else policy_version, text=reply.text,
                    seed=seed, stop_reason=reply.stop_reason, server=reply.server,
                )
                self.stats["rebuilt_tokens"] += len(completion)
                sample.metadata["tokens"] = "recompute"
                if reply.sampled_ids is not None:  # the engine told which ids it sampled: measure the drift
                    kept = reply.sampled_ids == completion
                    sample.metadata["sampled_ids_kept"] = kept
                    self.stats["measured"] += 1
                    self.stats["drifted"] += not kept
                return sample
            self.stats["redrawn"] += 1
        raise RolloutInfraError(
            f"the engine's policy version changed between the chat request and its prefill {self.max_attempts} "
            "times in a row: the sample's logprobs cannot be rebuilt at the version that sampled it")

    def rebuild_ids(self, text: str, finish: str, stop_reason: int | str | None) -> list[int]:
        """The completion ids of a reply: its text encoded, plus the end-of-turn (or stop) token it
        stopped on."""
        ids = self.tokenizer.encode_text(text) if text else []
        if finish == "stop":
            if isinstance(stop_reason, int) and not isinstance(stop_reason, bool):
                ids.append(stop_reason)
            elif stop_reason is None:
                ids.append(self.end_of_turn_id)
        return ids

    async def _chat(self, messages: list[dict[str, Any]], sampling: SamplingParams,
                    tools: Sequence[Mapping[str, Any]] | None, policy_version: int | None,
                    seed: int | None) -> _Reply:
        model = self.inference.model_for(policy_version)
        body: dict[str, Any] = {"model": model, "messages": messages, "n": 1, **sampling.sampling_fields(seed)}
        body.update({k: v for k, v in sampling.extra.items() if k in _CHAT_EXTRA})
        if tools:
            body["tools"] = list(tools)
        if self.measure_drift:
            body["return_token_ids"] = True

        def parse(resp: Any, headers: Mapping[str, str], url: str) -> _Reply:
            choice = _only_choice(resp, url)
            self._check_model(resp, model, url)
            finish = choice.get("finish_reason")
            if finish == "abort":
                raise SampleAborted(f"{url}: the engine aborted the sample")
            if finish == "tool_calls":
                finish = "stop"
            if finish not in ("stop", "length"):
                raise TokenContractError(f"{url}: unexpected finish_reason {finish!r}")
            message = choice.get("message")
            content = message.get("content") if isinstance(message, Mapping) else None
            if content is not None and not isinstance(content, str):
                raise TokenContractError(f"{url}: the reply's content is not text")
            version = self._version(resp, headers, policy_version, url)
            sampled = choice.get("token_ids")
            sampled = sampled if isinstance(sampled, list) and all(type(t) is int for t in sampled) else None
            return _Reply(content or "", finish, choice.get("stop_reason"), version, url, sampled)

        self.stats["chat_requests"] += 1
        return await self.inference.post_json("/v1/chat/completions", body, parse)

    async def prefill(self, prompt_ids: list[int], completion: list[int],
                      policy_version: int | None) -> tuple[list[float], int | None]:
        """The logprobs of ``completion`` after ``prompt_ids`` from one prefill at ``policy_version``,
        and the version the engine reports for it. No request for an empty completion."""
        if not completion:
            return [], policy_version
        full = prompt_ids + completion
        model = self.inference.model_for(policy_version)
        body = {"model": model, "prompt": full, "n": 1, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}

        def parse(resp: Any, headers: Mapping[str, str], url: str) -> tuple[list[float], int | None]:
            choice = _only_choice(resp, url)
            self._check_model(resp, model, url)
            plps = choice.get("prompt_logprobs", resp.get("prompt_logprobs"))
            if not isinstance(plps, list) or len(plps) != len(full):
                raise TokenContractError(f"{url}: the prefill returned no prompt_logprobs for its {len(full)} ids")
            out = []
            for pos in range(len(prompt_ids), len(full)):
                entry = plps[pos]
                item = entry.get(str(full[pos])) if isinstance(entry, Mapping) else None
                lp = item.get("logprob") if isinstance(item, Mapping) else None
                if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
                    raise TokenContractError(f"{url}: prompt_logprobs[{pos}] has no logprob for token {full[pos]}")
                out.append(float(lp))
            return out, self._version(resp, headers, None, url)

        self.stats["prefills"] += 1
        return await self.inference.post_json("/v1/completions", body, parse)

    def _check_model(self, resp: Mapping[str, Any], model: str, url: str) -> None:
        if self.inference.adapter_versions and resp.get("model") != model:
            raise TokenContractError(f"{url}: asked for model {model!r}, the answer names {resp.get('model')!r}")

    def _version(self, resp: Mapping[str, Any], headers: Mapping[str, str], granted: int | None, url: str) -> int | None:
        served = response_policy_version(resp, headers)
        if granted is not None and served is not None and served < granted:
            self.inference.stats["replica_behind"] += 1
            raise ReplicaBehind(f"{url} serves policy version {served}, the task was granted {granted}")
        if served is None and self.inference.adapter_versions:
            return granted
        return served


def _only_choice(resp: Any, url: str) -> Mapping[str, Any]:
    choices = resp.get("choices") if isinstance(resp, Mapping) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        raise TokenContractError(f"{url}: expected one choice, got {choices!r:.200}")
    return choices[0]
