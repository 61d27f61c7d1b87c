#!/bin/sh
# Builds the standalone kustomize releases that the deploy tests render every
# overlay with, once each, into a cache outside the repository, and prints
# one "version path" line per binary. Each release is the one a kubectl minor
# bundles (kubectl's go.mod names it), so the tests see what users see:
#   v5.5.0  kubectl 1.32      v5.6.0  kubectl 1.33
#   v5.7.1  kubectl 1.34, 1.35
#   v5.8.1  kubectl 1.36, 1.37
#   v5.8.2  standalone kustomize (API v0.21.2, as deploy's tests; v5.8.3 needs Go 1.27)
# The oldest is the minimum kubectl the README states. A cold build of all
# five takes a few minutes on 2 cores; later runs only check the binaries.
set -eu
versions="${KVROUTE_KUSTOMIZE_VERSIONS:-v5.5.0 v5.6.0 v5.7.1 v5.8.1 v5.8.2}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute"
for v in $versions; do
	dir="$cache/kustomize-$v"
	bin="$dir/kustomize"
	if [ ! -x "$bin" ]; then
		mkdir -p "$dir"
		echo "building kustomize $v into $dir (once)" >&2
		GOBIN="$dir" GOFLAGS= ${GO:-go} install -trimpath -ldflags='-s -w' "sigs.k8s.io/kustomize/kustomize/v5@$v"
	fi
	echo "$v $bin"
done
