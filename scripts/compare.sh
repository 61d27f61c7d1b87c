#!/bin/sh
# make compare: kvroute beside its peers, each pinned and run as its users
# run it, and one Markdown report of it all (reports/compare/REPORT.md).
# Not part of make test: it installs the peers (scripts/peers.sh,
# scripts/gie-epp.sh) and takes about 15 minutes on 2 cores.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mkdir -p "${COMPARE_OUT:-reports/compare}" && cd "${COMPARE_OUT:-reports/compare}" && pwd)
GO=${GO:-go}
envoy=$(./scripts/envoy.sh)
kas=$(./scripts/kube-apiserver.sh)
py=$(./scripts/peers.sh)
gie=$(./scripts/gie-epp.sh)
epp=$(echo "$gie" | sed -n 1p)
crds=$(echo "$gie" | sed -n 2p)
$GO build -o bin/ ./cmd/...
export KVROUTE_ENVOY="$envoy" KVROUTE_KUBE_APISERVER="$kas" KVROUTE_PEERS_PY="$py" KVROUTE_GIE_EPP="$epp" KVROUTE_GIE_CRDS="$crds"
failed=""
part() { # name, command...
	name=$1
	shift
	echo "== $name" >&2
	if ! "$@" >"$out/$name.log" 2>&1; then
		failed="$failed $name"
		echo "== $name failed; the last lines of $out/$name.log:" >&2
		tail -n 20 "$out/$name.log" >&2
	fi
}
part dynamo "$py" peers/compare/dynamo.py --out "$out" --kvbench "$root/bin/kvbench"
part sglang-aiperf $GO test -tags compare -run 'TestSGLang|TestAIPerf' -v -count=1 -timeout 20m ./peers/compare -args -out "$out"
part gie $GO test -tags 'compare kubeapiserver' -run TestGIE -v -count=1 -timeout 30m ./peers/compare -args -out "$out"
{
	echo "# kvroute against its peers"
	echo
	echo "Run on $(date -u +%Y-%m-%d) by \`make compare\` at revision $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(nproc) cores."
	echo "Versions: $("$envoy" --version 2>/dev/null | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/Envoy \1/p'),"
	echo "$("$py" -m pip list --disable-pip-version-check 2>/dev/null | awk '$1 ~ /^(ai-dynamo|ai-dynamo-runtime|sglang-router|aiperf)$/ {printf "%s %s, ", $1, $2}')"
	echo "gateway-api-inference-extension $(cd tools/gie-epp && $GO list -m -f '{{.Version}}' sigs.k8s.io/gateway-api-inference-extension)."
	echo "Each section says how it ran; routing figures are ratios within one run or deterministic simulations."
	echo
	for f in dynamo sglang aiperf gie; do
		if [ -f "$out/$f.md" ]; then
			cat "$out/$f.md"
			echo
		fi
	done
	if [ -n "$failed" ]; then
		echo "Parts that failed:$failed (their logs are beside this report)."
	fi
} >"$out/REPORT.md"
echo "wrote $out/REPORT.md" >&2
[ -z "$failed" ]
