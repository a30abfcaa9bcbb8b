"""A training-aware Eval Protocol rollout processor, and Eval Protocol rows as training episodes.

:class:`RFTRolloutProcessor` is an ``eval_protocol.pytest.RolloutProcessor``: an evaluation test that
names it (``@evaluation_test(rollout_processor=RFTRolloutProcessor(...))``) samples from this
project's inference (the builtin server or vLLM, ``/v1/completions`` with token-id prompts), so its
rows are training-ready:

- the row's conversation is rendered with the model's chat template into ``prompt_ids``;
- ``n`` completions are sampled (``completion_params["n"]``, else the processor's ``n``), each with the
  engine's processed log-prob of every sampled token;
- the first completion is appended as the assistant message (what a pointwise evaluation scores);
- ``execution_metadata.extra`` gets :func:`rft_runtime.rewards.eval_protocol.training_extra`'s fields
  (``prompt_ids: list[int]``, ``completion_ids: list[list[int]]``, ``inference_logprobs:
  list[list[float]]``, ``completions_text``, ``truncated``, ``finish_reasons``) plus
  ``policy_version``, merged into whatever ``extra`` already held.

:func:`split_row` turns a row with n completions into n rows of one completion (so each can be
scored), and :func:`episodes_from_rows` turns scored rows into the trainer's
:class:`~rft_runtime.types.Episode` objects (one per completion; the reward is
``evaluation_result.score``), grouped by ``input_metadata.row_id``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Sequence

from ..rewards.eval_protocol import import_eval_protocol, training_extra
from ..rollout.chat_template import ChatTokenizer
from ..rollout.client import InferenceClient
from ..rollout.sampling import SamplingParams
from ..types import Episode, Step, Trajectory

__all__ = ["RFTRolloutProcessor", "split_row", "episodes_from_rows"]

import_eval_protocol()
from eval_protocol.models import EvaluationRow, Message  # noqa: E402
from eval_protocol.pytest.rollout_processor import RolloutProcessor  # noqa: E402
from eval_protocol.pytest.types import RolloutProcessorConfig  # noqa: E402

_SAMPLING_KEYS = ("temperature", "max_tokens", "seed", "stop_token_ids")


def _chat_tokenizer(tokenizer: Any) -> ChatTokenizer:
    if isinstance(tokenizer, ChatTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = str(tokenizer)
        if path.startswith("builtin:"):
            from ..model.builtin import resolve_builtin_model

            path = str(resolve_builtin_model(path, None))
        return ChatTokenizer.from_pretrained(Path(path))
    return ChatTokenizer(tokenizer)


class RFTRolloutProcessor(RolloutProcessor):
    """Samples n token-exact completions per row from rft-operator inference (module docstring).

    ``base_url``: the inference server (default ``$RFT_INFERENCE_URL``); ``tokenizer``: the served
    model's tokenizer (a directory, ``builtin:<name>``, a Hugging Face tokenizer or a ChatTokenizer);
    ``model``: the served model name (default ``completion_params["model"]``); ``n``: completions per
    row unless ``completion_params["n"]`` says; ``api_key``: the job's token (default
    ``$RFT_JOB_TOKEN``). ``completion_params`` may set ``temperature``, ``max_tokens``, ``seed`` and
    ``stop_token_ids``.
    """

    def __init__(self, *, tokenizer: Any, base_url: str | None = None, model: str | None = None, n: int = 1,
                 api_key: str | None = None, max_concurrency: int = 64) -> None:
        url = base_url or os.environ.get("RFT_INFERENCE_URL")
        if not url:
            raise ValueError("RFTRolloutProcessor needs base_url (or $RFT_INFERENCE_URL): the inference server")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"RFTRolloutProcessor: n must be an integer >= 1, got {n!r}")
        self.base_url, self.model, self.n, self.api_key = url, model, n, api_key
        self.tokenizer = _chat_tokenizer(tokenizer)
        self.max_concurrency = max_concurrency
        self._clients: dict[tuple[int, str], InferenceClient] = {}

    def _client(self, model: str) -> InferenceClient:
        key = (id(asyncio.get_running_loop()), model)  # an HTTP client belongs to one event loop
        if key not in self._clients:
            self._clients[key] = InferenceClient(self.base_url, model, api_key=self.api_key,
                                                 max_concurrency=self.max_concurrency)
        return self._clients[key]

    def _sampling(self, params: dict[str, Any]) -> tuple[SamplingParams, int]:
        unknown = sorted(k for k in ("top_p", "top_k") if params.get(k) not in (None, 1.0, -1))
        if unknown:
            raise ValueError(f"completion_params {unknown} would bias the training log-probs; leave them unset")
        fields = {k: params[k] for k in _SAMPLING_KEYS if params.get(k) is not None}
        if "stop_token_ids" in fields:
            fields["stop_token_ids"] = tuple(fields["stop_token_ids"])
        n = int(params.get("n") or self.n)
        if n < 1:
            raise ValueError(f"completion_params n must be >= 1, got {n}")
        return SamplingParams(**fields), n

    async def rollout(self, row: EvaluationRow, params: dict[str, Any]) -> EvaluationRow:
        """One row: prompt rendered, n completions sampled, the row filled in (module docstring)."""
        model = self.model or params.get("model")
        if not model:
            raise ValueError("RFTRolloutProcessor needs model= or completion_params['model'] (the served model name)")
        sampling, n = self._sampling(params)
        conversation = [m.model_dump(exclude_none=True) for m in row.messages]
        prompt_ids = self.tokenizer.encode_chat(conversation, tools=row.tools)
        samples = await self._client(model).complete(prompt_ids, n, sampling)
        for s in samples:
            s.text = self.tokenizer.decode(s.completion_ids)
        first = samples[0]
        row.messages = [*row.messages, Message(role="assistant", content=first.text)]
        extra = dict(row.execution_metadata.extra or {})
        extra.update(training_extra(prompt_ids, samples))
        extra["policy_version"] = first.policy_version
        row.execution_metadata.extra = extra
        row.execution_metadata.finish_reason = first.finish_reason
        return row

    def __call__(self, rows: list[EvaluationRow], config: RolloutProcessorConfig) -> list[asyncio.Task[EvaluationRow]]:
        params = dict(config.completion_params or {})
        semaphore = config.semaphore

        async def one(row: EvaluationRow) -> EvaluationRow:
            async with semaphore:
                return await self.rollout(row, params)

        return [asyncio.create_task(one(r)) for r in rows]

    async def acleanup(self) -> None:
        """Close the clients of the running event loop (a client of another loop, one that ran earlier
        rows, cannot be closed from this one: its connections went with that loop)."""
        here = id(asyncio.get_running_loop())
        clients, self._clients = self._clients, {}
        for (loop_id, _), c in clients.items():
            if loop_id == here:
                await c.aclose()


def split_row(row: EvaluationRow) -> list[EvaluationRow]:
    """One row per sampled completion (its text as the assistant reply, its fields in ``extra`` as
    lists of one), so that each can be scored; a row with one completion comes back as a copy."""
    extra = dict(row.execution_metadata.extra or {})
    completions = extra.get("completion_ids")
    if not isinstance(completions, list) or not completions:
        raise ValueError("row has no execution_metadata.extra.completion_ids: was it rolled out by RFTRolloutProcessor?")
    history = row.messages[:-1] if row.messages and row.messages[-1].role == "assistant" else row.messages
    out = []
    for i in range(len(completions)):
        one = row.model_copy(deep=True)
        one.messages = [*(m.model_copy() for m in history),
                        Message(role="assistant", content=extra["completions_text"][i])]
        per = {k: [extra[k][i]] for k in ("completion_ids", "inference_logprobs", "completions_text", "truncated",
                                         "finish_reasons") if isinstance(extra.get(k), list)}
        one.execution_metadata.extra = {**extra, **per, "completion_index": i}
        one.evaluation_result = None
        out.append(one)
    return out


def episodes_from_rows(rows: Sequence[EvaluationRow]) -> list[Episode]:
    """The trainer's episodes of scored single-completion rows (:func:`split_row`'s), one each:
    task id ``input_metadata.row_id``, reward ``evaluation_result.score`` (None when unscored or
    ``is_score_valid`` is false), the step's tokens and log-probs from ``extra``."""
    counters: dict[str, int] = {}
    out = []
    for k, row in enumerate(rows):
        extra = row.execution_metadata.extra or {}
        completions = extra.get("completion_ids")
        if not isinstance(completions, list) or len(completions) != 1:
            got = len(completions) if isinstance(completions, list) else 0
            raise ValueError(f"rows[{k}]: needs exactly one completion in execution_metadata.extra (got {got}); "
                             "split rows with split_row first")
        task_id = row.input_metadata.row_id or f"row-{k}"
        idx = counters[task_id] = counters.get(task_id, -1) + 1
        result = row.evaluation_result
        reward = None if result is None or not result.is_score_valid else float(result.score)
        step = Step(prompt_ids=list(extra["prompt_ids"]), response_ids=list(completions[0]),
                    logprobs=list(extra["inference_logprobs"][0]), policy_version=extra.get("policy_version"),
                    reward=reward, done=True, finish_reason=(extra.get("finish_reasons") or [None])[0],
                    truncated=bool((extra.get("truncated") or [False])[0]),
                    messages=[m.model_dump(exclude_none=True) for m in row.messages[:-1]],
                    response_text=(extra.get("completions_text") or [None])[0])
        out.append(Episode(id=f"{task_id}:{idx}", task_id=task_id, rollout_idx=idx,
                           trajectories=[Trajectory(name="default", steps=[step], reward=reward)],
                           reward_reason=None if result is None else result.reason,
                           metadata={"policy_version": extra.get("policy_version"), "source": "eval-protocol"}))
    return out
