#!/usr/bin/env bash
# Creates .venv at the repo root. Third-party dependencies live in a venv cached outside the repo
# (keyed by a hash of pyproject's dependency lists), so a clean clone reuses it; the repo's .venv is a
# small venv that adds the cached site-packages through a .pth file and installs this project editable.
# A machine without the cache builds it from PyPI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
py=${PYTHON:-python3}
key=$("$py" - "$root/pyproject.toml" <<'PY'
import hashlib, json, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
blob = json.dumps([p["dependencies"], p.get("optional-dependencies", {}), sys.version_info[:2]], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest()[:16])
PY
)
deps="$cache/deps-$key"
if [ ! -f "$deps/.complete" ]; then
  echo "[venv] building dependency venv $deps (one time; torch is large)"
  rm -rf "$deps"
  mkdir -p "$cache"
  "$py" -m venv "$deps"
  "$deps/bin/pip" install -q --upgrade pip
  reqs=$("$py" - "$root/pyproject.toml" <<'PY'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
r = list(p["dependencies"])
for v in p.get("optional-dependencies", {}).values():
    r += v
print("\n".join(r))
PY
)
  echo "$reqs" > "$deps/requirements.txt"
  "$deps/bin/pip" install -r "$deps/requirements.txt"
  touch "$deps/.complete"
fi
site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$root/.venv/bin/python" ] || ! grep -qs "$site" "$root/.venv/.deps"; then
  rm -rf "$root/.venv"
  "$py" -m venv "$root/.venv"
  vsite=$("$root/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" > "$vsite/_rft_deps.pth"
  echo "$site" > "$root/.venv/.deps"
  # Console scripts of dependencies (pytest, ray, tensorboard) through the venv's own python.
  for tool in pytest ray tensorboard; do
    [ -e "$deps/bin/$tool" ] && printf '#!/bin/sh\nexec "%s" -m %s "$@"\n' "$root/.venv/bin/python" \
      "$( [ "$tool" = ray ] && echo ray.scripts.scripts || echo $tool )" > "$root/.venv/bin/$tool" && chmod +x "$root/.venv/bin/$tool"
  done
fi
"$root/.venv/bin/python" -m pip install -q --no-deps -e "$root" 2>&1 | grep -v "^$" || true
"$root/.venv/bin/python" -c 'import rft_runtime, rft_api, rft_operator' 
touch "$root/.venv/.ready"
