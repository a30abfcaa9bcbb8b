#!/usr/bin/env bash
# Builds (once) a venv with lupa (Lua 5.1 to 5.5 and LuaJIT inside Python, from PyPI) in the cache and
# prints its python. The tests run the chart's Argo CD health check (charts/rft-operator/files/argocd/
# health.lua) in its Lua 5.1, the language version Argo CD's gopher-lua speaks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
. "$root/hack/cached-venv.sh"
lock="$root/requirements/lupa.txt"
version=$(sed -n 's/^lupa==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[lupa] $lock pins no lupa (make lock)" >&2; exit 1; }
cached_venv lupa "$version" "$lock" 0 '"$venv/bin/python" -c "import lupa.lua51"'
echo "$venv/bin/python"
