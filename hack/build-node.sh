#!/usr/bin/env bash
# Builds (once) what a real local Kubernetes node needs, next to the control plane, and prints the
# node's binary directory on success (the last line of stdout):
#   ${RFT_CACHE:-$HOME/.cache/rft-operator}/node/bin/
#
#   containerd, runc, CNI     Debian packages (containerd, runc, containernetworking-plugins,
#   plugins, iptables,        iptables, buildah), installed with apt-get when a command is missing.
#   buildah
#   kubelet, kube-proxy       built from the control plane's own module (hack/build-control-plane.sh:
#                             k8s.io/kubernetes v1.34.x with the staging replaces), same version and
#                             ldflags, CGO_ENABLED=0.
#   coredns                   github.com/coredns/coredns from the Go module proxy, built from a small
#                             main package (hack/node/coredns) with only the plugins the add-on uses.
#   kube-router               github.com/cloudnativelabs/kube-router/v2 from the Go module proxy: the
#                             node's NetworkPolicy enforcement (iptables + ipset; the `ipset` tool is a
#                             Debian package). Its vishvananda/netlink pseudo-version is not on the
#                             proxy, so the wrapper module pins the nearest release, v1.3.1.
#   pause                     hack/node/pause.c, gcc -static; its image (FROM scratch, buildah) is
#   pause.oci, coredns.oci    written as an oci-archive, like CoreDNS's image, for
#                             `ctr -n k8s.io images import` by e2e/node.py.
#
# Idempotent (each piece only when missing; `.complete` marks a finished set); concurrent runs
# serialise on the control plane's lock. Environment: RFT_CACHE, RFT_COREDNS_VERSION (default
# v1.11.4), RFT_KUBE_ROUTER_VERSION (default v2.10.0), RFT_BUILD_JOBS (go build -p, default 2).
set -euo pipefail
{
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
k8s=$cache/k8s
node=$cache/node
bin=$node/bin
jobs=${RFT_BUILD_JOBS:-2}
coredns_version=${RFT_COREDNS_VERSION:-v1.11.4}
kube_router_version=${RFT_KUBE_ROUTER_VERSION:-v2.10.0}
# Image names the node's containerd knows these by (e2e/node.py uses the same).
pause_image=registry.rft.local/pause:1.0
coredns_image=registry.rft.local/coredns:${coredns_version#v}

log() { echo "[node] $*" >&2; }
die() { echo "[node] ERROR: $*" >&2; exit 1; }

need=(kubelet kube-proxy coredns kube-router pause pause.oci coredns.oci)
all_present() { local b; for b in "${need[@]}"; do [ -s "$bin/$b" ] || return 1; done; }
packages_present() {
  command -v containerd >/dev/null && command -v runc >/dev/null && command -v ctr >/dev/null \
    && command -v iptables >/dev/null && command -v ipset >/dev/null && command -v buildah >/dev/null \
    && command -v gcc >/dev/null \
    && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
    && [ -x /usr/lib/cni/portmap ]
}

if [ -f "$bin/.complete" ] && all_present && packages_present; then echo "$bin"; exit 0; fi

# The control plane first: its module directory and version are reused for kubelet and kube-proxy.
cp_bin=$(bash "$root/hack/build-control-plane.sh" | tail -1)
[ -x "$cp_bin/kube-apiserver" ] || die "the control plane build did not produce kube-apiserver"

mkdir -p "$bin"
exec 9>"$k8s/.lock"
flock 9
# Another run (a background hack/prepare.sh) may have finished it while this one waited for the lock.
if [ -f "$bin/.complete" ] && all_present && packages_present; then echo "$bin"; exit 0; fi
rm -f "$bin/.complete"

# --- Debian packages -----------------------------------------------------------------------------
if ! packages_present; then
  [ "$(id -u)" = 0 ] || die "containerd, runc, CNI plugins, iptables and buildah are missing; run as root to install them"
  t0=$SECONDS
  log "apt-get install containerd runc containernetworking-plugins iptables ipset buildah gcc libc6-dev"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -o DPkg::Lock::Timeout=900 -y -q --no-install-recommends containerd runc containernetworking-plugins iptables \
    ipset buildah gcc libc6-dev >"$node/apt.log" 2>&1 \
    || { apt-get -o DPkg::Lock::Timeout=900 update -q >>"$node/apt.log" 2>&1 && apt-get install -o DPkg::Lock::Timeout=900 -y -q --no-install-recommends containerd \
         runc containernetworking-plugins iptables ipset buildah gcc libc6-dev >>"$node/apt.log" 2>&1; } \
    || { tail -20 "$node/apt.log" >&2; die "apt-get install failed"; }
  packages_present || die "packages installed but a command is still missing"
  log "packages ready in $((SECONDS - t0))s"
fi

# --- kubelet, kube-proxy -------------------------------------------------------------------------
v=$("$cp_bin/kube-apiserver" --version | sed -nE 's/.*(v1\.[0-9]+\.[0-9]+).*/\1/p')
[ -n "$v" ] || die "cannot read the control plane's version"
mod=$k8s/src-$v
if ! [ -s "$bin/kubelet" ] || ! [ -s "$bin/kube-proxy" ]; then
  [ -f "$mod/go.mod" ] || die "no module directory $mod (hack/build-control-plane.sh writes it when it builds)"
  t0=$SECONDS
  minor=${v#v1.}; minor=${minor%%.*}
  date=$(cd "$mod" && GOFLAGS=-mod=mod go list -m -json "k8s.io/kubernetes@$v" | sed -nE 's/^\s*"Time": "([^"]+)",?$/\1/p' | head -1)
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  log "building kubelet and kube-proxy from k8s.io/kubernetes@$v in $mod"
  mkdir -p "$mod/node-out"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "$jobs" -trimpath -ldflags "$ld" -o "$mod/node-out/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy) || die "go build of kubelet, kube-proxy failed"
  for c in kubelet kube-proxy; do
    "$mod/node-out/$c" --version 2>/dev/null | grep -qF "$v" || die "$c --version does not print $v"
    mv -f "$mod/node-out/$c" "$bin/$c"
  done
  log "kubelet, kube-proxy built in $((SECONDS - t0))s"
fi

# --- coredns -------------------------------------------------------------------------------------
if ! [ -s "$bin/coredns" ]; then
  t0=$SECONDS
  src=$node/coredns-src
  mkdir -p "$src"
  cp "$root/hack/node/coredns/main.go" "$src/main.go"
  printf 'module rft.local/coredns\n\ngo 1.23\n\nrequire github.com/coredns/coredns %s\n' "$coredns_version" >"$src/go.mod"
  rm -f "$src/go.sum"
  log "building coredns $coredns_version"
  (cd "$src" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true
   cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "$jobs" -trimpath \
     -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version" -o "$bin/coredns.tmp" .) \
    || die "go build of coredns $coredns_version failed"
  mv -f "$bin/coredns.tmp" "$bin/coredns"
  log "coredns built in $((SECONDS - t0))s"
fi

# --- kube-router (NetworkPolicy enforcement only) --------------------------------------------------
if ! [ -s "$bin/kube-router" ]; then
  t0=$SECONDS
  src=$node/kube-router-src
  mkdir -p "$src"
  printf 'module rft.local/kube-router\n\ngo 1.26\n\nrequire github.com/cloudnativelabs/kube-router/v2 %s\n\nreplace github.com/vishvananda/netlink => github.com/vishvananda/netlink v1.3.1\n' \
    "$kube_router_version" >"$src/go.mod"
  rm -f "$src/go.sum"
  log "building kube-router $kube_router_version"
  pkg=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
  (cd "$src" && GOFLAGS=-mod=mod go get "$pkg@$kube_router_version" >/dev/null 2>&1 || true
   cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "$jobs" -trimpath \
     -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$kube_router_version" \
     -o "$bin/kube-router.tmp" "$pkg") || die "go build of kube-router $kube_router_version failed"
  mv -f "$bin/kube-router.tmp" "$bin/kube-router"
  log "kube-router built in $((SECONDS - t0))s"
fi

# --- pause ---------------------------------------------------------------------------------------
if ! [ -s "$bin/pause" ]; then
  gcc -static -O2 -s -o "$bin/pause.tmp" "$root/hack/node/pause.c" || die "gcc -static pause.c failed (libc6-dev?)"
  mv -f "$bin/pause.tmp" "$bin/pause"
fi

# --- images FROM scratch, as oci-archives ----------------------------------------------------------
scratch_image() { # NAME REF BINARY ENTRYPOINT-JSON [USER]
  local name=$1 ref=$2 exe=$3 entry=$4 user=${5:-} ctx c
  [ -s "$bin/$name.oci" ] && return 0
  export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
  local store=$node/buildah
  local bopts=(--root "$store/root" --runroot "$store/run" --storage-driver vfs)
  c=$(buildah "${bopts[@]}" from --quiet scratch)
  buildah "${bopts[@]}" copy --quiet "$c" "$exe" "/$(basename "$exe")" >/dev/null
  buildah "${bopts[@]}" config --entrypoint "$entry" ${user:+--user "$user"} "$c"
  rm -f "$bin/$name.oci.tmp"
  buildah "${bopts[@]}" commit --quiet --format oci "$c" "oci-archive:$bin/$name.oci.tmp:$ref" >/dev/null
  buildah "${bopts[@]}" rm "$c" >/dev/null
  mv -f "$bin/$name.oci.tmp" "$bin/$name.oci"
  log "image $ref -> $bin/$name.oci"
}
scratch_image pause "$pause_image" "$bin/pause" '["/pause"]' 65535:65535
scratch_image coredns "$coredns_image" "$bin/coredns" '["/coredns"]' 65532:65532
printf '%s\n' "pause $pause_image" "coredns $coredns_image" >"$bin/IMAGES"

all_present || die "missing files in $bin"
for b in kubelet kube-proxy; do printf '%s\t%s\n' "$b" "$("$bin/$b" --version 2>/dev/null | head -1)"; done >"$bin/VERSIONS"
printf 'coredns\t%s\nkube-router\t%s\ncontainerd\t%s\nrunc\t%s\n' "$coredns_version" "$kube_router_version" \
  "$(containerd --version)" "$(runc --version | head -1)" >>"$bin/VERSIONS"
touch "$bin/.complete"
log "node binaries ready in $bin"
echo "$bin"
exit 0
}
