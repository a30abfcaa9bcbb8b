#!/usr/bin/env bash
# Builds (once) a venv with an MLflow tracking server (mlflow from PyPI) in the cache and prints its
# `mlflow` executable. Only the tests use it (tests/trainer/test_tracking.py starts `mlflow server` on
# loopback, its store a SQLite file); the runtime speaks MLflow's REST API with httpx and needs no MLflow
# package. The venv gets exactly requirements/mlflow.txt (hashes checked, nothing resolved:
# hack/lock.sh wrote it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
. "$root/hack/cached-venv.sh"
lock="$root/requirements/mlflow.txt"
version=$(sed -n 's/^mlflow==\([^ ]*\) .*/\1/p' "$lock")
[ -n "$version" ] || { echo "[mlflow] $lock pins no mlflow (make lock)" >&2; exit 1; }
cached_venv mlflow "$version" "$lock" 0 '"$venv/bin/mlflow" --version'
echo "$venv/bin/mlflow"
