#!/usr/bin/env bash
# Builds the release's Go tools from their modules into a cache keyed by version and Go version, outside
# the work tree, so a second run (and CI on the same machine) takes no time: cosign (signatures and
# attestations, by key, offline), syft (the image's SBOM) and actionlint (the release workflow's linter).
# Prints the directory holding the binaries on stdout; progress goes to stderr. With tool names as arguments
# (`build-release-tools.sh actionlint`) it builds only those, so `make lint` does not wait on cosign and syft.
set -euo pipefail

cache_root=${HAMI_MT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hami-mt-webhook}
# module path of the command, and its version: one line per tool, the one place these versions live
tools=(
  "cosign|github.com/sigstore/cosign/v2/cmd/cosign|v2.6.5"
  "syft|github.com/anchore/syft/cmd/syft|v1.57.2"
  "actionlint|github.com/rhysd/actionlint/cmd/actionlint|v1.7.12"
)
go_version=$(go env GOVERSION)
out="$cache_root/release-tools/$go_version"
mkdir -p "$out"
for wanted in "$@"; do
  [[ " ${tools[*]%%|*} " == *" $wanted "* ]] \
    || { echo "build-release-tools: no tool $wanted (known: ${tools[*]%%|*})" >&2; exit 2; }
done
for tool in "${tools[@]}"; do
  IFS='|' read -r name pkg version <<<"$tool"
  [[ $# -eq 0 || " $* " == *" $name "* ]] || continue
  bin="$out/$name-$version"
  if [[ ! -x $bin ]]; then
    echo "build-release-tools: building $name $version with $go_version (once; cached in $out)" >&2
    started=$SECONDS
    tmp=$(mktemp -d)
    GOBIN=$tmp CGO_ENABLED=0 GOFLAGS=-trimpath go install -ldflags="-s -w" "$pkg@$version" >&2 \
      || { rm -rf "$tmp"; echo "build-release-tools: go install $pkg@$version failed" >&2; exit 1; }
    mv "$tmp/$name" "$bin"
    rm -rf "$tmp"
    echo "build-release-tools: $name built in $((SECONDS - started)) s" >&2
  fi
  ln -sfn "$name-$version" "$out/$name"
done
echo "$out"
