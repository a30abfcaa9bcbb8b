#!/usr/bin/env bash
# Prints the path of a pinned uv (from PyPI), installed once into the cache.
set -euo pipefail
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
version=0.13.9
dir="$cache/uv-$version"
if [ ! -x "$dir/bin/uv" ]; then
  mkdir -p "$cache"
  exec 9>"$cache/.uv.lock"
  flock 9
  if [ ! -x "$dir/bin/uv" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install -q "uv==$version" >&2
  fi
fi
echo "$dir/bin/uv"
