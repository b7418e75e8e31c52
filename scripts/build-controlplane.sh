#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet (the node tier)
# and helm from their Go modules into a cache keyed by version, outside the work tree, so a second run
# (and CI on the same machine) takes seconds. Prints the cache directory on stdout; progress goes to stderr.
#
#   scripts/build-controlplane.sh                  the newest Kubernetes pinned in controlplane/pins/kubernetes/
#   KUBE_VERSION=floor scripts/build-controlplane.sh   the oldest pinned one (the chart's floor)
#   KUBE_VERSION=1.33 scripts/build-controlplane.sh    any other minor (its newest patch) or exact version
#   scripts/build-controlplane.sh --pin 1.30.14    (re)write controlplane/pins/kubernetes/v1.30/ for a version
#   ONLY=helm scripts/build-controlplane.sh        only the binaries named (a step that needs no cluster:
#                                                  `make release` needs helm alone), into the same directory
#
# A version without a pin gets its module written into the cache (go.mod generated as --pin writes it).
#
# The key covers what decides the bytes of the binaries: the go.mod files (go.sum only verifies what they
# select, and grows when a binary needs more modules), the build flags and the Go version. Not this
# script's text: each binary is built only when it is missing from its directory, so adding one to the
# list builds that one alone, while a change to the flags or the versions changes the key.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cp_dir="$here/controlplane/pins"
pins_dir="$cp_dir/kubernetes"
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
export GOFLAGS=-mod=mod

die() { echo "build-controlplane: $*" >&2; exit 2; }
pinned() { (cd "$pins_dir" && ls -d v1.* | sort -V); }

# k8s.io/kubernetes may ask for a newer Go than the machine has; this is the approved toolchain.
go_minor() { go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/'; }
use_toolchain_for() {
  local need_minor
  need_minor=$(awk '/^go /{split($2,v,"."); print v[2]}' "$1")
  if (( $(go_minor) < need_minor )); then export GOTOOLCHAIN=go1.27.3; fi
}

# The newest patch of a minor ("1.33" -> "v1.33.13"), or an exact version as given, checked to exist.
resolve() {
  local want=${1#v} versions
  versions=$(cd "$cache_root" && go list -m -versions k8s.io/kubernetes | tr ' ' '\n' | grep -E '^v1\.[0-9]+\.[0-9]+$') \
    || die "cannot list the versions of k8s.io/kubernetes from the Go module proxy"
  local found
  if [[ $want =~ ^1\.[0-9]+$ ]]; then
    found=$(grep -F "v$want." <<<"$versions" | sort -V | tail -1)
  else
    found=$(grep -Fx "v$want" <<<"$versions" || true)
  fi
  [[ -n $found ]] || die "KUBE_VERSION=$1: no such release of k8s.io/kubernetes (give 1.MINOR or 1.MINOR.PATCH)"
  echo "$found"
}

# Writes go.mod, go.sum and tools.go for k8s.io/kubernetes $1 into $2: its staging modules (k8s.io/api,
# client-go, ...) are replaced by their published v0.MINOR.PATCH, as a module outside its repository needs.
write_module() {
  local version=$1 dir=$2 kube_mod
  mkdir -p "$dir"
  kube_mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [[ -f $kube_mod ]] || die "could not download k8s.io/kubernetes@$version"
  {
    echo "// Pins the control-plane binaries the end-to-end tests and 'make run' use."
    echo "module hami-mt-webhook/controlplane"
    echo
    awk '/^go /{print; exit}' "$kube_mod"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "replace ("
    awk -v v="v0.${version#v1.}" '$2 == "=>" && $3 ~ /^\.\/staging\// {printf "\t%s => %s %s\n", $1, $1, v}' "$kube_mod"
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

// Package tools names the commands built from k8s.io/kubernetes so that go.mod pins them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
EOF
  use_toolchain_for "$dir/go.mod"
  (cd "$dir" && go mod tidy) >&2
}

mkdir -p "$cache_root"
if [[ ${1:-} == --pin ]]; then
  [[ -n ${2:-} ]] || die "--pin needs a version, for example --pin 1.30.14"
  version=$(resolve "$2")
  minor_dir="$pins_dir/$(echo "$version" | cut -d. -f1,2)"
  write_module "$version" "$minor_dir"
  echo "$minor_dir"
  exit 0
fi

want=${KUBE_VERSION:-newest}
case $want in
  newest) mod_dir="$pins_dir/$(pinned | tail -1)" ;;
  floor) mod_dir="$pins_dir/$(pinned | head -1)" ;;
  *)
    [[ $want =~ ^v?1\.[0-9]+(\.[0-9]+)?$ ]] || die "KUBE_VERSION=$want: give newest, floor, 1.MINOR or 1.MINOR.PATCH"
    minor=$(echo "v${want#v}" | cut -d. -f1,2)
    pin_version=""
    [[ -f $pins_dir/$minor/go.mod ]] && pin_version=$(awk '/^require k8s.io\/kubernetes /{print $3}' "$pins_dir/$minor/go.mod")
    if [[ -n $pin_version && ( $want =~ ^v?1\.[0-9]+$ || v${want#v} == "$pin_version" ) ]]; then
      mod_dir="$pins_dir/$minor"
    else
      # A minor already written into the cache is taken as it is, without asking the module proxy again
      # (a later patch: ask for it exactly, KUBE_VERSION=1.MINOR.PATCH).
      cached=""
      if [[ $want =~ ^v?1\.[0-9]+$ ]]; then
        cached=$(cd "$cache_root/controlplane/modules" 2>/dev/null && ls -d "$minor".*/go.sum 2>/dev/null \
                 | cut -d/ -f1 | sort -V | tail -1 || true)
      fi
      version=${cached:-$(resolve "$want")}
      mod_dir="$cache_root/controlplane/modules/$version"
      # A module proxy may lack some release's staging modules: for a minor asked for as such, older patches
      # are tried (the newest one whose modules are all served is built), up to five.
      tries=1
      [[ $want =~ ^v?1\.[0-9]+$ ]] && tries=5
      until [[ -f $mod_dir/go.sum ]]; do
        if ( write_module "$version" "$mod_dir.tmp" ); then
          mv "$mod_dir.tmp" "$mod_dir"
          break
        fi
        rm -rf "$mod_dir.tmp"
        patch=${version##*.}
        (( --tries > 0 && patch > 0 )) || die "Kubernetes $version: the Go module proxy does not serve all its modules"
        echo "build-controlplane: Kubernetes $version: the Go module proxy lacks some of its modules;" \
             "trying v${want#v}.$(( patch - 1 ))" >&2
        version="v${want#v}.$(( patch - 1 ))"
        mod_dir="$cache_root/controlplane/modules/$version"
      done
    fi
    ;;
esac

k8s_version=$(awk '/^require k8s.io\/kubernetes /{print $3}' "$mod_dir/go.mod")
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

use_toolchain_for "$mod_dir/go.mod"
key=$( (cat "$mod_dir/go.mod" "$cp_dir/etcd/go.mod" "$cp_dir/helm/go.mod"
        echo "$build_flags"
        go env GOVERSION) | sha256sum | cut -c1-12)
out="$cache_root/controlplane/$k8s_version-etcd-$etcd_version-helm-$helm_version-$key"

# name, module directory, package, extra ldflags; in build order (the first build on a machine is longest).
targets=(
  "etcd|$cp_dir/etcd|go.etcd.io/etcd/server/v3|"
  "kube-apiserver|$mod_dir|k8s.io/kubernetes/cmd/kube-apiserver|$k8s_ldflags"
  "kube-controller-manager|$mod_dir|k8s.io/kubernetes/cmd/kube-controller-manager|$k8s_ldflags"
  "kube-scheduler|$mod_dir|k8s.io/kubernetes/cmd/kube-scheduler|$k8s_ldflags"
  "kubectl|$mod_dir|k8s.io/kubernetes/cmd/kubectl|$k8s_ldflags"
  "kubelet|$mod_dir|k8s.io/kubernetes/cmd/kubelet|$k8s_ldflags"
  "helm|$cp_dir/helm|helm.sh/helm/v4/cmd/helm|$helm_ldflags"
)
only=${ONLY:-}
for name in $only; do
  [[ " ${targets[*]%%|*} " == *" $name "* ]] || die "ONLY=$only: no binary $name (known: ${targets[*]%%|*})"
done
missing=()
for t in "${targets[@]}"; do
  [[ -z $only || " $only " == *" ${t%%|*} "* ]] || continue
  [[ -x "$out/${t%%|*}" ]] || missing+=("$t")
done
if (( ${#missing[@]} == 0 )); then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
start=$(date +%s)
log() { echo "[controlplane $k8s_version $(( $(date +%s) - start ))s] $*" >&2; }
export CGO_ENABLED=0
for t in "${missing[@]}"; do
  IFS='|' read -r name dir pkg extra <<<"$t"
  log "building $name ($pkg; a first build on this machine takes minutes)"
  # Into a temporary name first: an interrupted build never leaves a binary that looks complete.
  (cd "$dir" && go build -trimpath -ldflags "$ldflags $extra" -o "$out/.$name.tmp" "$pkg")
  mv -f "$out/.$name.tmp" "$out/$name"
done
log "done: $out"
echo "$out"
