#!/usr/bin/env bash
# Loads vLLM's CPU kernels as the vLLM image and venv checks do (vllm._custom_ops: vLLM's own choice of
# _C, _C_AVX512 or _C_AVX2), on an emulated CPU without AVX-512 (qemu-x86_64 -cpu Haswell-noTSX: AVX2, FMA,
# F16C), and shows that importing vllm._C by name dies there with SIGILL. For machines that have AVX-512
# themselves; takes several minutes (TCG emulation). qemu-user comes from Debian when missing (root).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v qemu-x86_64 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=900 \
  -y -q --no-install-recommends qemu-user >/dev/null
py=$(bash "$root/hack/vllm-venv.sh")
emulate() { VLLM_TARGET_DEVICE=cpu qemu-x86_64 -cpu Haswell-noTSX "$py" -c "$1" 2> >(grep -v "TCG doesn't support" >&2); }
emulate "import torch, vllm, vllm._custom_ops
assert not torch.cpu._is_avx512_supported() and torch.cpu._is_avx2_supported()
torch.ops._C.silu_and_mul
print('AVX2 only: vLLM loaded its kernels through its platform selection')"
if emulate "import vllm._C" 2>/dev/null; then
  echo "AVX2 only: import vllm._C by name worked (expected SIGILL: the wheel's _C is its AVX-512 build)"
else
  echo "AVX2 only: import vllm._C by name fails (exit $?), as expected; the checks no longer do it"
fi
