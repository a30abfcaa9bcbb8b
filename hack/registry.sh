#!/usr/bin/env bash
# Builds (once) the OCI registry the image tests push to and the node pulls from, and prints its path:
# ${RFT_CACHE:-$HOME/.cache/rft-operator}/bin/registry-<version>. Beside it, registry-<version>-htpasswd:
# reads "user password" lines on stdin and writes htpasswd lines (bcrypt, cost 10, from the same module
# graph's golang.org/x/crypto/bcrypt) for the registry's basic auth.
#
# The source is github.com/distribution/distribution/v3 (cmd/registry) from the Go module proxy, built
# from a throwaway module that requires it; CGO_ENABLED=0, stripped, only the filesystem storage driver
# and htpasswd authentication used (docs/how-to/images.md). The Go module and build caches are the
# defaults (GOMODCACHE and GOCACHE are respected). The binary is written next to its final path and
# renamed into place, so the final path exists only complete. Concurrent runs serialise on a lock.
# Logs go to stderr; stdout is just the path.
#
# Environment: RFT_CACHE, RFT_BUILD_JOBS (go build -p, default 2), RFT_REGISTRY_VERSION (default v3.1.2).
set -euo pipefail
cache=${RFT_CACHE:-$HOME/.cache/rft-operator}
module=github.com/distribution/distribution/v3
version=${RFT_REGISTRY_VERSION:-v3.1.2}
bin=$cache/bin
exe=$bin/registry-$version
if [ -x "$exe" ] && [ -x "$exe-htpasswd" ]; then echo "$exe"; exit 0; fi
mkdir -p "$bin"
exec 9>"$bin/.registry.lock"
flock 9
if [ -x "$exe" ] && [ -x "$exe-htpasswd" ]; then echo "$exe"; exit 0; fi
command -v go >/dev/null || { echo "[registry] go is required (https://go.dev/dl) to build the registry" >&2; exit 1; }
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

echo "[registry] building $module/cmd/registry@$version (one time)" >&2
t0=$SECONDS
tmp=$(mktemp -d "$bin/.registry-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mod=$tmp/src
mkdir -p "$mod"
printf 'module rft.local/registry\n\ngo 1.26\n\nrequire %s %s\n' "$module" "$version" >"$mod/go.mod"
mkdir -p "$mod/htpasswd"
cat >"$mod/htpasswd/main.go" <<'GO'
// htpasswd lines for the registry's basic auth: "user password" per stdin line -> "user:<bcrypt>".
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		user, password, ok := strings.Cut(in.Text(), " ")
		if !ok || user == "" || strings.Contains(user, ":") {
			fmt.Fprintln(os.Stderr, "want a line \"user password\" (no ':' in the user)")
			os.Exit(2)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s:%s\n", user, hash)
	}
}
GO
(cd "$mod" && GOFLAGS=-mod=mod go get "$module/cmd/registry@$version" >&2 \
  && GOFLAGS=-mod=mod go mod tidy >&2 \
  && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -p "${RFT_BUILD_JOBS:-2}" -trimpath \
    -ldflags "-s -w -X $module/version.version=$version" -o "$tmp/registry" "$module/cmd/registry" >&2 \
  && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$tmp/htpasswd" ./htpasswd >&2)
"$tmp/registry" --version >&2
echo "u p" | "$tmp/htpasswd" | grep -q '^u:\$2a\$10\$' || { echo "[registry] the htpasswd helper does not work" >&2; exit 1; }
mv -f "$tmp/htpasswd" "$exe-htpasswd"
mv -f "$tmp/registry" "$exe"
echo "[registry] built $exe in $((SECONDS - t0))s" >&2
echo "$exe"
