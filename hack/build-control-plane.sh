#!/usr/bin/env bash
# Builds (once) the binaries of a local Kubernetes control plane into
#   ${RFT_CACHE:-$HOME/.cache/rft-operator}/k8s/bin/
# and prints that directory on success (the last line of stdout).
#
#   etcd                     Debian's etcd-server package (trixie), fetched with a private apt
#                            configuration (own sources list, state and cache; the system's apt is
#                            untouched) and unpacked with dpkg -x. Fallback: go install from the proxy.
#   kube-apiserver,          k8s.io/kubernetes v1.34.x from the Go module proxy, built in a throwaway
#   kube-controller-manager, module that replaces every staging module k8s.io/X with k8s.io/X v0.34.x;
#   kube-scheduler, kubectl  CGO_ENABLED=0, version ldflags set so --version prints v1.34.x.
#                            kubectl is built only when the one on PATH is outside the version skew.
#   helm                     go install helm.sh/helm/v3/cmd/helm@<newest v3>.
#
# Binaries already in $KUBEBUILDER_ASSETS or on PATH are used first (symlinked). Idempotent: each
# binary is built only when missing; `.complete` marks a finished set. Concurrent runs serialise on a
# lock. Environment: RFT_CACHE, RFT_K8S_VERSION (e.g. v1.34.4; default: newest v1.34 patch),
# RFT_HELM_VERSION (default: newest v3 release), RFT_BUILD_JOBS (go build -p, default 2),
# RFT_DEBIAN_MIRROR, RFT_DEBIAN_SUITE (default trixie), RFT_ETCD_FROM (debian | proxy).
set -euo pipefail
# The whole script is one brace group, so bash parses it fully before running it (safe to edit
# the file while a long build runs).
{

cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
k8s=$cache/k8s
bin=$k8s/bin
jobs=${RFT_BUILD_JOBS:-2}
mkdir -p "$bin"

log() { echo "[control-plane] $*" >&2; }
die() { echo "[control-plane] ERROR: $*" >&2; exit 1; }

need_all=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)

all_present() {
  local b
  for b in "${need_all[@]}"; do [ -x "$bin/$b" ] || return 1; done
}

if [ -f "$bin/.complete" ] && all_present; then
  echo "$bin"
  exit 0
fi

exec 9>"$k8s/.lock"
flock 9
if [ -f "$bin/.complete" ] && all_present; then
  echo "$bin"
  exit 0
fi
rm -f "$bin/.complete"

command -v go >/dev/null || die "go is required (https://go.dev/dl) to build the control plane"
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

# minor_of "<text containing vMAJOR.MINOR.PATCH>" -> MINOR
minor_of() { sed -nE 's/.*v?1\.([0-9]+)\.[0-9]+.*/\1/p' <<<"$1" | head -1; }

# find_existing NAME -> path of NAME in KUBEBUILDER_ASSETS or PATH (never our own bin dir)
find_existing() {
  local name=$1 p
  if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/$name" ]; then
    echo "$KUBEBUILDER_ASSETS/$name"; return 0
  fi
  p=$(PATH=$(tr ':' '\n' <<<"$PATH" | grep -vxF "$bin" | paste -sd: -) command -v "$name" 2>/dev/null) || return 1
  [ -n "$p" ] && echo "$p"
}

link_existing() { # NAME PATH
  ln -sfn "$2" "$bin/$1"
  log "using existing $1: $2"
}

# --- versions ----------------------------------------------------------------------------------
newest_version() { # MODULE REGEX
  (cd "$k8s" && go list -m -versions "$1") | tr ' ' '\n' | grep -E "$2" | sort -V | tail -1
}
k8s_version=${RFT_K8S_VERSION:-}
resolve_k8s_version() {
  if [ -z "$k8s_version" ]; then
    k8s_version=$(newest_version k8s.io/kubernetes '^v1\.34\.[0-9]+$')
    [ -n "$k8s_version" ] || die "the Go module proxy lists no k8s.io/kubernetes v1.34.x"
  fi
}

# --- etcd ----------------------------------------------------------------------------------------
etcd_ok() { # PATH -> true when etcd >= 3.5.13
  local v
  v=$("$1" --version 2>/dev/null | sed -nE 's/^etcd Version: ([0-9.]+).*/\1/p') || return 1
  [ -n "$v" ] && [ "$(printf '%s\n3.5.13\n' "$v" | sort -V | head -1)" = "3.5.13" ]
}

etcd_from_debian() {
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || return 1
  local apt=$k8s/apt suite=${RFT_DEBIAN_SUITE:-trixie} mirror=${RFT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || { log "no $keyring: cannot verify Debian packages"; return 1; }
  mkdir -p "$apt"/{lists/partial,cache/archives/partial,parts,prefs,download}
  echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt/sources.list"
  : >"$apt/status"
  local opts=(
    -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
    -o "Dir::Etc::Preferences=$apt/prefs/none" -o "Dir::Etc::PreferencesParts=$apt/prefs"
    -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=$apt/status"
    -o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)"
    -o "Acquire::Languages=none" -q
  )
  log "apt-get update (private config, $suite)"
  apt-get "${opts[@]}" update >"$apt/update.log" 2>&1 || { tail -20 "$apt/update.log" >&2; return 1; }
  rm -f "$apt/download"/*.deb
  (cd "$apt/download" && apt-get "${opts[@]}" download etcd-server) >"$apt/download.log" 2>&1 \
    || { tail -20 "$apt/download.log" >&2; return 1; }
  local deb
  deb=$(ls "$apt/download"/etcd-server_*.deb | head -1)
  rm -rf "$apt/root" && dpkg -x "$deb" "$apt/root"
  [ -x "$apt/root/usr/bin/etcd" ] || { log "no usr/bin/etcd in $deb"; return 1; }
  install -m 0755 "$apt/root/usr/bin/etcd" "$bin/etcd.tmp" && mv "$bin/etcd.tmp" "$bin/etcd"
  log "etcd from $(basename "$deb")"
}

etcd_from_proxy() {
  # `go install go.etcd.io/etcd/server/v3@v` is refused (its go.mod has replace directives), so build
  # it from a throwaway module that requires it.
  local v mod=$k8s/etcd-src
  v=$(newest_version go.etcd.io/etcd/server/v3 '^v3\.5\.[0-9]+$')
  [ -n "$v" ] || return 1
  log "building etcd from go.etcd.io/etcd/server/v3@$v"
  mkdir -p "$mod"
  printf 'module rft.local/etcd\n\ngo 1.23\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$v" >"$mod/go.mod"
  rm -f "$mod/go.sum"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "$jobs" -trimpath -ldflags "-s -w" \
    -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3) || return 1
  mv -f "$bin/etcd.tmp" "$bin/etcd"
}

ensure_etcd() {
  [ -x "$bin/etcd" ] && etcd_ok "$bin/etcd" && return 0
  local p
  if p=$(find_existing etcd) && etcd_ok "$p"; then link_existing etcd "$p"; return 0; fi
  local t0=$SECONDS
  case ${RFT_ETCD_FROM:-debian} in
    debian) etcd_from_debian || { log "Debian etcd-server unavailable; building etcd from the Go module proxy"; etcd_from_proxy; } ;;
    proxy) etcd_from_proxy ;;
    *) die "RFT_ETCD_FROM must be debian or proxy, not '$RFT_ETCD_FROM'" ;;
  esac || die "could not obtain etcd >= 3.5.13"
  etcd_ok "$bin/etcd" || die "etcd in $bin is older than 3.5.13: $("$bin/etcd" --version | head -1)"
  log "etcd ready in $((SECONDS - t0))s: $("$bin/etcd" --version | head -1)"
}

# --- helm ----------------------------------------------------------------------------------------
ensure_helm() {
  [ -x "$bin/helm" ] && return 0
  local p
  if p=$(find_existing helm) && "$p" version --short 2>/dev/null | grep -q '^v3\.'; then link_existing helm "$p"; return 0; fi
  local v=${RFT_HELM_VERSION:-} t0=$SECONDS
  [ -n "$v" ] || v=$(newest_version helm.sh/helm/v3 '^v3\.[0-9]+\.[0-9]+$')
  [ -n "$v" ] || die "the Go module proxy lists no helm.sh/helm/v3 release"
  resolve_k8s_version
  local minor; minor=$(minor_of "$k8s_version")
  log "go install helm.sh/helm/v3/cmd/helm@$v"
  (cd "$k8s" && CGO_ENABLED=0 GOBIN=$bin GOFLAGS=-mod=mod go install -p "$jobs" -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$v") || die "go install helm@$v failed"
  log "helm ready in $((SECONDS - t0))s: $("$bin/helm" version --short)"
}

# --- kube-apiserver, kube-controller-manager, kube-scheduler, kubectl ------------------------------
kube_components=(kube-apiserver kube-controller-manager kube-scheduler)

existing_control_plane() { # -> dir holding all three components at >= 1.30, or fail
  local d c v
  for d in ${KUBEBUILDER_ASSETS:+"$KUBEBUILDER_ASSETS"} $(tr ':' '\n' <<<"$PATH" | grep -vxF "$bin"); do
    for c in "${kube_components[@]}"; do [ -x "$d/$c" ] || continue 2; done
    v=$(minor_of "$("$d/kube-apiserver" --version 2>/dev/null)")
    [ -n "$v" ] && [ "$v" -ge 30 ] && { echo "$d"; return 0; }
  done
  return 1
}

kubectl_in_skew() { # PATH -> client minor within one of 34
  local v; v=$(minor_of "$("$1" version --client 2>/dev/null | head -1)")
  [ -n "$v" ] && [ "$v" -ge 33 ] && [ "$v" -le 35 ]
}

build_kubernetes() { # COMPONENTS...
  resolve_k8s_version
  local v=$k8s_version staging_v mod t0=$SECONDS
  staging_v="v0.${v#v1.}"
  mod=$k8s/src-$v
  mkdir -p "$mod"
  log "building $* from k8s.io/kubernetes@$v (staging $staging_v) in $mod"
  local info gomod date
  info=$(cd "$mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$v") \
    || die "go mod download k8s.io/kubernetes@$v failed"
  gomod=$(sed -nE 's/^\s*"GoMod": "(.*)",?$/\1/p' <<<"$info")
  [ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes@$v"
  # The proxy knows the release's time but not its commit; gitCommit is left unset.
  date=$(cd "$mod" && GOFLAGS=-mod=mod go list -m -json "k8s.io/kubernetes@$v" | sed -nE 's/^\s*"Time": "([^"]+)",?$/\1/p' | head -1)
  [ -n "$date" ] || date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  {
    echo "module rft.local/control-plane"
    echo
    sed -nE 's/^(go [0-9.]+)$/\1/p; s/^(godebug .*)$/\1/p' "$gomod"
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    echo "replace ("
    sed -nE "s#^\s*(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+\s*\$#\t\1 => \1 $staging_v#p" "$gomod"
    echo ")"
  } >"$mod/go.mod.new"
  grep -q "k8s.io/api => k8s.io/api $staging_v" "$mod/go.mod.new" || die "could not list staging modules from $gomod"
  if ! cmp -s "$mod/go.mod.new" "$mod/go.mod.in" 2>/dev/null; then
    cp "$mod/go.mod.new" "$mod/go.mod" && cp "$mod/go.mod.new" "$mod/go.mod.in" && rm -f "$mod/go.sum"
  fi
  local minor=${v#v1.}; minor=${minor%%.*}
  local ld="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  local pkgs=() c
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  rm -rf "$mod/out" && mkdir -p "$mod/out"
  (cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "$jobs" -trimpath -ldflags "$ld" -o "$mod/out/" "${pkgs[@]}") \
    || die "go build of $* (k8s.io/kubernetes@$v) failed"
  for c in "$@"; do
    "$mod/out/$c" --version 2>/dev/null | grep -qF "$v" || [ "$c" = kubectl ] || die "$c --version does not print $v"
    mv -f "$mod/out/$c" "$bin/$c"
  done
  log "built $* in $((SECONDS - t0))s"
}

ensure_kubernetes() {
  local todo=() c d p
  for c in "${kube_components[@]}"; do [ -x "$bin/$c" ] || todo+=("$c"); done
  if [ ${#todo[@]} -gt 0 ] && d=$(existing_control_plane); then
    for c in "${kube_components[@]}"; do link_existing "$c" "$d/$c"; done
    todo=()
  fi
  if ! [ -x "$bin/kubectl" ]; then
    if p=$(find_existing kubectl) && kubectl_in_skew "$p"; then
      link_existing kubectl "$p"
    else
      [ -n "${p:-}" ] && log "kubectl on PATH ($p, $("$p" version --client 2>/dev/null | head -1)) is outside the v1.33-v1.35 skew: building kubectl"
      todo+=(kubectl)
    fi
  fi
  [ ${#todo[@]} -eq 0 ] || build_kubernetes "${todo[@]}"
}

ensure_etcd
ensure_helm
ensure_kubernetes

all_present || die "missing binaries in $bin"
version_of() { # NAME -> one line
  case $1 in
    helm) "$bin/helm" version --short ;;
    kubectl) "$bin/kubectl" version --client 2>/dev/null | head -1 ;;
    *) "$bin/$1" --version 2>/dev/null | head -1 ;;
  esac
}
for b in "${need_all[@]}"; do printf '%s\t%s\n' "$b" "$(version_of "$b" || true)"; done >"$bin/VERSIONS"
touch "$bin/.complete"
log "control plane binaries ready in $bin"
echo "$bin"
exit 0
}
