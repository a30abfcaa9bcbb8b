#!/usr/bin/env bash
# Builds (once) SeaweedFS's `weed` binary, the S3-compatible server the storage tests run against, and
# prints its path: ${RFT_CACHE:-$HOME/.cache/rft-operator}/bin/weed-<version>.
#
# The source is the pinned pseudo-version of github.com/seaweedfs/seaweedfs from the Go module proxy.
# `go install .../weed@<version>` is refused (its go.mod has a replace directive), so the binary is
# built from a throwaway module that requires it and carries the same replace; CGO_ENABLED=0, stripped.
# The Go module and build caches are the defaults (GOMODCACHE and GOCACHE are respected). The binary is
# written next to its final path and renamed into place, so the final path exists only complete.
# Concurrent runs serialise on a lock. Logs go to stderr; stdout is just the path.
#
# Environment: RFT_CACHE, RFT_BUILD_JOBS (go build -p, default 2).
set -euo pipefail
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
module=github.com/seaweedfs/seaweedfs
version=v0.0.0-20261109003541-7506e5f91cd6
bin=$cache/bin
exe=$bin/weed-$version
if [ -x "$exe" ]; then echo "$exe"; exit 0; fi
mkdir -p "$bin"
exec 9>"$bin/.weed.lock"
flock 9
if [ -x "$exe" ]; then echo "$exe"; exit 0; fi
command -v go >/dev/null || { echo "[seaweedfs] go is required (https://go.dev/dl) to build weed" >&2; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

echo "[seaweedfs] building $module/weed@$version (one time)" >&2
t0=$SECONDS
tmp=$(mktemp -d "$bin/.weed-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mod=$tmp/src
mkdir -p "$mod"
# The main module's replace directives are the only ones Go applies: copy SeaweedFS's own.
upstream=$(go mod download -json "$module@$version" | sed -nE 's/^[[:space:]]*"GoMod": "(.*)",?$/\1/p')
[ -f "$upstream" ] || { echo "[seaweedfs] no go.mod for $module@$version from the module proxy" >&2; exit 1; }
{
  printf 'module rft.local/weed\n\ngo 1.26\n\nrequire %s %s\n\n' "$module" "$version"
  grep -E '^replace ' "$upstream" || true
} >"$mod/go.mod"
(cd "$mod" && GOFLAGS=-mod=mod go get "$module/weed@$version" >&2 \
  && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "${RFT_BUILD_JOBS:-2}" -trimpath -ldflags "-s -w" \
    -o "$tmp/weed" "$module/weed" >&2)
"$tmp/weed" version >&2
mv -f "$tmp/weed" "$exe"
echo "[seaweedfs] built $exe in $((SECONDS - t0))s" >&2
echo "$exe"
