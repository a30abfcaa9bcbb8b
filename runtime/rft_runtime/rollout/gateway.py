"""The recording gateway: an OpenAI-compatible endpoint per episode, so an agent runs unchanged.

A rollout pod serves it on its loopback (``127.0.0.1``, a free port) while bundle rollouts run. Each
episode the pod rolls out gets its own base URL and key::

    OPENAI_BASE_URL=http://127.0.0.1:<port>/e/<episode-id>/v1
    OPENAI_API_KEY=<a random key of that episode alone>

(``client.base_url`` / ``client.api_key`` of the injected client, and ``client.openai_env()`` for a
subprocess). Routes under the base URL:

- ``POST /chat/completions``: messages, tools, ``n``, ``stream`` (server-sent events, one content
  chunk per choice); answered by the episode's training-aware chat client
  (:class:`~rft_runtime.rollout.chat_client.ChatClient`), which renders the chat template locally,
  samples token ids at the policy version granted for the episode and records every sample (prompt
  ids, completion ids, log-probs). A call whose messages continue a reply it returned extends that
  conversation's ids (mask 0 on tool and environment tokens); a call that does not is a further step
  of the same trajectory (step-wise: :mod:`~rft_runtime.rollout.recorder`).
- ``POST /completions``: a text prompt or a list of token ids; each call is a step.
- ``GET /models``: the one model the episode may name.

Refused with an OpenAI-shaped error (``{"error": {"message", "type", "param", "code"}}``) and
nothing recorded: an episode that is not open in this pod (404 ``episode_not_found``) or already
finished (409 ``episode_closed``), a missing or wrong key (401 ``invalid_api_key``), a model name
other than the served one (404 ``model_not_found``), a body over the size limit (413), a prompt over
``rollout.maxPromptTokens`` (400 ``context_length_exceeded``), ``max_tokens`` over the job's
``maxOutputTokens`` (400 ``max_tokens_exceeded``), a turn over ``rollout.maxTurns`` (400
``max_turns_exceeded``; the episode then ends with termination reason ``max_turns``), and the
arguments the training-aware client refuses (400, the argument named). An inference failure that
is not the request's fault answers 502 and gives the task back (the episode is not posted).
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from aiohttp import web

from .chat_client import ChatClient
from .conversation import TokenConversation
from .errors import InferenceHTTPError, MaxTurnsReached, PromptTooLong, RolloutInfraError
from .openai_types import ChatCompletion
from .recorder import RolloutRecorder

MAX_REQUEST_BYTES = 16 * 2**20
"""The largest request body the gateway reads."""
CLOSED_REMEMBERED = 4096
"""How many finished episodes the gateway remembers, to answer a late call ``episode_closed``."""
# Top-level request fields the OpenAI SDK writes from `extra_body`, passed on to the client's extra_body.
_EXTRA_BODY_FIELDS = frozenset({"top_k", "stop_token_ids", "ignore_eos", "include_stop_str_in_output",
                                "skip_special_tokens", "spaces_between_special_tokens"})


class GatewayError(Exception):
    """A refused request: its HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> web.Response:
        """The error as an OpenAI-shaped JSON response."""
        return web.json_response({"error": {"message": self.message, "type": self.type, "param": self.param,
                                            "code": self.code}}, status=self.status)


@dataclass
class EpisodeEndpoint:
    """One open episode: its recording client (step-wise view), URL, key and what its calls hit."""

    episode_id: str
    client: ChatClient
    base_url: str
    api_key: str
    calls: int = 0
    limit_error: MaxTurnsReached | PromptTooLong | None = None
    """The first length limit a call ran into (the worker ends the episode on it)."""
    infra_error: RolloutInfraError | None = None
    """The first inference failure that was not the request's fault (the worker gives the task back)."""


class RecordingGateway:
    """The per-pod gateway (see the module docstring). ``await start()`` once, ``open``/``close`` an
    episode around its rollout, ``await aclose()`` at the end."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.host, self.port = host, port
        self.max_request_bytes = max_request_bytes
        self.url = ""
        self._open: dict[str, EpisodeEndpoint] = {}
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Serve on ``host:port`` (port 0: a free one); returns the gateway's root URL."""
        if self._runner is not None:
            return self.url
        app = web.Application(client_max_size=self.max_request_bytes)
        for route in ("chat/completions", "completions"):
            app.router.add_post("/e/{episode}/v1/" + route, self._handle)
        app.router.add_get("/e/{episode}/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        return self.url

    async def aclose(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, episode_id: str, client: ChatClient) -> EpisodeEndpoint:
        """Open ``episode_id`` for calls recorded by ``client``'s recorder (a step-wise view of it);
        sets ``client.base_url`` and ``client.api_key``."""
        if not self.url:
            raise RuntimeError("the gateway is not started")
        # a task leased again while its earlier run is still open: the new run's endpoint replaces it
        self._closed.pop(episode_id, None)
        view = client.with_trajectory(client.trajectory)
        view.stepwise = True
        ep = EpisodeEndpoint(episode_id, view, f"{self.url}/e/{episode_id}/v1", f"rft-ep-{secrets.token_urlsafe(24)}")
        client.base_url = view.base_url = ep.base_url
        client.api_key = view.api_key = ep.api_key
        self._open[episode_id] = ep
        return ep

    def close(self, endpoint: EpisodeEndpoint) -> None:
        """End ``endpoint``'s episode: later calls are refused with ``episode_closed``."""
        episode_id = endpoint.episode_id
        # a call still in flight records into a recorder nobody reads: the episode is already built
        endpoint.client.recorder = RolloutRecorder()
        if self._open.get(episode_id) is endpoint:
            del self._open[episode_id]
            self._closed[episode_id] = None
            while len(self._closed) > CLOSED_REMEMBERED:
                self._closed.popitem(last=False)

    def _endpoint(self, request: web.Request) -> EpisodeEndpoint:
        eid = request.match_info["episode"]
        ep = self._open.get(eid)
        if ep is None:
            if eid in self._closed:
                raise GatewayError(409, f"episode {eid!r} is finished (its rollout returned); no call is "
                                        "recorded after that", code="episode_closed")
            raise GatewayError(404, f"episode {eid!r} is not being rolled out by this pod", code="episode_not_found")
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {ep.api_key}".encode()):
            raise GatewayError(401, f"missing or wrong API key for episode {eid!r}: send 'Authorization: Bearer "
                                    "<OPENAI_API_KEY of this episode>'", type="authentication_error",
                               code="invalid_api_key")
        return ep

    async def _models(self, request: web.Request) -> web.StreamResponse:
        try:
            ep = self._endpoint(request)
        except GatewayError as e:
            return e.response()
        model = ep.client.inference.model
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "rft"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            ep = self._endpoint(request)
            body = await _read_json(request)
            _check_model(ep, body.get("model"))
            _check_max_tokens(ep, body)
            stream, include_usage = _stream_flags(body)
            chat = request.path.endswith("/chat/completions")
            result = await (self._chat(ep, body) if chat else self._completion(ep, body))
        except GatewayError as e:
            return e.response()
        ep.calls += 1
        if stream:
            return await _stream(request, result, chat=chat, include_usage=include_usage)
        return web.json_response(result)

    async def _chat(self, ep: EpisodeEndpoint, body: dict[str, Any]) -> dict[str, Any]:
        kwargs = _chat_kwargs(body)
        async with _Refusals(ep):
            completion: ChatCompletion = await ep.client.create_chat_completion(**kwargs)
        out = completion.model_dump()
        out["model"] = body["model"]
        for choice in out["choices"]:
            if not choice["message"].get("tool_calls"):
                choice["message"].pop("tool_calls", None)
        return out

    async def _completion(self, ep: EpisodeEndpoint, body: dict[str, Any]) -> dict[str, Any]:
        """``/v1/completions``: one step per call (text prompts encoded without chat template)."""
        client = ep.client
        prompt_ids = _prompt_ids(client, body.get("prompt"))
        if client.max_prompt_tokens is not None and len(prompt_ids) > client.max_prompt_tokens:
            raise GatewayError(400, f"the prompt has {len(prompt_ids)} tokens, more than the job's "
                                    f"rollout.maxPromptTokens {client.max_prompt_tokens}", param="prompt",
                               code="context_length_exceeded")
        n = body.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise GatewayError(400, f"n must be an integer >= 1, got {n!r}", param="n")
        _refuse_unsupported(body, allowed={"prompt", "n", "echo", "suffix", "best_of"})
        extra = {k: body[k] for k in _EXTRA_BODY_FIELDS - {"top_k"} if k in body}
        async with _Refusals(ep):
            sampling = client._call_sampling(body.get("max_tokens"), None, body.get("stop"), extra)
            seed = body.get("seed")
            seeds = [seed + i for i in range(n)] if isinstance(seed, int) else None
            samples = await client.inference.complete(prompt_ids, n, sampling, policy_version=client.policy_version,
                                                      seeds=seeds)
        choices = []
        for i, s in enumerate(samples):
            text = client.tokenizer.decode(s.completion_ids)
            conv = TokenConversation(tokenizer=client.tokenizer, ids=list(prompt_ids), mask=[0] * len(prompt_ids),
                                     logprobs=[0.0] * len(prompt_ids), prompt_len=len(prompt_ids))
            message = {"role": "assistant", "content": text}
            conv.add_assistant(s, message)
            client.recorder.record(s, conv, message=message, message_obj=object(),
                                   history=[{"role": "completion", "content": json.dumps(prompt_ids)}], parent=None,
                                   trajectory_name=client.trajectory, stepwise=True)
            lp = {"tokens": [str(client.tokenizer.tokenizer.convert_ids_to_tokens(t)) for t in s.completion_ids],
                  "token_logprobs": list(s.logprobs)} if body.get("logprobs") else None
            choices.append({"index": i, "text": text, "finish_reason": s.finish_reason, "logprobs": lp,
                            "token_ids": list(s.completion_ids)})
        done = sum(len(s.completion_ids) for s in samples)
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": body["model"], "choices": choices, "prompt_token_ids": prompt_ids,
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": done,
                          "total_tokens": len(prompt_ids) + done}}


class _Refusals:
    """Turns what the chat client and the engine refuse into :class:`GatewayError` (and remembers on
    the endpoint a length limit or an inference failure for the worker)."""

    def __init__(self, ep: EpisodeEndpoint) -> None:
        self.ep = ep

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, e: BaseException | None, tb: Any) -> bool:
        if e is None or isinstance(e, GatewayError):
            return False
        if isinstance(e, PromptTooLong):
            self.ep.limit_error = self.ep.limit_error or e
            raise GatewayError(400, str(e), param="messages", code="context_length_exceeded") from None
        if isinstance(e, MaxTurnsReached):
            self.ep.limit_error = self.ep.limit_error or e
            raise GatewayError(400, str(e), param="messages", code="max_turns_exceeded") from None
        if isinstance(e, InferenceHTTPError) and e.is_request_error:
            raise GatewayError(e.status, e.server_message, param=e.param, code="engine_refused") from None
        if isinstance(e, RolloutInfraError):
            self.ep.infra_error = self.ep.infra_error or e
            raise GatewayError(502, f"inference failed: {e}", type="api_error", code="inference_unavailable") from None
        if isinstance(e, (ValueError, TypeError)):
            raise GatewayError(400, str(e), param=_param_of(str(e))) from None
        return False


async def _read_json(request: web.Request) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise GatewayError(413, f"the request body is larger than the gateway's limit of {request.app._client_max_size} "
                                "bytes", code="request_too_large") from None
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GatewayError(400, f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    return body


def _check_model(ep: EpisodeEndpoint, model: Any) -> None:
    inference = ep.client.inference
    served = {inference.model}
    if inference.adapter_versions and ep.client.policy_version is not None:
        served.add(inference.model_for(ep.client.policy_version))
    if model not in served:
        raise GatewayError(404, f"the model {model!r} is not served to episode {ep.episode_id!r}; name "
                                f"{inference.model!r} (GET {ep.base_url}/models)", param="model", code="model_not_found")


def _check_max_tokens(ep: EpisodeEndpoint, body: Mapping[str, Any]) -> None:
    limit = ep.client.sampling.max_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > limit:
            raise GatewayError(400, f"{name}={v} is more than the job's maxOutputTokens {limit}: ask for at most "
                                    f"{limit}, or leave it out", param=name, code="max_tokens_exceeded")


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(body.pop("stream", False))
    options = body.pop("stream_options", None) or {}
    return stream, bool(isinstance(options, dict) and options.get("include_usage"))


def _refuse_unsupported(body: Mapping[str, Any], allowed: set[str]) -> None:
    known = allowed | {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs", "user"} | _EXTRA_BODY_FIELDS
    unknown = sorted(set(body) - known)
    if unknown:
        raise GatewayError(400, f"unsupported argument(s): {', '.join(unknown)}", param=unknown[0])
    for name in ("echo", "suffix"):
        if body.get(name):
            raise GatewayError(400, f"{name} is not supported by the recording gateway", param=name)
    if body.get("best_of") not in (None, 1):
        raise GatewayError(400, "best_of is refused: the trainer could not reproduce the sampling", param="best_of")


def _chat_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The chat client's keyword arguments from a request body (``extra_body`` fields the SDK wrote at
    the top level go back into ``extra_body``)."""
    if "extra_body" in body:
        raise GatewayError(400, "extra_body is not supported: send its fields at the top level, as the OpenAI "
                                "SDK does", param="extra_body")
    kwargs = {k: v for k, v in body.items() if k not in _EXTRA_BODY_FIELDS}
    extra = {k: body[k] for k in _EXTRA_BODY_FIELDS if k in body}
    if extra:
        kwargs["extra_body"] = extra
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise GatewayError(400, "messages must be a non-empty list of chat messages", param="messages")
    if not all(isinstance(m, dict) for m in body["messages"]):
        raise GatewayError(400, "every message must be a JSON object", param="messages")
    return kwargs


def _prompt_ids(client: ChatClient, prompt: Any) -> list[int]:
    if isinstance(prompt, str) and prompt:
        return client.tokenizer.encode_text(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt_ids(client, prompt[0])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        return list(prompt)
    raise GatewayError(400, "prompt must be one non-empty string or one list of token ids", param="prompt")


def _param_of(message: str) -> str | None:
    """The argument a chat client refusal names (``"n must be ..."``, ``"... argument(s): top_logprobs"``)."""
    if "argument(s): " in message:
        return message.split("argument(s): ", 1)[1].split(",")[0].strip()
    first = message.split(" ", 1)[0].split("=", 1)[0]
    return first if first.isidentifier() else None


async def _stream(request: web.Request, result: dict[str, Any], *, chat: bool, include_usage: bool) -> web.StreamResponse:
    """``result`` as server-sent events: per choice one chunk with its whole content (and tool calls),
    then one with its finish reason; the usage chunk when asked for; ``data: [DONE]``."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    head = {"id": result["id"], "created": result["created"], "model": result["model"],
            "object": "chat.completion.chunk" if chat else "text_completion"}

    async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
        await resp.write(b"data: " + json.dumps({**head, "choices": choices, **extra}).encode() + b"\n\n")

    for c in result["choices"]:
        if chat:
            delta = {k: v for k, v in c["message"].items() if k in ("role", "content")}
            if c["message"].get("tool_calls"):
                delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(c["message"]["tool_calls"])]
            await send([{"index": c["index"], "delta": delta, "logprobs": c.get("logprobs"), "finish_reason": None,
                         "token_ids": c.get("token_ids")}])
            await send([{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}])
        else:
            await send([{"index": c["index"], "text": c["text"], "logprobs": c.get("logprobs"),
                         "finish_reason": c["finish_reason"], "token_ids": c.get("token_ids")}])
    if include_usage:
        await send([], usage=result["usage"])
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
