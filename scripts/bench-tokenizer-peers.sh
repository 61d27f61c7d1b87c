#!/bin/sh
# make bench-tokenizer-peers: kvroute's tokenizer beside Hugging Face's
# tokenizers and tiktoken on one corpus, per CPU-second, in interleaved
# rounds (reports/tokenizer-peers/REPORT.md). Installs the pinned peers
# once (scripts/tokenizer-peers.sh). ROUNDS (default 5) and MIN_CPU (CPU
# seconds per case and round, default 0.3) tune the run.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$(mkdir -p "${TOKENIZER_PEERS_OUT:-reports/tokenizer-peers}" && cd "${TOKENIZER_PEERS_OUT:-reports/tokenizer-peers}" && pwd)
GO=${GO:-go}
py=$(./scripts/tokenizer-peers.sh)
$GO build -o "$out/tokenizer-bench" ./peers/tokenizer
"$out/tokenizer-bench" -mode prepare -dir "$out"
"$out/tokenizer-bench" -mode ids -dir "$out"
"$py" peers/tokenizer/peers.py compare --dir "$out" --go "$out/tokenizer-bench" \
	--rounds "${ROUNDS:-5}" --min-cpu "${MIN_CPU:-0.3}" >/dev/null
echo "wrote $out/REPORT.md" >&2
