"""Fixtures for the reward tests: a tiny OpenAI-style chat server, process checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import pytest
from aiohttp import web

from tests.support.ports import free_port


def processes_of_uid(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid is ``uid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                status = fh.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry))
    return found


@dataclass
class ChatServer:
    """A real HTTP server on 127.0.0.1 speaking the chat-completions shape.

    ``script`` holds queued responses ``(status, json_body_or_None, headers)`` served first, in
    order; after that every request gets ``reply`` as the assistant message. ``requests`` records
    each request's headers and JSON body."""

    url: str = ""
    reply: str = "Looks right. Score: 8"
    script: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "json": body, "path": request.path})
        if self.script:
            status, payload, headers = self.script.pop(0)
            if payload is None:
                payload = {"error": {"message": f"status {status}", "type": "server_error"}}
            return web.json_response(payload, status=status, headers=headers)
        return web.json_response({
            "id": "chatcmpl-test", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
        })


@pytest.fixture
async def chat_server() -> AsyncIterator[ChatServer]:
    """A ChatServer listening on a free port; stopped after the test."""
    server = ChatServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()
