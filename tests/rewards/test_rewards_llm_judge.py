"""Builtin ``llm_judge`` against real HTTP servers: a small chat-completions server in the test, and
our builtin inference server on the tiny model."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rft_runtime.rewards import ConfigError, EvaluatorError, Item, Sample
from rft_runtime.rewards.builtins import LLMJudgeEvaluator
from rft_runtime.rewards.builtins.llm_judge import chat_completions_url
from tests.support.ports import free_port
from tests.support.processes import stop

from .conftest import ChatServer

FAST = {"backoffSeconds": 0.01, "maxBackoffSeconds": 0.05}


def judge(server: ChatServer, **extra: object) -> LLMJudgeEvaluator:
    return LLMJudgeEvaluator({"endpoint": server.url, "model": "judge-1", **FAST, **extra})


def test_endpoint_forms() -> None:
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/x/chat/completions") == "http://h:1/x/chat/completions"


async def test_judge_scores_with_default_template(chat_server: ChatServer) -> None:
    ev = judge(chat_server)
    sample = Sample.from_any({"messages": [{"role": "user", "content": "What is 6*7?"},
                                           {"role": "assistant", "content": "It is 42."}]})
    result = await ev.score(sample, Item(ground_truth="42"))
    await ev.aclose()
    assert result.reward == pytest.approx(0.8)  # "Score: 8" on the default 0..10 scale
    assert result.metrics == {"judge_prompt_tokens": 42.0, "judge_completion_tokens": 7.0, "judge_score": 8.0}
    sent = chat_server.requests[0]["json"]
    assert sent["model"] == "judge-1" and sent["temperature"] == 0.0 and sent["max_tokens"] == 256
    prompt = sent["messages"][-1]["content"]
    assert "What is 6*7?" in prompt and "It is 42." in prompt and "Reference answer:\n42" in prompt


async def test_custom_template_regex_and_raw_score(chat_server: ChatServer) -> None:
    chat_server.reply = "verdict=0.35 (partially right)"
    ev = judge(chat_server, promptTemplate="Topic {{item.metadata.topic}} / {{response}} / {{sample.finish_reason}}",
               scoreRegex=r"verdict=(\d+\.\d+)", systemPrompt="be strict", maxTokens=16)
    result = await ev.score(Sample(text="answer", finish_reason="stop"), Item(metadata={"topic": "algebra"}))
    await ev.aclose()
    assert result.reward == pytest.approx(0.35)  # no scoreMax with a custom template: the raw score
    msgs = chat_server.requests[0]["json"]["messages"]
    assert msgs[0] == {"role": "system", "content": "be strict"}
    assert msgs[1]["content"] == "Topic algebra / <answer>\nanswer\n</answer> / stop"  # the answer quoted as data


async def test_retries_429_and_5xx_then_succeeds(chat_server: ChatServer) -> None:
    chat_server.script = [(429, None, {"Retry-After": "0"}), (503, None, {}), (500, None, {})]
    ev = judge(chat_server)
    result = await ev.score(Sample(text="x"), Item(ground_truth="x"))
    await ev.aclose()
    assert result.reward == pytest.approx(0.8)
    assert len(chat_server.requests) == 4


async def test_gives_up_after_max_retries_and_does_not_retry_400(chat_server: ChatServer) -> None:
    chat_server.script = [(502, None, {})] * 10
    ev = judge(chat_server, maxRetries=2)
    with pytest.raises(EvaluatorError) as info:
        await ev.score(Sample(text="x"), Item())
    assert info.value.kind == "runtime_error" and "HTTP 502" in str(info.value)
    assert len(chat_server.requests) == 3
    chat_server.script = [(400, {"error": {"message": "bad model"}}, {})]
    with pytest.raises(EvaluatorError, match="HTTP 400"):
        await ev.score(Sample(text="x"), Item())
    assert len(chat_server.requests) == 4
    await ev.aclose()


async def test_unparsable_reply_is_a_parse_error(chat_server: ChatServer) -> None:
    chat_server.reply = "I refuse to grade this."
    ev = judge(chat_server)
    with pytest.raises(EvaluatorError) as info:
        await ev.score(Sample(text="x"), Item())
    await ev.aclose()
    assert info.value.kind == "parse_error" and "refuse" in str(info.value)


async def test_request_timeout_is_retried_then_reported() -> None:
    # A server that accepts connections but never answers.
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ev = LLMJudgeEvaluator({"endpoint": f"http://127.0.0.1:{port}", "model": "m", "requestTimeoutSeconds": 0.2,
                            "maxRetries": 1, **FAST})
    try:
        with pytest.raises(EvaluatorError, match="ReadTimeout"):
            await ev.score(Sample(text="x"), Item())
    finally:
        await ev.aclose()
        server.close()
        await server.wait_closed()


async def test_api_key_from_env_is_sent_but_never_logged(chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-test-7f3a9c1e-do-not-log"
    monkeypatch.setenv("JUDGE_KEY", secret)
    caplog.set_level(logging.DEBUG)
    ev = judge(chat_server, apiKeyEnv="JUDGE_KEY")
    chat_server.script = [(500, None, {})]
    result = await ev.score(Sample(text="x"), Item())
    await ev.aclose()
    assert chat_server.requests[-1]["headers"]["Authorization"] == f"Bearer {secret}"
    assert secret not in caplog.text and secret not in repr(ev) and secret not in result.reason
    assert any("HTTP Request" in r.getMessage() for r in caplog.records)  # httpx did log the requests


def test_config_errors_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ConfigError, match="apiKeyEnv.*NO_SUCH_KEY_VAR.*not set"):
        LLMJudgeEvaluator({"endpoint": "http://x", "model": "m", "apiKeyEnv": "NO_SUCH_KEY_VAR"})
    with pytest.raises(ConfigError, match="promptTemplate.*unknown variable"):
        LLMJudgeEvaluator({"endpoint": "http://x", "model": "m", "promptTemplate": "{{answer}}"})
    with pytest.raises(ConfigError, match="endpoint.*http"):
        LLMJudgeEvaluator({"endpoint": "ftp://x", "model": "m"})
    with pytest.raises(ConfigError, match="'model' is required"):
        LLMJudgeEvaluator({"endpoint": "http://x"})
    with pytest.raises(ConfigError, match="scoreMax"):
        LLMJudgeEvaluator({"endpoint": "http://x", "model": "m", "scoreMin": 5, "scoreMax": 1})


# ------------------------------------------------------------------ against our builtin server


def _serve_available() -> bool:
    try:
        import rft_runtime.model.tiny  # noqa: F401
        import rft_runtime.serve.server  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _serve_available(), reason="rft_runtime.serve (builtin inference server) is not importable yet")
async def test_judge_against_builtin_inference_server(tmp_path: Path) -> None:
    from rft_runtime.model.tiny import make_tiny_model

    model_dir = make_tiny_model(tmp_path / "tiny", seed=0)
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "rft_runtime.serve.server", "--model", str(model_dir),
                             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny-judge",
                             "--threads", "1", "--log-level", "WARNING"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "server exited"
                try:
                    if (await client.get(f"{base}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "builtin server did not become healthy"
                await asyncio.sleep(0.5)
            regex = r"(?P<score>\d+)"
            ev = LLMJudgeEvaluator({"endpoint": f"{base}/v1", "model": "tiny-judge", "maxTokens": 12,
                                    "promptTemplate": "Grade: {{response}}", "scoreRegex": regex, **FAST})
            sample, item = Sample(text="4"), Item(ground_truth="4")
            try:
                outcome = await ev.score(sample, item)
                error = None
            except EvaluatorError as exc:
                outcome, error = None, exc
            finally:
                await ev.aclose()
            # The same request sent directly: greedy decoding makes it reproducible.
            direct = await client.post(f"{base}/v1/chat/completions", json={
                "model": "tiny-judge", "messages": [{"role": "user", "content": "Grade: 4"}],
                "max_tokens": 12, "temperature": 0.0})
            assert direct.status_code == 200
            reply = direct.json()["choices"][0]["message"]["content"]
            digits = re.findall(regex, reply)
            if digits:
                assert error is None and outcome is not None
                assert outcome.reward == float(digits[-1])
                assert outcome.metrics["judge_completion_tokens"] > 0
            else:
                assert error is not None and error.kind == "parse_error", error
    finally:
        stop(proc)
        if proc.stderr:
            proc.stderr.close()
