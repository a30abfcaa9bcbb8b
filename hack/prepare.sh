#!/usr/bin/env bash
# Builds everything `make test` needs before its first test, the independent builds concurrently, and
# prints how long each took. All of them are cached in ${RFT_CACHE:-$HOME/.cache/rft-operator} and return
# at once when present, so a warm run costs seconds.
#
#   hack/prepare.sh [PART ...]      PART: venv vllm smollm2 hadolint seaweedfs registry prometheus control-plane
#                                   node images
#                                   (default: all)
#   hack/prepare.sh --background [PART ...]
#                                   the same, detached from this shell (returns at once; its own output
#                                   in $RFT_CACHE/logs/prepare.log, its pid in prepare.pid). `make test`
#                                   runs the tests meanwhile: each build script serialises on its own lock,
#                                   so a test that needs a part still building waits for it
#                                   (tests/support/prereqs.py), and one built returns at once.
#   hack/prepare.sh --wait          waits for the background run, prints each part's time; fails when one
#                                   failed.
#
# Three chains run side by side (they share no inputs, and each is bound by something else: the Go
# builds by the CPU, the venvs and images mostly by downloads and disk):
#   python   venv -> vllm venv, hadolint, smollm2 (hack/smollm2.sh: the pretrained model tests/models runs),
#            registry (hack/registry.sh: the OCI registry the image tests push to; about 90 s cold, 10 s
#            with the Go caches warm), seaweedfs (the S3 server the storage tests run against),
#            prometheus (hack/prometheus.sh: the Prometheus the monitoring e2e test runs)
#   k8s      control-plane -> node (kubelet, kube-proxy, CoreDNS, kube-router; Debian packages)
#   images   hack/build-images.sh (base, operator, runtime, vLLM-on-CPU; RFT_IMAGES picks a subset)
# A part that fails stops nothing else; the script then exits 1 naming each failed part with the end of
# its log. Logs: $RFT_CACHE/logs/prepare-PART.log. Timings: $RFT_CACHE/logs/prepare-times.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
export RFT_CACHE=$cache
logs=$cache/logs
mkdir -p "$logs"
if [ "${1:-}" = --background ]; then
  shift
  setsid nohup bash "$0" "$@" </dev/null >"$logs/prepare.log" 2>&1 &
  echo $! >"$logs/prepare.pid"
  echo "[prepare] building in the background (pid $!; $logs/prepare.log, each part's time in $logs/prepare-times.txt)" >&2
  exit 0
fi
if [ "${1:-}" = --wait ]; then  # for a background run: wait for it, print its parts' times, its status
  pid=$(cat "$logs/prepare.pid" 2>/dev/null || true)
  if [ -n "$pid" ]; then while kill -0 "$pid" 2>/dev/null; do sleep 2; done; fi
  echo "[prepare] the background build's parts:" >&2
  cat "$logs/prepare-times.txt" >&2
  ! grep -q FAILED "$logs/prepare-times.txt"
  exit
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(venv vllm smollm2 hadolint seaweedfs registry prometheus control-plane node images)
wants() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
for p in "${parts[@]}"; do
  case $p in venv|vllm|smollm2|hadolint|seaweedfs|registry|prometheus|control-plane|node|images) ;; *) echo "[prepare] unknown part '$p'" >&2; exit 2 ;; esac
done

times=$logs/prepare-times.txt
: >"$times"
step() { # NAME COMMAND... : runs one part, logs it, records its time; returns its status
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" >"$logs/prepare-$name.log" 2>&1 || rc=$?
  printf '%-14s %5ss  %s\n' "$name" $((SECONDS - t0)) "$([ $rc = 0 ] && echo ok || echo "FAILED ($rc)")" | tee -a "$times" >&2
  return $rc
}

t_all=$SECONDS
bash "$root/hack/reclaim.sh" || true  # earlier sessions' node images and interrupted builds: disk first
pids=()
if wants venv || wants vllm || wants smollm2 || wants hadolint || wants seaweedfs || wants registry || wants prometheus; then
  (
    if wants venv || wants vllm || wants smollm2; then step venv bash "$root/hack/venv.sh" || exit 1; fi
    rc=0
    if wants vllm; then step vllm bash "$root/hack/vllm-venv.sh" || rc=1; fi
    if wants hadolint; then step hadolint bash "$root/hack/hadolint.sh" || rc=1; fi
    if wants smollm2; then step smollm2 bash "$root/hack/smollm2.sh" || rc=1; fi
    if wants registry; then step registry bash "$root/hack/registry.sh" || rc=1; fi
    if wants seaweedfs; then step seaweedfs bash "$root/hack/seaweedfs.sh" || rc=1; fi
    if wants prometheus; then step prometheus bash "$root/hack/prometheus.sh" || rc=1; fi
    exit $rc
  ) &
  pids+=($!)
fi
if wants control-plane || wants node; then
  (
    step control-plane bash "$root/hack/build-control-plane.sh" || exit 1
    if wants node; then step node bash "$root/hack/build-node.sh" || exit 1; fi
  ) &
  pids+=($!)
fi
if wants images; then
  ( step images bash "$root/hack/build-images.sh" ) &
  pids+=($!)
fi
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
printf '%-14s %5ss\n' total $((SECONDS - t_all)) | tee -a "$times" >&2
if [ $failed = 1 ]; then
  for log in "$logs"/prepare-*.log; do
    name=$(basename "$log" .log); name=${name#prepare-}
    grep -q "^$name .*FAILED" "$times" || continue
    echo "[prepare] $name failed; the end of $log:" >&2
    tail -25 "$log" >&2
  done
  exit 1
fi
