#!/usr/bin/env bash
# Builds (once) a venv with TRL (trl from PyPI) in the cache and prints its python. Only
# bench/trainer_vs_trl.py uses it: TRL's GRPOTrainer is the baseline our trainer step is measured
# against. torch, transformers and accelerate must be the very versions our trainer runs on, so the
# venv gets only what requirements/trl.txt adds to the dev set (trl, datasets and their own
# requirements; hack/lock.sh resolved it against dev.txt's pins), and everything else comes from the
# project's dependency venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
. "$root/hack/cached-venv.sh"
lock="$root/requirements/trl.txt"
version=$(sed -n 's/^trl==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[trl] $lock pins no trl (make lock)" >&2; exit 1; }
cached_venv trl "$version" "$lock" 1 \
  '"$venv/bin/python" -c "import trl, torch, transformers; print(\"trl\", trl.__version__, \"torch\", torch.__version__, \"transformers\", transformers.__version__)"'
echo "$venv/bin/python"
