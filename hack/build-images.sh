#!/usr/bin/env bash
# Builds the project's images from operator/Dockerfile and runtime/Dockerfile with buildah, nothing
# pulled from a registry, and writes each as an uncompressed oci-archive for `ctr images import`:
#   ${RFT_CACHE:-$HOME/.cache/rft-operator}/images/<name>-<input hash>.oci
# The last line of stdout is the file listing them (`<image ref> <archive>` per line).
#
#   base     the Dockerfiles' base `python:3.11-slim`, made here: mmdebstrap of Debian bookworm with
#            python3 (3.11), python3-venv, python-is-python3, ca-certificates, imported into buildah's
#            store (under $RFT_CACHE/images/buildah) as docker.io/library/python:3.11-slim.
#   operator ghcr.io/rft-dev/rft-operator:<chart appVersion>  (the chart's default image)
#   runtime  the chart's images.runtime (the operator's default runtime image)
#   vllm     vLLM for the CPU from images/vllm-cpu/Dockerfile, FROM the runtime image (sharing its
#            layers), as the chart's images.vllm (docker.io/ added to a name without a registry; the
#            operator's default for `inference.engine: vllm`; scenario 02). Building it builds the
#            runtime image first. Python dependencies install from PyPI inside the build, as the
#            Dockerfiles say.
#
# With REGISTRY=host[:port][/prefix] each image built or cached in this run is also pushed there, as
# REGISTRY/<last path component of its name>:<tag> (ghcr.io/rft-dev/rft-runtime:0.1.0 ->
# REGISTRY/rft-runtime:0.1.0), with buildah (from its archive; nothing is rebuilt). Credentials:
# REGISTRY_USER and REGISTRY_PASSWORD, else REGISTRY_AUTH_FILE (a containers-auth.json / docker
# config.json), else none. REGISTRY_TLS_VERIFY=false pushes over plain HTTP or to a certificate not
# trusted here (a loopback test registry); REGISTRY_COMPRESSION: gzip (default), zstd or none (layers
# pushed as they are in the archive: fastest on a loopback registry). Each pushed reference, with its
# digest, is printed to stderr and written to $RFT_CACHE/images/pushed.txt (`<ref>@<digest>` per line).
#
# Each image is rebuilt only when a hash of its inputs changes (its Dockerfile, the files it copies,
# the base's hash). Concurrent runs serialise on a lock. Environment: RFT_CACHE, RFT_IMAGES (space-
# separated subset of "operator runtime vllm"; default all three), RFT_DEBIAN_MIRROR.
set -euo pipefail
{
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
out=$cache/images
store=$out/buildah
mirror=${RFT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
want=${RFT_IMAGES:-operator runtime vllm}
mkdir -p "$out"
log() { echo "[images] $*" >&2; }
die() { echo "[images] ERROR: $*" >&2; exit 1; }
exec 8>"$out/.lock"
flock 8

# buildah and mmdebstrap from Debian when missing (root only). This runs beside hack/build-node.sh's own
# apt-get (hack/prepare.sh starts both): each waits for the other's dpkg lock instead of failing.
apt_install() {
  local a=(-o DPkg::Lock::Timeout=900 -y -q --no-install-recommends)
  DEBIAN_FRONTEND=noninteractive apt-get install "${a[@]}" "$@" >/dev/null 2>&1 \
    || { apt-get -o DPkg::Lock::Timeout=900 update -q >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install "${a[@]}" "$@" >/dev/null; }
}
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "${missing[*]} missing (run as root to install them from Debian)"
  apt_install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
fi
driver=${RFT_BUILDAH_DRIVER:-overlay}
export BUILDAH_ISOLATION=chroot STORAGE_DRIVER=$driver
b() { buildah --root "$store/root" --runroot "$store/run" --storage-driver "$driver" "$@"; }

sha() { sha256sum | cut -c1-16; }

# --- base ----------------------------------------------------------------------------------------
base_ref=docker.io/library/python:3.11-slim
base_pkgs=python3,python3-venv,python-is-python3,ca-certificates,passwd
base_key=$(printf 'bookworm %s %s v1' "$base_pkgs" "$mirror" | sha)
if [ "$(b inspect --format '{{index .ImageAnnotations "dev.rft.input"}}' "$base_ref" 2>/dev/null)" != "$base_key" ]; then
  t0=$SECONDS
  tar=$out/base-$base_key.tar
  if ! [ -s "$tar" ]; then
    log "mmdebstrap bookworm ($base_pkgs)"
    mmdebstrap --quiet --variant=minbase --include="$base_pkgs" --format=tar bookworm "$tar.tmp" "$mirror" \
      || die "mmdebstrap failed"
    mv -f "$tar.tmp" "$tar"
  fi
  c=$(b from --quiet scratch)
  b add --quiet "$c" "$tar" / >/dev/null
  b config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd '["python3"]' --annotation "dev.rft.input=$base_key" "$c"
  b commit --quiet --rm "$c" "$base_ref" >/dev/null
  log "base $base_ref ready in $((SECONDS - t0))s"
fi

# --- the project's images --------------------------------------------------------------------------
app_version=$(sed -nE 's/^appVersion: *"?([^"]+)"?/\1/p' "$root/charts/rft-operator/Chart.yaml")
# images.runtime and images.vllm of the chart's values.yaml (two-space indented keys under `images:`)
chart_image() { sed -nE '/^images:/,/^[^ #]/ s/^  '"$1"': *"?([^" #]+)"?.*/\1/p' "$root/charts/rft-operator/values.yaml"; }
runtime_ref=$(chart_image runtime)
vllm_ref=$(chart_image vllm)
[ -n "$app_version" ] && [ -n "$runtime_ref" ] && [ -n "$vllm_ref" ] || die "cannot read the default image names"
case $vllm_ref in */*/*) ;; *) vllm_ref=docker.io/$vllm_ref ;; esac  # as the kubelet normalises the pod's name
declare -A refs=([operator]="ghcr.io/rft-dev/rft-operator:$app_version" [runtime]="$runtime_ref" [vllm]="$vllm_ref")
declare -A dockerfiles=([operator]=operator/Dockerfile [runtime]=runtime/Dockerfile [vllm]=images/vllm-cpu/Dockerfile)

inputs_key() { # NAME -> hash of the Dockerfile, the files its COPY reads, the base
  (cd "$root" && {
    echo "$base_key"
    if [ "$1" = vllm ]; then
      inputs_key runtime  # its base
      sha256sum requirements/vllm.txt requirements/uv.txt
    else
      # requirements/: only the locks the Dockerfiles install (a test tool's lock rebuilds no image)
      git ls-files -co --exclude-standard -- pyproject.toml README.md requirements/operator.txt \
        requirements/runtime.txt requirements/uv.txt api operator runtime \
        | grep -v -e '__pycache__' -e '/Dockerfile$' | sort | xargs -d '\n' sha256sum
    fi
    cat .dockerignore 2>/dev/null
    sha256sum "${dockerfiles[$1]}"
  } | sha)
}

# The build reaches PyPI through whatever TLS trust this machine has: its CA bundle and a pip.conf
# naming it are mounted into RUN steps only (never part of an image).
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
build_mounts=()
if [ -s "$ca" ]; then
  printf '[global]\ncert = /etc/rft-build/ca.crt\n' >"$out/pip.conf"
  build_mounts=(--volume "$ca:/etc/rft-build/ca.crt:ro" --volume "$out/pip.conf:/etc/pip.conf:ro")
fi

# vllm is built FROM the runtime image: that one first.
case " $want " in *" vllm "*) want="$(echo " $want " | sed 's/ runtime / /; s/ vllm / runtime vllm /')";; esac

# Every key once, before any build: a file edited while an image builds cannot make the vLLM image look
# for a runtime archive of other inputs than the one just built.
declare -A keys=()
for name in $want; do keys[$name]=$(inputs_key "$name"); done

list=$out/images.txt
# The listing keeps other images' lines (still present archives) and replaces the ones built now.
: >"$list.tmp"
if [ -f "$list" ]; then
  while read -r ref archive; do
    keep=1
    for name in $want; do [ "$ref" = "${refs[$name]}" ] && keep=0; done
    [ $keep = 1 ] && [ -s "$archive" ] && echo "$ref $archive" >>"$list.tmp"
  done <"$list"
fi
for name in $want; do
  ref=${refs[$name]}
  key=${keys[$name]}
  archive=$out/$name-$key.oci
  if ! [ -s "$archive" ]; then
    t0=$SECONDS
    log "building $ref from ${dockerfiles[$name]} (inputs $key)"
    build_args=()
    if [ "$name" = vllm ]; then  # its base, the runtime image, back into the store from its archive
      runtime_archive=$out/runtime-${keys[runtime]}.oci
      [ -s "$runtime_archive" ] || die "the runtime image's archive $runtime_archive is missing"
      base_id=$(b pull --quiet "oci-archive:$runtime_archive") || die "buildah pull of $runtime_archive failed"
      b tag "$base_id" "$runtime_ref" || die "buildah tag of the runtime image failed"
      build_args=(--build-arg "RUNTIME_IMAGE=$runtime_ref")
    fi
    (cd "$root" && b bud --quiet --pull=never "${build_mounts[@]}" "${build_args[@]}" -f "${dockerfiles[$name]}" -t "$ref" \
      --annotation "dev.rft.input=$key" . >"$out/$name-build.log" 2>&1) \
      || { tail -30 "$out/$name-build.log" >&2; b rm --all >/dev/null 2>&1; b rmi --prune >/dev/null 2>&1
           die "buildah bud of $name failed (log $out/$name-build.log)"; }
    t1=$SECONDS
    rm -f "$archive.tmp"
    b push --quiet --disable-compression "$ref" "oci-archive:$archive.tmp:$ref" >/dev/null || die "buildah push of $ref failed"
    mv -f "$archive.tmp" "$archive"
    # The archive is the cache: buildah's store keeps only the base (a runtime build leaves ~6 GB).
    b rmi -f "$ref" >/dev/null 2>&1 || true
    [ "$name" = vllm ] && { b rmi -f "$runtime_ref" >/dev/null 2>&1 || true; }
    b rm --all >/dev/null 2>&1 || true
    b rmi --prune >/dev/null 2>&1 || true
    # Older archives of this image are superseded.
    find "$out" -maxdepth 1 -name "$name-*.oci" ! -name "$(basename "$archive")" -delete
    log "$ref built in $((t1 - t0))s, archived in $((SECONDS - t1))s ($(du -h "$archive" | cut -f1))"
  fi
  echo "$ref $archive" >>"$list.tmp"
done
mv -f "$list.tmp" "$list"

if [ -n "${REGISTRY:-}" ]; then
  case $REGISTRY in *://*|*/|*" "*) die "REGISTRY is host[:port][/prefix], not $REGISTRY" ;; esac
  push_args=(--quiet "--tls-verify=${REGISTRY_TLS_VERIFY:-true}")
  if [ -n "${REGISTRY_USER:-}" ]; then
    push_args+=(--creds "$REGISTRY_USER:${REGISTRY_PASSWORD:?REGISTRY_PASSWORD is required with REGISTRY_USER}")
  elif [ -n "${REGISTRY_AUTH_FILE:-}" ]; then
    [ -s "$REGISTRY_AUTH_FILE" ] || die "REGISTRY_AUTH_FILE $REGISTRY_AUTH_FILE is missing"
    push_args+=(--authfile "$REGISTRY_AUTH_FILE")
  fi
  case ${REGISTRY_COMPRESSION:-gzip} in
    none) push_args+=(--disable-compression) ;;
    gzip|zstd) push_args+=(--compression-format "${REGISTRY_COMPRESSION:-gzip}") ;;
    *) die "REGISTRY_COMPRESSION is gzip, zstd or none, not $REGISTRY_COMPRESSION" ;;
  esac
  : >"$out/pushed.txt.tmp"
  for name in $want; do
    ref=${refs[$name]}
    archive=$out/$name-${keys[$name]}.oci
    base=${ref##*/}
    dest=$REGISTRY/$base
    t0=$SECONDS
    id=$(b pull --quiet "oci-archive:$archive") || die "buildah pull of $archive failed"
    b push "${push_args[@]}" --digestfile "$out/push.digest" "$id" "docker://$dest" >&2 \
      || { b rmi -f "$id" >/dev/null 2>&1; die "buildah push of $ref to $dest failed"; }
    b rmi -f "$id" >/dev/null 2>&1 || true
    echo "$dest@$(cat "$out/push.digest")" >>"$out/pushed.txt.tmp"
    log "pushed $dest@$(cat "$out/push.digest") in $((SECONDS - t0))s"
  done
  mv -f "$out/pushed.txt.tmp" "$out/pushed.txt"
fi
echo "$list"
exit 0
}
