#!/usr/bin/env bash
# Builds (once) a venv with olah (a self-hosted Hugging Face Hub mirror, from PyPI) in the cache and prints
# its `olah-cli` executable. Only the tests use it (tests/support/hubserver.py starts it on loopback in
# offline mode, serving git repositories the test creates through its `mirrors-path`, so the real
# huggingface_hub client is exercised against a real hub-compatible server); the runtime needs no olah
# package. The venv gets exactly requirements/olah.txt (hashes checked, nothing resolved: hack/lock.sh
# wrote it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
. "$root/hack/cached-venv.sh"
lock="$root/requirements/olah.txt"
version=$(sed -n 's/^olah==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[olah] $lock pins no olah (make lock)" >&2; exit 1; }
cached_venv olah "$version" "$lock" 0 '"$venv/bin/olah-cli" --help >/dev/null && "$venv/bin/python" -c "import olah.server"'
echo "$venv/bin/olah-cli"
