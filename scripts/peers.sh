#!/bin/sh
# Installs the pinned peers of tools/peers/requirements.txt (Dynamo's
# replay and mocker, SGLang's router, aiperf) once into a virtual
# environment outside the repository, keyed by that file, and prints its
# Python interpreter's path.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/tools/peers/requirements.txt"
hash=$(sha256sum "$req" | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/peers-$hash"
py="$dir/venv/bin/python"
if [ ! -x "$py" ] || [ ! -f "$dir/ok" ]; then
	echo "installing the peers (ai-dynamo, sglang-router, aiperf) into $dir (once)" >&2
	rm -rf "$dir"
	${PYTHON:-python3} -m venv "$dir/venv" >&2
	"$dir/venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
	"$dir/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps ai-dynamo==1.6.1 >&2
	touch "$dir/ok"
fi
echo "$py"
