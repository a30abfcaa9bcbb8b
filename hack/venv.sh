#!/usr/bin/env bash
# Creates .venv at the repo root. Third-party dependencies live in a venv cached outside the repo,
# keyed by a hash of the lock file requirements/dev.txt (exact versions with hashes; `make lock`
# regenerates it), so a clean clone reuses it; the repo's .venv is a small venv that adds the cached
# site-packages through a .pth file and installs this project editable. A machine without the cache
# builds it from PyPI: exactly the locked set, installed by a pinned uv (hack/uv.sh) without resolving.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
py=${PYTHON:-python3}
lock="$root/requirements/dev.txt"
key=$( (cat "$lock"; "$py" -c 'import sys; print(sys.version_info[:2])') | sha256sum | cut -c1-16)
deps="$cache/deps-$key"
if [ ! -f "$deps/.complete" ]; then
  mkdir -p "$cache"
  exec 8>"$cache/.deps.lock"
  flock 8
  if [ ! -f "$deps/.complete" ]; then
    echo "[venv] building dependency venv $deps from requirements/dev.txt (one time; torch is large)"
    . "$root/hack/cached-venv.sh" && prune_stale "$deps" "$cache/deps"
    uv=$(bash "$root/hack/uv.sh")
    rm -rf "$deps"
    "$py" -m venv "$deps"
    "$uv" pip install --python "$deps/bin/python" --no-deps --require-hashes --compile-bytecode -r "$lock"
    touch "$deps/.complete"
  fi
fi
site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$root/.venv/bin/python" ] || ! grep -qs "$site" "$root/.venv/.deps"; then
  rm -rf "$root/.venv"
  "$py" -m venv "$root/.venv"
  vsite=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" > "$vsite/_rft_deps.pth"
  echo "$site" > "$root/.venv/.deps"
  # Console scripts of dependencies through the venv's own python.
  for tool in pytest ray tensorboard; do
    mod=$tool
    [ "$tool" = ray ] && mod=ray.scripts.scripts
    printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$root/.venv/bin/python" "$mod" > "$root/.venv/bin/$tool"
    chmod +x "$root/.venv/bin/$tool"
  done
fi
"$root/.venv/bin/python" -m pip install -q --no-deps -e "$root" 2>&1 | grep -v "^$" || true
"$root/.venv/bin/python" -c 'import rft_runtime, rft_api, rft_operator'
touch "$root/.venv/.ready"
