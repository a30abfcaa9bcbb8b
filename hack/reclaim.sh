#!/usr/bin/env bash
# Frees the disk that earlier test sessions and builds left behind, before hack/prepare.sh builds
# anything (a machine that takes run after run fills its disk otherwise): every earlier pytest
# session's node images and container filesystems (<basetemp>/cluster*/node/containerd/{root,state},
# gigabytes each once the runtime and vLLM images are imported) unless a containerd still runs on
# them, and buildah's leftovers of an interrupted image build. Cached venvs and image archives of
# other inputs are pruned where they are built (hack/cached-venv.sh, hack/build-images.sh).
# Prints the free space before and after.
#
#   hack/reclaim.sh
set -euo pipefail
free() { df -Pk "${1:-/}" | awk 'NR==2 {printf "%.1f GiB free on %s", $4/1048576, $6}'; }
tmp=${TMPDIR:-/tmp}
echo "[reclaim] before: $(free "$tmp")" >&2
shopt -s nullglob
for d in "$tmp"/pytest-of-"$(id -un)"/pytest-*/cluster*/node/containerd; do
  if pgrep -f -- "$d/" >/dev/null 2>&1 || pgrep -f -- "$d/config.toml" >/dev/null 2>&1; then
    echo "[reclaim] $d: in use, kept" >&2
    continue
  fi
  # A node stopped without unmounting (a killed session) may still have its rootfs mounted there.
  if grep -qsF " $d/" /proc/self/mounts; then
    echo "[reclaim] $d: still mounted, kept" >&2
    continue
  fi
  if [ -d "$d/root" ] || [ -d "$d/state" ]; then
    echo "[reclaim] removing the images and container filesystems under $d" >&2
    rm -rf "$d/root" "$d/state"
    rm -f "$(dirname "$d")/imported.txt"
  fi
done
for d in /var/tmp/storage[0-9]* /var/tmp/buildah[0-9]*; do
  [ -e "$d" ] || continue
  # only what no running process holds: a build in progress keeps its own
  if command -v fuser >/dev/null && fuser -s "$d" 2>/dev/null; then continue; fi
  if [ "$(find "$d" -maxdepth 0 -mmin +60 2>/dev/null)" ]; then
    echo "[reclaim] removing $d (an interrupted build's)" >&2
    rm -rf "$d"
  fi
done
echo "[reclaim] after: $(free "$tmp")" >&2
# Short of the ~40 GB a cold run needs: say where the disk went, so that a failed build names it.
if [ "$(df -Pk "$tmp" | awk 'NR==2 {print $4}')" -lt $((40 * 1048576)) ]; then
  echo "[reclaim] under 40 GiB free; the largest of what builds and tests keep:" >&2
  du -xsh "${RFT_CACHE:-$HOME/.cache/rft-operator}"/* "$HOME"/.cache/* "$tmp"/pytest-of-* /var/lib/containers \
    "$(go env GOMODCACHE 2>/dev/null || echo /nonexistent)" "$(go env GOCACHE 2>/dev/null || echo /nonexistent)" \
    2>/dev/null | sort -rh | head -12 >&2 || true
fi
