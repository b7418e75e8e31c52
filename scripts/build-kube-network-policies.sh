#!/usr/bin/env bash
# Builds kube-network-policies (the NetworkPolicy implementation of the node tier: devtools/clusters/netpol.py) from
# its Go module into a cache keyed by version, Go version and these sources, outside the work tree. Prints
# the cache directory on stdout; progress goes to stderr. Builds only what is missing.
#
#   scripts/build-kube-network-policies.sh
#
# The version is the one controlplane/commands/kube-network-policies/go.mod requires (to move it: edit the require
# line and run `go mod tidy` there). The command is controlplane/commands/kube-network-policies/main.go (upstream's
# cmd/main.go with a --kubeconfig: why is said there) over the packages of the module the Go module proxy
# serves. One file of github.com/google/nftables is replaced for this build only: the build runs in a
# temporary copy of that module directory, vendored (go mod vendor), where vendor/'s expr/queue.go of
# github.com/google/nftables is overwritten by controlplane/commands/kube-network-policies/_nftables/expr/queue.go,
# which sends nftables' queue expression as the xtables NFQUEUE target, for kernels built without nft_queue
# (CONFIG_NFT_QUEUE); that file says why. (go build -overlay would be smaller, but refuses files of the
# module cache.) The replaced file is checked against the digest of the one it was written from, so that
# moving either module fails here rather than building a mix.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
mod_dir="$here/controlplane/commands/kube-network-policies"
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
export GOFLAGS=-mod=mod CGO_ENABLED=0

die() { echo "build-kube-network-policies: $*" >&2; exit 2; }

m=sigs.k8s.io/kube-network-policies
version=$(awk -v m=$m '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$mod_dir/go.mod")
[[ -n $version ]] || die "controlplane/commands/kube-network-policies/go.mod requires no $m"
go_version=$(go env GOVERSION)
# The key: the version, the Go version and our sources (main.go, the nftables file, go.mod, go.sum), so an
# edited source is built again here and on a machine that kept the old binary.
key=$(cd "$mod_dir" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -print0 | sort -z \
      | xargs -0 sha256sum | sha256sum | cut -c1-12)
out="$cache_root/kube-network-policies/$version-$go_version-$key"
name=kube-network-policies

if [[ -x $out/$name ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
start=$(date +%s)
log() { echo "[kube-network-policies $version $(( $(date +%s) - start ))s] $*" >&2; }

# github.com/google/nftables v0.3.0's expr/queue.go, the file _nftables/expr/queue.go was written from.
nft_module=github.com/google/nftables
nft_version=v0.3.0
nft_queue_sha256=5345ba825529422e75379aea33a50c831202ab7513ff3915e806a7413fa0c66b
work=$(mktemp -d "${TMPDIR:-/tmp}/kube-network-policies-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp "$mod_dir/go.mod" "$mod_dir/go.sum" "$mod_dir/main.go" "$work/"
log "vendoring"
(cd "$work" && go mod vendor)
grep -qx "# $nft_module $nft_version" "$work/vendor/modules.txt" \
  || die "$nft_module is not $nft_version here: _nftables/expr/queue.go is for $nft_version"
queue="$work/vendor/$nft_module/expr/queue.go"
echo "$nft_queue_sha256  $queue" | sha256sum --quiet -c - \
  || die "$nft_module's expr/queue.go is not the file _nftables/expr/queue.go was written from"
cp "$mod_dir/_nftables/expr/queue.go" "$queue"

log "building $name (a first build on this machine takes minutes)"
# Into a temporary name first: an interrupted build never leaves a binary that looks complete.
(cd "$work" && GOFLAGS=-mod=vendor go build -trimpath -ldflags "-s -w" -o "$out/.$name.tmp" .)
mv -f "$out/.$name.tmp" "$out/$name"
log "done: $out"
echo "$out"
