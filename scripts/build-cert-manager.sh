#!/usr/bin/env bash
# Builds cert-manager's commands from Go modules into a cache keyed by version, Go version and these sources,
# outside the work tree. Prints the cache directory on stdout; progress goes to stderr. Builds only what is
# missing. (Its CRDs and its install come from its own Helm chart, in the same module: devtools/clusters/certmanager.py.)
#
#   scripts/build-cert-manager.sh
#
# The version is the one controlplane/commands/cert-manager/go.mod requires (to move it: edit the require line and
# run `go mod tidy` there). cert-manager's own command modules (cmd/controller, cmd/cainjector, cmd/webhook
# of its repository) are not served by the Go module proxy, so each command is a main package of
# controlplane/commands/cert-manager/ (one directory per command) over the packages of the module the proxy serves.
# Every directory with a main.go is built (controller, cainjector, webhook: ours, doing what upstream's cmd/*/app
# do, which live only in those unserved modules; startup/ is what the three share). The Venafi client module those packages link is not served
# either: go.mod replaces it with controlplane/commands/cert-manager/vcert, a stand-in whose connections all fail.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
mod_dir="$here/controlplane/commands/cert-manager"
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
export GOFLAGS=-mod=mod CGO_ENABLED=0

die() { echo "build-cert-manager: $*" >&2; exit 2; }

m=github.com/cert-manager/cert-manager
version=$(awk -v m=$m '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$mod_dir/go.mod")
[[ -n $version ]] || die "controlplane/commands/cert-manager/go.mod requires no github.com/cert-manager/cert-manager"
go_version=$(go env GOVERSION)
# The key: the version, the Go version and our sources (the mains, go.mod, go.sum, the vcert stand-in), so an
# edited main is built again here and on a machine that kept the old binaries.
key=$(cd "$mod_dir" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -print0 | sort -z \
      | xargs -0 sha256sum | sha256sum | cut -c1-12)
out="$cache_root/cert-manager/$version-$go_version-$key"
# As cert-manager's release build stamps it (pkg/util.VersionInfo; the --version of each command).
ldflags="-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$version"

commands=()
for main in "$mod_dir"/*/main.go; do
  commands+=("$(basename "$(dirname "$main")")")
done
missing=()
for name in "${commands[@]}"; do
  [[ -x $out/$name ]] || missing+=("$name")
done
if (( ${#missing[@]} == 0 )); then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
start=$(date +%s)
log() { echo "[cert-manager $version $(( $(date +%s) - start ))s] $*" >&2; }

for name in "${missing[@]}"; do
  log "building $name (a first build on this machine takes minutes)"
  # Into a temporary name first: an interrupted build never leaves a binary that looks complete.
  (cd "$mod_dir" && go build -trimpath -ldflags "$ldflags" -o "$out/.$name.tmp" "./$name")
  mv -f "$out/.$name.tmp" "$out/$name"
done
log "done: $out"
echo "$out"
