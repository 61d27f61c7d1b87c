#!/bin/sh
# Builds the real kube-apiserver from tools/kube-apiserver (a nested module
# pinned to the k8s.io/kubernetes release) once into a cache outside the
# repository, keyed by the module's go.sum, and prints the binary's path.
# A cold build takes 10 to 16 minutes on 2 cores; later runs reuse the binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/tools/kube-apiserver"
hash=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/kube-apiserver-$hash"
bin="$dir/kube-apiserver"
if [ ! -x "$bin" ]; then
	mkdir -p "$dir"
	echo "building kube-apiserver into $dir (10 to 16 minutes the first time)" >&2
	(cd "$src" && ${GO:-go} build -trimpath -ldflags='-s -w' -o "$bin.tmp" .)
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
