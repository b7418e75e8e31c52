#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kubectl and helm from their Go modules into a cache keyed by version,
# outside the work tree, so a second run (and CI on the same machine) takes seconds.
# Prints the cache directory on stdout; progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cp_dir="$here/controlplane"
k8s_version=$(awk '/^require k8s.io\/kubernetes /{print $3}' "$cp_dir/go.mod")
etcd_version=$(awk '/^require go.etcd.io\/etcd\/server\/v3 /{print $3}' "$cp_dir/etcd/go.mod")
helm_version=$(awk '/^require helm.sh\/helm\/v4 /{print $3}' "$cp_dir/helm/go.mod")
# The script itself is part of the key: a change to the build flags must not reuse old binaries.
key=$( (cat "$cp_dir/go.mod" "$cp_dir/go.sum" "$cp_dir/etcd/go.mod" "$cp_dir/etcd/go.sum" \
          "$cp_dir/helm/go.mod" "$cp_dir/helm/go.sum" "${BASH_SOURCE[0]}"
        go env GOVERSION) | sha256sum | cut -c1-12)
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
out="$cache_root/controlplane/$k8s_version-etcd-$etcd_version-helm-$helm_version-$key"

if [[ -x "$out/kube-apiserver" && -x "$out/kubectl" && -x "$out/etcd" && -x "$out/helm" ]]; then
  echo "$out"
  exit 0
fi

# k8s.io/kubernetes may ask for a newer Go than the machine has; this is the approved toolchain.
go_minor() { go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/'; }
need_minor=$(awk '/^go /{split($2,v,"."); print v[2]}' "$cp_dir/go.mod")
if (( $(go_minor) < need_minor )); then export GOTOOLCHAIN=go1.27.3; fi

mkdir -p "$out.tmp"
start=$(date +%s)
log() { echo "[controlplane $(( $(date +%s) - start ))s] $*" >&2; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
ldflags="-s -w"
# Without these, both binaries report v0.0.0-master (the module build has no git stamping).
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
version_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version"
version_ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor"
version_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
log "building etcd $etcd_version (first build on this machine: several minutes)"
(cd "$cp_dir/etcd" && go build -trimpath -ldflags "$ldflags" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3)
log "building kube-apiserver $k8s_version (the longest step)"
(cd "$cp_dir" && go build -trimpath -ldflags "$ldflags $version_ldflags" -o "$out.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
log "building kubectl $k8s_version"
(cd "$cp_dir" && go build -trimpath -ldflags "$ldflags $version_ldflags" -o "$out.tmp/kubectl" k8s.io/kubernetes/cmd/kubectl)
log "building helm $helm_version"
# As helm's own release build stamps it; otherwise "helm version" reports only the minor version.
helm_ldflags="-X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.metadata="
(cd "$cp_dir/helm" && go build -trimpath -ldflags "$ldflags $helm_ldflags" -o "$out.tmp/helm" helm.sh/helm/v4/cmd/helm)
rm -rf "$out" && mv "$out.tmp" "$out"
log "done: $out"
echo "$out"
