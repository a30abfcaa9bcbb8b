# Sourced by hack/{vllm,trl,mlflow}-venv.sh: one venv per lock file, built once in the cache.
#
#   cached_venv NAME VERSION LOCK LAYERED CHECK
#
# Builds (once; concurrent callers wait on a lock) $cache/NAME-VERSION-KEY holding exactly LOCK
# (hashes checked, --no-deps: nothing resolved; hack/lock.sh wrote it) and sets $venv to it. With
# LAYERED=1 the project's dependency venv is added after the venv's own packages through a .pth file
# (for packages that must run on the dev set's torch), and its path is part of KEY. CHECK (a shell
# command, with $venv set) runs once after the install; its output goes to stderr.
# Expects $root and $cache.
#
# prune_stale PATH PREFIX: before PATH (a cached venv about to be built) is built, the same kind's
# other builds (PREFIX-*: another version or lock) go but the newest one, so a lock change does not
# leave a torch-sized venv behind for good (nor need the disk of three), while a checkout still on the
# previous lock keeps working.
prune_stale() {
  local built=$1 prefix=$2 old
  # shellcheck disable=SC2012  # ls -t: newest first; the names are ours (no spaces)
  for old in $(ls -1dt "$prefix"-*/ 2>/dev/null | sed 's:/$::' | grep -vxF "$built" | tail -n +2); do
    [ -f "$old/.complete" ] || [ -d "$old/bin" ] || continue
    echo "[cache] removing $old (superseded by $built)" >&2
    rm -rf "$old"
  done
}

cached_venv() {
  local name=$1 version=$2 lock=$3 layered=$4 check=$5 deps_site="" key site
  if [ "$layered" = 1 ]; then
    [ -f "$root/.venv/.deps" ] || bash "$root/hack/venv.sh" >&2
    deps_site=$(cat "$root/.venv/.deps")
    key=$( (cat "$lock"; echo "$deps_site") | sha256sum | cut -c1-12)
  else
    key=$(sha256sum "$lock" | cut -c1-12)
  fi
  venv="$cache/$name-$version-$key"
  [ -f "$venv/.complete" ] && return 0
  mkdir -p "$cache"
  exec 9>"$cache/.$name.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    echo "[$name] building $venv (one time)" >&2
    prune_stale "$venv" "$cache/$name"
    rm -rf "$venv"
    python3 -m venv "$venv"
    if [ "$layered" = 1 ]; then
      site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      echo "import site; site.addsitedir('$deps_site')" > "$site/_rft_deps.pth"
    fi
    "$(bash "$root/hack/uv.sh")" pip install --python "$venv/bin/python" --no-deps --require-hashes -q -r "$lock" >&2
    eval "$check" >&2
    touch "$venv/.complete"
  fi
  exec 9>&-
}
