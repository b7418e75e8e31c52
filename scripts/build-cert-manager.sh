#!/usr/bin/env bash
# Builds cert-manager's commands from Go modules into a cache keyed by version and Go version, outside the
# work tree, and writes its CRDs there as plain YAML (cert-manager.crds.yaml, ready for kubectl apply).
# Prints the cache directory on stdout; progress goes to stderr. Builds only what is missing.
#
#   scripts/build-cert-manager.sh
#
# The version is the one controlplane/cert-manager/go.mod requires (to move it: edit the require line and
# run `go mod tidy` there). cert-manager's own command modules (cmd/controller, cmd/cainjector, cmd/webhook
# of its repository) are not served by the Go module proxy, so each command is a main package of
# controlplane/cert-manager/ (one directory per command) over the packages of the module the proxy serves.
# Every such directory is built (controller, cainjector, webhook: ours, doing what upstream's cmd/*/app do,
# which live only in those unserved modules). The Venafi client module those packages link is not served
# either: go.mod replaces it with controlplane/cert-manager/vcert, a stand-in whose connections all fail.
# The CRDs come out of the module's Helm chart (deploy/charts/cert-manager), whose crd-*.yaml templates use
# four template actions only, rendered here with sed.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
mod_dir="$here/controlplane/cert-manager"
cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
export GOFLAGS=-mod=mod CGO_ENABLED=0

die() { echo "build-cert-manager: $*" >&2; exit 2; }

m=github.com/cert-manager/cert-manager
version=$(awk -v m=$m '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$mod_dir/go.mod")
[[ -n $version ]] || die "controlplane/cert-manager/go.mod requires no github.com/cert-manager/cert-manager"
go_version=$(go env GOVERSION)
out="$cache_root/cert-manager/$version-$go_version"
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
if (( ${#missing[@]} == 0 )) && [[ -s $out/cert-manager.crds.yaml ]]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
start=$(date +%s)
log() { echo "[cert-manager $version $(( $(date +%s) - start ))s] $*" >&2; }

if [[ ! -s $out/cert-manager.crds.yaml ]]; then
  module_dir=$(cd "$mod_dir" && go mod download -json "github.com/cert-manager/cert-manager@$version" \
               | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  templates="$module_dir/deploy/charts/cert-manager/templates"
  [[ -d $templates ]] || die "the module github.com/cert-manager/cert-manager@$version holds no deploy/charts"
  log "writing cert-manager.crds.yaml from the chart's CRD templates"
  # Each template is "{{- if or .Values.crds.enabled .Values.installCRDs }} <CRD> {{- end }}", with an
  # annotation for Helm alone under "{{- if .Values.crds.keep }}" (dropped) and the labels of the release's
  # own cert-manager.crds.yaml as "{{- include "cert-manager.crd-labels" . | nindent 4 }}".
  labels="    app: \"cert-manager\"\n    app.kubernetes.io/name: \"cert-manager\""
  labels+="\n    app.kubernetes.io/instance: \"cert-manager\"\n    app.kubernetes.io/component: \"crds\""
  labels+="\n    app.kubernetes.io/version: \"$version\""
  for f in "$templates"/crd-*.yaml; do
    echo "---"
    echo "# Source: cert-manager/templates/$(basename "$f")"
    sed -e '/^{{- if or .Values.crds.enabled .Values.installCRDs }}$/d' \
        -e '/^ *{{- if .Values.crds.keep }}$/,/^ *{{- end }}$/d' \
        -e "s|^ *{{- include \"cert-manager.crd-labels\" . \| nindent 4 }}\$|$labels|" \
        -e '/^{{- end }}$/d' "$f"
  done >"$out/.crds.tmp"
  if grep -n '{{' "$out/.crds.tmp" >&2; then
    die "the CRD templates of $version use template actions this script does not render (above)"
  fi
  mv "$out/.crds.tmp" "$out/cert-manager.crds.yaml"
fi

for name in "${missing[@]}"; do
  log "building $name (a first build on this machine takes minutes)"
  # Into a temporary name first: an interrupted build never leaves a binary that looks complete.
  (cd "$mod_dir" && go build -trimpath -ldflags "$ldflags" -o "$out/.$name.tmp" "./$name")
  mv -f "$out/.$name.tmp" "$out/$name"
done
log "done: $out"
echo "$out"
