#!/bin/sh
# Builds llm-d's vLLM simulator (llm-d-inference-sim, cmd/llm-d-inference-sim)
# at the version tools/llm-d-sim pins, once, into a cache outside the
# repository (keyed by that module's go.mod and go.sum), and prints the
# binary's path. It is the third-party engine `make test-llmd` and the
# docs/engines.md's figures run kvroute against; `go install` of that version
# does not work (the module proxy lists no versions of it), building it from
# a wrapper module does. No -trimpath: the build shares Go's build cache.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/tools/llm-d-sim"
hash=$(cat "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/llm-d-sim-$hash"
bin="$dir/llm-d-inference-sim"
if [ ! -x "$bin" ]; then
	mkdir -p "$dir"
	echo "building llm-d-inference-sim into $dir (a few minutes the first time)" >&2
	(cd "$src" && GOFLAGS=-mod=mod ${GO:-go} build -ldflags='-s -w' -o "$bin.tmp" github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim)
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
