#!/usr/bin/env bash
# Builds (once) a venv with TRL (trl from PyPI) in the cache and prints its python. Only
# bench/trainer_vs_trl.py uses it: TRL's GRPOTrainer is the baseline our trainer step is measured
# against. torch, transformers and accelerate must be the very versions our trainer runs on, so the
# venv gets only what requirements/trl.txt adds to the dev set (trl, datasets and their own
# requirements, hashes checked, nothing resolved: hack/lock.sh wrote it against dev.txt's pins), and
# everything else comes from the project's dependency venv through a .pth file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
lock="$root/requirements/trl.txt"
version=$(sed -n 's/^trl==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[trl] $lock pins no trl (make lock)" >&2; exit 1; }
[ -f "$root/.venv/.deps" ] || bash "$root/hack/venv.sh" >&2
deps_site=$(cat "$root/.venv/.deps")
key=$( (cat "$lock"; echo "$deps_site") | sha256sum | cut -c1-12)
venv="$cache/trl-$version-$key"
if [ -f "$venv/.complete" ]; then echo "$venv/bin/python"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/.trl.lock"
flock 9
if [ -f "$venv/.complete" ]; then echo "$venv/bin/python"; exit 0; fi
echo "[trl] building $venv (one time)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$deps_site')" > "$site/_rft_deps.pth"
uv=$(bash "$root/hack/uv.sh")
"$uv" pip install --python "$venv/bin/python" --no-deps --require-hashes -q -r "$lock" >&2
"$venv/bin/python" -c "import trl, torch, transformers; print('trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" >&2
touch "$venv/.complete"
echo "$venv/bin/python"
