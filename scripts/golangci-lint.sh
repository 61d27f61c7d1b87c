#!/bin/sh
# Builds the pinned golangci-lint once into a cache outside the repository and
# prints its path. The version is pinned so that every machine reports the same
# findings; .golangci.yml says which linters run and why.
set -eu
version="${KVROUTE_GOLANGCI_LINT_VERSION:-v2.15.0}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute"
dir="$cache/golangci-lint-$version"
bin="$dir/golangci-lint"
if [ ! -x "$bin" ]; then
	mkdir -p "$dir"
	echo "building golangci-lint $version into $dir (once)" >&2
	GOBIN="$dir" GOFLAGS= ${GO:-go} install -trimpath -ldflags='-s -w' "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
fi
echo "$bin"
