#!/usr/bin/env bash
# Builds (once) a venv with an MLflow tracking server (mlflow from PyPI) in the cache and prints its
# `mlflow` executable. Only the tests use it (tests/trainer/test_tracking.py starts `mlflow server` on
# loopback, its store a SQLite file); the runtime speaks MLflow's REST API with httpx and needs no MLflow
# package. The venv gets exactly requirements/mlflow.txt (hashes checked, nothing resolved:
# hack/lock.sh wrote it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
lock="$root/requirements/mlflow.txt"
version=$(sed -n 's/^mlflow==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[mlflow] $lock pins no mlflow (make lock)" >&2; exit 1; }
key=$(sha256sum "$lock" | cut -c1-12)
venv="$cache/mlflow-$version-$key"
if [ -f "$venv/.complete" ]; then echo "$venv/bin/mlflow"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/.mlflow.lock"
flock 9
if [ -f "$venv/.complete" ]; then echo "$venv/bin/mlflow"; exit 0; fi
echo "[mlflow] building $venv (one time)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
uv=$(bash "$root/hack/uv.sh")
"$uv" pip install --python "$venv/bin/python" --no-deps --require-hashes -q -r "$lock" >&2
"$venv/bin/mlflow" --version >&2
touch "$venv/.complete"
echo "$venv/bin/mlflow"
