"""`InferenceClient`: token-id completions against one or more vLLM-compatible servers.

n samples per prompt carry consecutive seeds (the caller's `sampling.seed + i`, or a random base
seed + i). By default they are n parallel single-sample requests: a failed sample is retried alone,
with the same seed, so a retry cannot change which sample a slot holds, and one slow or failed
replica never costs the other samples. With ``n_per_request=True`` (the rollout role's client) they
are one request with ``n`` and the base seed: vLLM and the builtin server give choice ``j`` of such a
request seed ``seed + j``, so it draws exactly the samples of the n single requests, with the prompt
sent and rendered once, one HTTP exchange instead of n, and all n admitted to the engine together; a
failed request is retried whole, with the same seeds, so it cannot change the samples either.

Retries: 425, 429, 5xx, connection errors and engine aborts, with capped exponential backoff and
jitter, at most `retry.max_attempts` attempts within `retry.deadline_s`; any other 4xx raises
`InferenceHTTPError` at once with the server's message. An answer from a replica serving an older
policy version than the one the task was granted (`ReplicaBehind`: it restarted, or has not taken
the newest version yet) is discarded and retried like an abort. The concurrency limit counts samples
in flight (a request of ``n`` samples holds ``n`` slots, at most all of them; a request waiting out
its backoff holds none). Replicas are used round-robin, so a retry normally lands on another
replica.

With ``adapter_versions=True`` (an engine serving each policy version as a LoRA adapter, see
:mod:`rft_runtime.adapters`) a sample of policy version ``v`` requests model ``<model>-v<v>``, the
engine's echo of that name is checked, and a 404 for the model is retried like a 5xx: the adapter
is being (re)loaded into a restarted server, or was retired while the request waited, in which case
the attempts run out and the caller gives its task back.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from typing import Any, AsyncIterator, Mapping, Sequence

import aiohttp

from .. import auth
from ..adapters import adapter_name
from ..timeouts import LazySession, session_timeout
from ..types import Sample
from .concurrency import run_all
from .errors import InferenceHTTPError, InferenceUnavailableError, ReplicaBehind, SampleAborted, TokenContractError
from .response import parse_completions
from .retry import RetryPolicy, is_retryable_status, parse_retry_after
from .sampling import SamplingParams, check_ids

log = logging.getLogger(__name__)

SEED_RANGE = 2**31 - 1
JSON_HEADERS = {"content-type": "application/json"}


class InferenceClient:
    """Async client for `/v1/completions` with token-id prompts and the token contract enforced.

    Use as `async with InferenceClient(...) as client:` or call `aclose()`.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        model: str,
        *,
        max_concurrency: int = 64,
        retry: RetryPolicy | None = None,
        api_key: str | None = None,
        require_prompt_echo: bool = True,
        rng: random.Random | None = None,
        adapter_versions: bool = False,
        n_per_request: bool = False,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"base_urls must be one or more http(s) URLs, got {base_urls!r}")
        if not model:
            raise ValueError("model must be the served model name")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.adapter_versions = adapter_versions
        self.n_per_request = n_per_request
        self.retry = retry or RetryPolicy()
        self.require_prompt_echo = require_prompt_echo
        self._rr = itertools.cycle(range(len(self.base_urls)))
        self._slots = _Slots(max_concurrency)
        self._rng = rng or random.Random()
        # api_key, else the job's token ($RFT_JOB_TOKEN); at most one connection per request in flight
        self._http = LazySession(self.base_urls, auth.client_headers(api_key), connections=max_concurrency)
        self.stats = {"requests": 0, "retries": 0, "failures": 0, "replica_behind": 0}

    async def __aenter__(self) -> "InferenceClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def new_seed(self) -> int:
        """A fresh random seed for one sample."""
        return self._rng.randrange(SEED_RANGE)

    async def complete(
        self,
        prompt_ids: Sequence[int],
        n: int = 1,
        sampling: SamplingParams | None = None,
        *,
        policy_version: int | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Sample]:
        """Sample `n` completions of `prompt_ids`; returns them in seed order.

        `policy_version` is recorded on samples whose engine does not report one. `seeds` overrides
        the per-sample seeds (length `n`). Raises `InferenceHTTPError`, `InferenceUnavailableError`
        or `TokenContractError`; on any error the other samples of the call are cancelled.
        """
        ids = list(prompt_ids)
        check_ids("prompt_ids", ids)
        if not ids:
            raise ValueError("prompt_ids must not be empty")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        sampling = sampling or SamplingParams()
        if seeds is None:
            base = sampling.seed if sampling.seed is not None else self._rng.randrange(SEED_RANGE - n)
            seeds = [base + i for i in range(n)]
        elif len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for n={n}")
        if n == 1:
            return [await self.complete_one(ids, sampling, seed=seeds[0], policy_version=policy_version)]
        if self.n_per_request and all(s == seeds[0] + i for i, s in enumerate(seeds)):
            return await self._request(ids, sampling, seeds, policy_version)
        return await run_all([self.complete_one(ids, sampling, seed=s, policy_version=policy_version) for s in seeds])

    async def complete_one(
        self, prompt_ids: list[int], sampling: SamplingParams, *, seed: int | None, policy_version: int | None
    ) -> Sample:
        """One single-sample request (retried alone) → one `Sample`."""
        return (await self._request(prompt_ids, sampling, [seed], policy_version))[0]

    async def _request(self, prompt_ids: list[int], sampling: SamplingParams, seeds: Sequence[int | None],
                       policy_version: int | None) -> list[Sample]:
        """One request for ``len(seeds)`` samples (consecutive seeds: choice ``j`` is drawn with
        ``seeds[0] + j``), retried whole → the samples in seed order."""
        model = self.model_for(policy_version)
        n = len(seeds)
        body = {"model": model, "prompt": prompt_ids, "n": n, **sampling.request_fields(seeds[0])}

        def parse(resp_body: Any, headers: Mapping[str, str], url: str) -> list[Sample]:
            if self.adapter_versions and isinstance(resp_body, dict) and resp_body.get("model") != model:
                raise TokenContractError(f"{url}: asked for model {model!r}, the answer names {resp_body.get('model')!r}")
            samples = parse_completions(
                resp_body,
                headers,
                prompt_ids=prompt_ids,
                n=n,
                max_tokens=sampling.max_tokens,
                seeds=list(seeds),
                policy_version=policy_version,
                server=url,
                require_prompt_echo=self.require_prompt_echo,
            )
            for sample in samples:
                served = sample.policy_version
                if policy_version is not None and served is not None and served < policy_version:
                    self.stats["replica_behind"] += 1
                    raise ReplicaBehind(f"{url} serves policy version {served}, the task was granted {policy_version}")
            return samples

        return await self.post_json("/v1/completions", body, parse, weight=n)

    def model_for(self, policy_version: int | None) -> str:
        """The model name to request for ``policy_version``: the served name, or with
        ``adapter_versions`` the adapter of that version."""
        if not self.adapter_versions:
            return self.model
        if policy_version is None:
            raise ValueError("an engine serving adapters needs the policy version of every request")
        return adapter_name(self.model, policy_version)

    def _retryable(self, status: int, param: str | None) -> bool:
        return is_retryable_status(status) or (self.adapter_versions and status == 404 and param == "model")

    async def post_json(self, path: str, body: dict[str, Any], parse: Any, weight: int = 1) -> Any:
        """POST `body` with retries; `parse(json, headers, url)` turns a 200 answer into the result.
        ``weight``: the samples the request asks for (the concurrency slots it holds).

        A `SampleAborted` raised by `parse` is retried like a 5xx.
        """
        deadline = time.monotonic() + self.retry.deadline_s
        data = json.dumps(body, separators=(",", ":")).encode()
        http = self._http.get()
        last_error = "no attempt made"
        attempt = 0
        while attempt < self.retry.max_attempts:
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            url = self.base_urls[next(self._rr)] + path
            retry_after = None
            try:
                async with self._slots.hold(weight):
                    self.stats["requests"] += 1
                    async with http.post(url, data=data, headers=JSON_HEADERS,
                                         timeout=session_timeout(min(remaining, self.retry.attempt_timeout_s))) as resp:
                        status, headers, reason, raw = resp.status, resp.headers, resp.reason, await resp.read()
                if status == 200:
                    return parse(_json(raw, url), headers, url.removesuffix(path))
                message, param = _error_message(raw, reason)
                if not self._retryable(status, param):
                    self.stats["failures"] += 1
                    raise InferenceHTTPError(status, message, url=url, param=param)
                last_error = f"HTTP {status} from {url}: {message}"
                retry_after = parse_retry_after(headers.get("retry-after"))
            except (aiohttp.ClientError, asyncio.TimeoutError, SampleAborted) as e:
                last_error = f"{type(e).__name__} from {url}: {e}"
            if attempt >= self.retry.max_attempts:
                break
            delay = self.retry.backoff(attempt, self._rng, retry_after)
            if time.monotonic() + delay >= deadline:
                break
            self.stats["retries"] += 1
            log.info("retrying %s in %.2fs (attempt %d): %s", path, delay, attempt, last_error)
            await asyncio.sleep(delay)
        self.stats["failures"] += 1
        raise InferenceUnavailableError(f"POST {path} failed", attempts=attempt, last_error=last_error)


class _Slots:
    """A counting semaphore whose holders take several units at once (all of it at most), granted in
    arrival order: a request of n samples waits until n are free, and later ones queue behind it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._turn = asyncio.Lock()  # the head of the queue waits for units; the rest wait for the lock
        self._released = asyncio.Event()

    @contextlib.asynccontextmanager
    async def hold(self, units: int) -> AsyncIterator[None]:
        units = max(1, min(units, self.total))
        async with self._turn:
            while self.free < units:
                self._released.clear()
                await self._released.wait()
            self.free -= units
        try:
            yield
        finally:
            self.free += units
            self._released.set()


def _json(raw: bytes, url: str) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenContractError(f"{url}: 200 response is not JSON: {e}") from None


def _error_message(raw: bytes, reason: str | None) -> tuple[str, str | None]:
    """The server's error message and parameter from an OpenAI/vLLM error body, else the raw text."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode("utf-8", "replace")[:500] or (reason or ""), None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", err)), err.get("param")
    if isinstance(data, dict) and "message" in data:
        return str(data["message"]), data.get("param")
    return str(data)[:500], None
