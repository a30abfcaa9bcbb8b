"""Fixtures for the rollout tests: real HTTP servers on 127.0.0.1.

- `ReplayServer`: answers `/v1/completions` with the recorded vLLM responses of
  `contracts/vllm/` (matched by request body), or, for requests the recordings do not cover,
  with a response derived from a recording (its completion, the request's prompt echoed) or with a
  scripted completion. Faults (HTTP statuses, dropped connections, hangs, engine aborts, tampered
  bodies) can be queued, globally or for one seed.
- `TinyModelServer`: a real engine: the tiny Qwen2 model of `contracts/vllm/tiny-qwen2` sampled with
  transformers/torch (seeded, processed logprobs = log_softmax(logits / T)).
- `builtin_server`: our builtin server (`rft_runtime.serve.server.create_app`) on the same model.
- `real_server`: parametrised over both real engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest
from aiohttp import web

from tests.support.ports import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONTRACTS = Path(os.environ.get("RFT_VLLM_CONTRACTS", Path(__file__).resolve().parents[1] / "contracts" / "vllm"))
if not CONTRACTS.is_dir():  # the repo's sibling checkout layout
    CONTRACTS = Path(__file__).resolve().parents[3] / "shared" / "contracts" / "vllm"
TINY_MODEL = CONTRACTS / "tiny-qwen2"
MODEL_NAME = "tiny"


def load_fixture(mode: str, case: str) -> dict[str, Any]:
    """A recorded request/response pair: `load_fixture("processed_logprobs", "completions_n2")`."""
    return json.loads((CONTRACTS / f"{mode}__{case}.json").read_text())


def _request_key(body: dict[str, Any]) -> str:
    b = {k: v for k, v in body.items() if k not in ("return_tokens_as_token_ids",)}
    if b.get("n") == 1:
        del b["n"]
    return json.dumps(b, sort_keys=True)


@contextlib.asynccontextmanager
async def serve_app(app: web.Application) -> AsyncIterator[str]:
    """Run `app` on 127.0.0.1:<free port>; yields the base URL; stops it afterwards."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class ReplayServer:
    """Recorded vLLM responses over real HTTP, with injectable faults.

    `faults` is consumed one entry per request: an int (that HTTP status, vLLM error body), a tuple
    (status, retry_after_seconds), "drop" (close the connection without answering), "hang" (never
    answer), "abort" (finish_reason "abort"), or a callable applied to the response body before it is
    sent. `seed_faults[seed]` does the same for requests carrying that seed only.
    `script` (list of completion id lists) answers unrecorded requests in order, one per request.
    """

    def __init__(self, mode: str = "processed_logprobs", *, derive: bool = True, policy_version: int | None = None,
                 delay_s: float = 0.0) -> None:
        self.mode = mode
        self.derive = derive
        self.policy_version = policy_version
        self.delay_s = delay_s
        self.recorded: dict[str, dict[str, Any]] = {}
        for f in sorted(CONTRACTS.glob(f"{mode}__*.json")):
            d = json.loads(f.read_text())
            if isinstance(d, dict) and d.get("path") == "/v1/completions" and isinstance(d["request"].get("prompt"), list):
                self.recorded.setdefault(_request_key(d["request"]), d)
        self.base = load_fixture(mode, "completions_tokens_in_logprobs")["response"]
        self.faults: list[Any] = []
        self.seed_faults: dict[int, list[Any]] = {}
        self.script: list[list[int]] = []
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self._completions)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            fault = None
            seed_q = self.seed_faults.get(body.get("seed"))
            if seed_q:
                fault = seed_q.pop(0)
            elif self.faults:
                fault = self.faults.pop(0)
            if fault == "drop":
                assert request.transport is not None
                request.transport.close()
                raise ConnectionResetError("dropped by the test server")
            if fault == "hang":
                await asyncio.sleep(3600)
            if isinstance(fault, int) or isinstance(fault, tuple):
                status, retry_after = fault if isinstance(fault, tuple) else (fault, None)
                headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                err = {"error": {"message": f"injected {status}", "type": "Injected", "param": None, "code": status}}
                return web.json_response(err, status=status, headers=headers)
            status, resp = self._answer(body)
            resp = copy.deepcopy(resp)
            if status == 200 and fault == "abort":
                for c in resp["choices"]:
                    c["finish_reason"] = "abort"
            if callable(fault):
                fault(resp)
            headers = {}
            if self.policy_version is not None and status == 200:
                headers["x-policy-version"] = str(self.policy_version)
            return web.json_response(resp, status=status, headers=headers)
        finally:
            self.in_flight -= 1

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        rec = self.recorded.get(_request_key(body))
        if rec is not None:
            return rec["status"], rec["response"]
        if self.script:
            ids = self.script.pop(0)[: body["max_tokens"]]
            return 200, self._response(body, ids, [-1.0] * len(ids), "stop" if ids and ids[-1] == 2 else "length")
        if not self.derive:
            return 400, {"error": {"message": "no recorded response for this request", "code": 400}}
        choice = self.base["choices"][0]
        k = body["max_tokens"]
        return 200, self._response(body, choice["token_ids"][:k], choice["logprobs"]["token_logprobs"][:k], "length")

    def _response(self, body: dict[str, Any], ids: list[int], lps: list[float], finish: str) -> dict[str, Any]:
        resp = copy.deepcopy(self.base)
        c = resp["choices"][0]
        c.update(token_ids=list(ids), prompt_token_ids=list(body["prompt"]), finish_reason=finish, text="")
        c["logprobs"] = {
            "text_offset": [0] * len(ids),
            "token_logprobs": list(lps),
            "tokens": [f"token_id:{t}" for t in ids],
            "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(ids, lps)],
        }
        n = int(body.get("n") or 1)  # a request of n: n such choices, indexed
        resp["choices"] = [{**copy.deepcopy(c), "index": j} for j in range(n)]
        resp["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n * len(ids),
                         "total_tokens": len(body["prompt"]) + n * len(ids)}
        return resp


class TinyModelServer:
    """A real (minimal) engine on the tiny model: seeded sampling, processed logprobs.

    Reports its policy version in the response body (`policy_version`).
    """

    def __init__(self, model_dir: Path = TINY_MODEL, policy_version: int = 3) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
        self.eos = int(self.model.config.eos_token_id)
        self.vocab = int(self.model.config.vocab_size)
        self.policy_version = policy_version
        self.requests: list[dict[str, Any]] = []

    def make_app(self) -> web.Application:
        """A fresh aiohttp application routed to this engine."""
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        return app

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if body.get("model") != MODEL_NAME:
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                "type": "NotFoundError", "param": "model", "code": 404}}, status=404)
        prompt = body["prompt"]
        if any(not 0 <= t < self.vocab for t in prompt):
            return web.json_response({"error": {"message": "Token id out of vocabulary", "code": 400}}, status=400)
        n = body.get("n", 1)
        seed = body.get("seed")
        choices = []
        for i in range(n):
            ids, lps, finish = await asyncio.to_thread(
                self._generate, prompt, body["max_tokens"], float(body.get("temperature", 1.0)),
                None if seed is None else seed + i, set(body.get("stop_token_ids") or []) | {self.eos},
            )
            choices.append({
                "index": i, "text": "", "finish_reason": finish, "stop_reason": ids[-1] if finish == "stop" else None,
                "token_ids": ids, "prompt_token_ids": list(prompt),
                "logprobs": {"token_logprobs": lps, "tokens": [f"token_id:{t}" for t in ids],
                             "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(ids, lps)],
                             "text_offset": [0] * len(ids)},
            })
        total = sum(len(c["token_ids"]) for c in choices)
        return web.json_response({
            "id": "cmpl-tiny", "object": "text_completion", "model": MODEL_NAME, "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": total, "total_tokens": len(prompt) + total},
            "policy_version": self.policy_version,
        })

    def _generate(self, prompt: list[int], max_tokens: int, temperature: float, seed: int | None,
                  stop: set[int]) -> tuple[list[int], list[float], str]:
        torch = self.torch
        g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
        seq = list(prompt)
        ids: list[int] = []
        lps: list[float] = []
        with torch.no_grad():
            for _ in range(max_tokens):
                logits = self.model(torch.tensor([seq])).logits[0, -1].float()
                if temperature > 0:
                    logp = torch.log_softmax(logits / temperature, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=g))
                else:
                    logp = torch.log_softmax(logits, -1)
                    tok = int(torch.argmax(logits))
                ids.append(tok)
                lps.append(float(logp[tok]))
                seq.append(tok)
                if tok in stop:
                    return ids, lps, "stop"
        return ids, lps, "length"


@pytest.fixture
async def replay() -> AsyncIterator[tuple[ReplayServer, str]]:
    """(server, base_url) replaying the processed-logprobs recordings."""
    server = ReplayServer()
    async with serve_app(server.app) as url:
        yield server, url


@pytest.fixture(scope="session")
def tiny_engine() -> TinyModelServer:
    """The tiny-model engine (model loaded once per session)."""
    return TinyModelServer()


@pytest.fixture
async def tiny_server(tiny_engine: TinyModelServer) -> AsyncIterator[tuple[TinyModelServer, str]]:
    """(engine, base_url) of the tiny-model engine on a free port."""
    tiny_engine.requests.clear()
    async with serve_app(tiny_engine.make_app()) as url:
        yield tiny_engine, url


@pytest.fixture(scope="session")
def builtin_engine() -> Iterator[Any]:
    """Our builtin server's engine on the tiny model (loaded once per session, stopped at the end);
    skips the tests that need it while `rft_runtime.serve` is not there."""
    try:
        from rft_runtime.serve.engine import Engine
        from rft_runtime.serve.model import load_model
    except ImportError as e:
        pytest.skip(f"builtin server not available: {e}")
    import torch

    torch.set_num_threads(1)
    engine = Engine(load_model(TINY_MODEL, device="cpu", dtype="float32"), max_batch_size=8, policy_version=5)
    yield engine
    engine.stop()


@contextlib.asynccontextmanager
async def builtin_app_url(engine: Any) -> AsyncIterator[str]:
    """`rft_runtime.serve.server.create_app` for `engine`, served as "tiny" on a free port."""
    from rft_runtime.serve.server import create_app

    async with serve_app(create_app(engine, MODEL_NAME)) as url:
        yield url


@pytest.fixture
async def builtin_server(builtin_engine: Any) -> AsyncIterator[str]:
    """Base URL of our builtin server on the tiny model (policy version 5 unless a test changes it)."""
    async with builtin_app_url(builtin_engine) as url:
        yield url


@pytest.fixture(scope="session")
def chat_tokenizer():
    """`ChatTokenizer` of the tiny model."""
    from rft_runtime.rollout import ChatTokenizer

    return ChatTokenizer.from_pretrained(TINY_MODEL)


@pytest.fixture(params=["tiny_model_server", "builtin_server"])
async def real_server(request) -> AsyncIterator[str]:
    """Base URL of a real engine on the tiny model: the test engine above, then our builtin server."""
    if request.param == "tiny_model_server":
        engine = request.getfixturevalue("tiny_engine")
        engine.requests.clear()
        async with serve_app(engine.make_app()) as url:
            yield url
    else:
        async with builtin_app_url(request.getfixturevalue("builtin_engine")) as url:
            yield url


OPEN_CLIENTS: list[Any] = []
"""Inference clients a test's helper opened without ``async with``: :func:`close_clients` closes them."""


@pytest.fixture
async def close_clients() -> AsyncIterator[None]:
    """Closes the clients in :data:`OPEN_CLIENTS` after the test, in its event loop."""
    yield
    while OPEN_CLIENTS:
        await OPEN_CLIENTS.pop().aclose()
