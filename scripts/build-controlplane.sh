#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and helm from their Go
# modules into a cache keyed by version, outside the work tree, so a second run (and CI on the same
# machine) takes seconds. Prints the cache directory on stdout; progress goes to stderr.
#
# The key covers what decides the bytes of the binaries: the go.mod files (go.sum only verifies what they
# select, and grows when a binary needs more modules), the build flags and the Go version. Not this
# script's text: each binary is built only when it is missing from its directory, so adding one to the
# list builds that one alone, while a change to the flags or the versions changes the key.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cp_dir="$here/controlplane"
k8s_version=$(awk '/^require k8s.io\/kubernetes /{print $3}' "$cp_dir/go.mod")
etcd_version=$(awk '/^require go.etcd.io\/etcd\/server\/v3 /{print $3}' "$cp_dir/etcd/go.mod")
helm_version=$(awk '/^require helm.sh\/helm\/v4 /{print $3}' "$cp_dir/helm/go.mod")

ldflags="-s -w"
# Without these, the Kubernetes binaries report v0.0.0-master (the module build has no git stamping).
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$k8s_version"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"
# As helm's own release build stamps it; otherwise "helm version" reports only the minor version.
helm_ldflags="-X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.metadata="
build_flags="CGO_ENABLED=0 -trimpath ldflags=[$ldflags] k8s=[$k8s_ldflags] helm=[$helm_ldflags]"

# k8s.io/kubernetes may ask for a newer Go than the machine has; this is the approved toolchain.
go_minor() { go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/'; }
need_minor=$(awk '/^go /{split($2,v,"."); print v[2]}' "$cp_dir/go.mod")
if (( $(go_minor) < need_minor )); then export GOTOOLCHAIN=go1.27.3; fi

key=$( (cat "$cp_dir/go.mod" "$cp_dir/etcd/go.mod" "$cp_dir/helm/go.mod"
        echo "$build_flags"
        go env GOVERSION) | sha256sum | cut -c1-12)
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
out="$cache_root/controlplane/$k8s_version-etcd-$etcd_version-helm-$helm_version-$key"

# name, module directory, package, extra ldflags; in build order (the first build on a machine is longest).
targets=(
  "etcd|$cp_dir/etcd|go.etcd.io/etcd/server/v3|"
  "kube-apiserver|$cp_dir|k8s.io/kubernetes/cmd/kube-apiserver|$k8s_ldflags"
  "kube-controller-manager|$cp_dir|k8s.io/kubernetes/cmd/kube-controller-manager|$k8s_ldflags"
  "kube-scheduler|$cp_dir|k8s.io/kubernetes/cmd/kube-scheduler|$k8s_ldflags"
  "kubectl|$cp_dir|k8s.io/kubernetes/cmd/kubectl|$k8s_ldflags"
  "helm|$cp_dir/helm|helm.sh/helm/v4/cmd/helm|$helm_ldflags"
)
missing=()
for t in "${targets[@]}"; do
  [[ -x "$out/${t%%|*}" ]] || missing+=("$t")
done
if (( ${#missing[@]} == 0 )); then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
start=$(date +%s)
log() { echo "[controlplane $(( $(date +%s) - start ))s] $*" >&2; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
for t in "${missing[@]}"; do
  IFS='|' read -r name dir pkg extra <<<"$t"
  log "building $name ($pkg; a first build on this machine takes minutes)"
  # Into a temporary name first: an interrupted build never leaves a binary that looks complete.
  (cd "$dir" && go build -trimpath -ldflags "$ldflags $extra" -o "$out/.$name.tmp" "$pkg")
  mv -f "$out/.$name.tmp" "$out/$name"
done
log "done: $out"
echo "$out"
