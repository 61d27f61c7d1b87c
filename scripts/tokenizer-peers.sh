#!/bin/sh
# Installs the pinned native tokenizers of peers/tokenizer/requirements.txt
# (Hugging Face tokenizers, tiktoken) once into a virtual environment
# outside the repository, keyed by that file, and prints its Python
# interpreter's path.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/peers/tokenizer/requirements.txt"
hash=$(sha256sum "$req" | cut -c1-12)
dir="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute/tokenizer-peers-$hash"
py="$dir/venv/bin/python"
if [ ! -x "$py" ] || [ ! -f "$dir/ok" ]; then
	echo "installing the native tokenizers (tokenizers, tiktoken) into $dir (once)" >&2
	rm -rf "$dir"
	${PYTHON:-python3} -m venv "$dir/venv" >&2
	"$dir/venv/bin/pip" install --quiet --disable-pip-version-check \
		--require-hashes --no-deps --only-binary=:all: -r "$req" >&2
	touch "$dir/ok"
fi
echo "$py"
