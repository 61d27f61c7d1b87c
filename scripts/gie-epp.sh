#!/bin/sh
# Builds the Gateway API Inference Extension's endpoint picker (cmd/epp) at
# the version tools/gie-epp pins, once, into a cache outside the repository
# (keyed by that module's go.sum), and prints two lines: the binary's path
# and the directory of the module's CRDs (config/crd/bases). It is the peer
# `make compare` runs beside kvroute; `make test` does not need it.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/tools/gie-epp"
hash=$(cat "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/gie-epp-$hash"
bin="$dir/epp"
if [ ! -x "$bin" ]; then
	mkdir -p "$dir"
	echo "building the Gateway API Inference Extension's EPP into $dir (a few minutes the first time)" >&2
	(cd "$src" && ${GO:-go} build -ldflags='-s -w' -o "$bin.tmp" sigs.k8s.io/gateway-api-inference-extension/cmd/epp)
	mv "$bin.tmp" "$bin"
fi
mod=$(cd "$src" && ${GO:-go} list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api-inference-extension)
echo "$bin"
echo "$mod/config/crd/bases"
