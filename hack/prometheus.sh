#!/usr/bin/env bash
# Builds (once) the Prometheus server the monitoring e2e test scrapes a live job with, and prints its path:
# ${RFT_CACHE:-$HOME/.cache/rft-operator}/bin/prometheus-<version>.
#
# The source is github.com/prometheus/prometheus (cmd/prometheus) from the Go module proxy, built from a
# throwaway module that requires it; CGO_ENABLED=0, stripped, with Prometheus's own build tags
# `remove_all_sd,enable_kubernetes_sd`: of the service discoveries only static, file, HTTP and Kubernetes
# (the one a cluster's Prometheus finds pods with), which keeps out the cloud providers' SDKs. No web UI
# assets are embedded (the HTTP API serves queries without them). The Go module and build caches are the
# defaults (GOMODCACHE and GOCACHE are respected). The binary is written next to its final path and
# renamed into place, so the final path exists only complete. Concurrent runs serialise on a lock.
# Logs go to stderr; stdout is just the path.
#
#   hack/prometheus.sh --image   also writes its image (FROM scratch: the binary, user 65534) as an
#                                oci-archive for `ctr images import`, prometheus-<version>.oci beside it
#                                (ref localhost/rft-test/prometheus:<version>), and prints that path
#                                (needs buildah: hack/build-node.sh installs it).
#
# Environment: RFT_CACHE, RFT_BUILD_JOBS (go build -p, default 2), RFT_PROMETHEUS_VERSION (default v0.316.0,
# which is Prometheus 3.x in Go's module versioning).
set -euo pipefail
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
module=github.com/prometheus/prometheus
version=${RFT_PROMETHEUS_VERSION:-v0.316.0}
bin=$cache/bin
exe=$bin/prometheus-$version
image() { # the oci-archive of the image, made once from the binary
  local archive=$exe.oci ref=localhost/rft-test/prometheus:$version store=$bin/.prometheus-buildah c
  if ! [ -s "$archive" ]; then
    command -v buildah >/dev/null || { echo "[prometheus] buildah is required for the image" >&2; exit 1; }
    local bopts=(--root "$store/root" --runroot "$store/run" --storage-driver vfs)
    export BUILDAH_ISOLATION=chroot
    c=$(buildah "${bopts[@]}" from --quiet scratch)
    buildah "${bopts[@]}" copy --quiet "$c" "$exe" /prometheus >/dev/null
    buildah "${bopts[@]}" config --entrypoint '["/prometheus"]' --user 65534:65534 "$c"
    rm -f "$archive.tmp"
    buildah "${bopts[@]}" commit --quiet --format oci "$c" "oci-archive:$archive.tmp:$ref" >/dev/null
    buildah "${bopts[@]}" rm "$c" >/dev/null
    rm -rf "$store"
    mv -f "$archive.tmp" "$archive"
  fi
  echo "$archive"
}
want_image=0
[ "${1:-}" = --image ] && want_image=1
if [ -x "$exe" ]; then
  if [ $want_image = 1 ]; then exec 9>"$bin/.prometheus.lock"; flock 9; image; else echo "$exe"; fi
  exit 0
fi
mkdir -p "$bin"
exec 9>"$bin/.prometheus.lock"
flock 9
if [ -x "$exe" ]; then
  if [ $want_image = 1 ]; then image; else echo "$exe"; fi
  exit 0
fi
command -v go >/dev/null || { echo "[prometheus] go is required (https://go.dev/dl) to build Prometheus" >&2; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

echo "[prometheus] building $module/cmd/prometheus@$version (one time)" >&2
t0=$SECONDS
tmp=$(mktemp -d "$bin/.prometheus-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mod=$tmp/src
mkdir -p "$mod"
printf 'module rft.local/prometheus\n\ngo 1.26\n\nrequire %s %s\n' "$module" "$version" >"$mod/go.mod"
(cd "$mod" && GOFLAGS=-mod=mod go get "$module/cmd/prometheus@$version" >&2 \
  && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "${RFT_BUILD_JOBS:-2}" -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$version" -o "$tmp/prometheus" \
    "$module/cmd/prometheus" >&2)
"$tmp/prometheus" --version >&2
mv -f "$tmp/prometheus" "$exe"
echo "[prometheus] built $exe in $((SECONDS - t0))s" >&2
if [ $want_image = 1 ]; then image; else echo "$exe"; fi
