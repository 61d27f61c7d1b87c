package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	testenv.Quiet()
	os.Exit(m.Run())
}

func quiet() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// fakeEngine is an HTTP server answering like vLLM or SGLang: /health,
// /v1/models, /metrics (real exposition text from testdata) and SGLang's
// /get_server_info.
type fakeEngine struct {
	*httptest.Server
	metrics  atomic.Value // []byte
	models   []byte
	failing  atomic.Bool // every endpoint answers 503
	pageSize int
}

func newFakeEngine(t testing.TB, metricsFile string) *fakeEngine {
	t.Helper()
	e := &fakeEngine{models: readTestdata(t, "vllm_models.json"), pageSize: 16}
	e.metrics.Store(readTestdata(t, metricsFile))
	mux := http.NewServeMux()
	guard := func(h func(w http.ResponseWriter)) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if e.failing.Load() {
				http.Error(w, "engine down", http.StatusServiceUnavailable)
				return
			}
			h(w)
		}
	}
	mux.Handle("GET /health", guard(func(w http.ResponseWriter) {}))
	mux.Handle("GET /v1/models", guard(func(w http.ResponseWriter) { _, _ = w.Write(e.models) }))
	mux.Handle("GET /metrics", guard(func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(e.metrics.Load().([]byte))
	}))
	mux.Handle("GET /get_server_info", guard(func(w http.ResponseWriter) {
		fmt.Fprintf(w, `{"model_path":"meta-llama/Llama-3.1-8B-Instruct","page_size":%d,"max_total_num_tokens":163840}`, e.pageSize)
	}))
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

// freePorts returns n consecutive free loopback ports, as a data-parallel
// engine binds base+rank.
func freePorts(t testing.TB, n int) int {
	t.Helper()
	for attempt := 0; attempt < 50; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for i := 1; i < n; i++ {
			li, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, li)
		}
		for _, li := range ls {
			li.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// infra is one NATS server and one etcd shared by a test's subtests; each
// subtest works in its own namespace.
type infra struct {
	nats *testenv.NATS
	etcd *testenv.Etcd
	nc   *nats.Conn
	cli  *clientv3.Client
}

func startInfra(t *testing.T) *infra {
	t.Helper()
	in := &infra{nats: testenv.StartNATS(t), etcd: testenv.StartEtcd(t)}
	var err error
	if in.nc, err = nats.Connect(in.nats.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.nc.Close)
	in.cli = in.etcdClient(t)
	return in
}

func (in *infra) etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: in.etcd.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// engineSide is the engine's ZMQ half: one vllmzmq.Publisher per rank on
// fixed ports, so that a "restarted engine" can bind the same ones again.
type engineSide struct {
	eventsPort, replayPort int
	bufferSteps            int
	pubs                   []*vllmzmq.Publisher
}

func newEngineSide(t testing.TB, ranks, bufferSteps int) *engineSide {
	t.Helper()
	// The ports are free when chosen but not held: the two ranges may
	// meet, or another test may bind one first, so a bind that fails is
	// tried again on fresh ports.
	err := errors.New("the events and replay port ranges overlapped every time")
	for attempt := 0; attempt < 5; attempt++ {
		es := &engineSide{eventsPort: freePorts(t, ranks), replayPort: freePorts(t, ranks), bufferSteps: bufferSteps}
		if es.replayPort < es.eventsPort+ranks && es.eventsPort < es.replayPort+ranks {
			continue
		}
		if err = es.bind(ranks); err == nil {
			t.Cleanup(es.stop)
			return es
		}
		es.stop()
	}
	t.Fatalf("engine publishers: %v", err)
	return nil
}

func (es *engineSide) endpoints() (events, replay string) {
	return fmt.Sprintf("tcp://127.0.0.1:%d", es.eventsPort), fmt.Sprintf("tcp://127.0.0.1:%d", es.replayPort)
}

// start binds the engine's publishers again on the same ports, as a
// restarted engine does.
func (es *engineSide) start(t testing.TB, ranks int) {
	t.Helper()
	if err := es.bind(ranks); err != nil {
		t.Fatal(err)
	}
}

func (es *engineSide) bind(ranks int) error {
	ev, rep := es.endpoints()
	es.pubs = nil
	for r := 0; r < ranks; r++ {
		p, err := vllmzmq.NewPublisher(context.Background(), vllmzmq.PublisherConfig{
			Endpoint: ev, ReplayEndpoint: rep, Topic: "kv-events", DPRank: r, Mode: vllmzmq.Bind,
			BufferSteps: es.bufferSteps, Logger: quiet(),
		})
		if err != nil {
			return fmt.Errorf("engine publisher rank %d: %w", r, err)
		}
		es.pubs = append(es.pubs, p)
	}
	return nil
}

func (es *engineSide) stop() {
	for _, p := range es.pubs {
		_ = p.Close()
	}
}

// storedBatch encodes a BlockStored batch for nBlocks full blocks of tokens
// starting at token value first, the way vLLM lays it out.
func storedBatch(t testing.TB, rank int, tokens []uint32, blockSize int, parent *vllmwire.EngineHash, hashBase int64) []byte {
	t.Helper()
	n := len(tokens) / blockSize
	hashes := make([]vllmwire.EngineHash, n)
	for i := range hashes {
		hashes[i] = vllmwire.HashInt(hashBase + int64(i))
	}
	medium := vllmwire.MediumGPU
	r := rank
	b, err := vllmwire.EncodeBatch(vllmwire.EventBatch{
		TS: float64(time.Now().UnixNano()) / 1e9,
		Events: []vllmwire.Event{vllmwire.BlockStored{
			BlockHashes: hashes, ParentBlockHash: parent, TokenIDs: tokens, BlockSize: blockSize, Medium: &medium,
		}},
		DPRank: &r,
		Format: vllmwire.FormatArray,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// natsTap records every message on a namespace's event subjects.
type natsTap struct {
	mu   sync.Mutex
	msgs []*nats.Msg
	sig  chan struct{}
}

func tapEvents(t *testing.T, nc *nats.Conn, ns string) *natsTap {
	t.Helper()
	tap := &natsTap{sig: make(chan struct{}, 1)}
	sub, err := nc.Subscribe(bus.EventsWildcard(ns), func(m *nats.Msg) {
		tap.mu.Lock()
		tap.msgs = append(tap.msgs, m)
		tap.mu.Unlock()
		select {
		case tap.sig <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return tap
}

func (tap *natsTap) snapshot() []*nats.Msg {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return append([]*nats.Msg(nil), tap.msgs...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// indexOf returns the position of the message carrying payload, or -1.
func indexOf(msgs []*nats.Msg, payload []byte) int {
	for i, m := range msgs {
		if bytes.Equal(m.Data, payload) {
			return i
		}
	}
	return -1
}

// isClear reports whether a message is a (synthetic) AllBlocksCleared batch.
func isClear(m *nats.Msg) bool {
	b, err := vllmwire.DecodeBatch(m.Data)
	if err != nil || len(b.Events) != 1 {
		return false
	}
	_, ok := b.Events[0].(vllmwire.AllBlocksCleared)
	return ok
}

// runBridge starts a bridge and stops it when the test ends; the returned
// stop cancels it and waits for Run to return.
func runBridge(t *testing.T, cfg Config) (*Bridge, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("bridge Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("bridge did not stop within 15s")
			}
		})
	}
	t.Cleanup(stop)
	return b, stop
}

// connect publishes small batches on pub until the bridge has forwarded
// one, so the SUB's subscription has reached the engine; it returns the
// payloads published so far.
func connect(t *testing.T, pub *vllmzmq.Publisher, tap *natsTap, rank int) [][]byte {
	t.Helper()
	var sent [][]byte
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		p := storedBatch(t, rank, seqTokens(1000+i*16, 16), 16, nil, int64(1_000_000+i))
		if _, err := pub.Publish(p); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, p)
		wait := time.After(100 * time.Millisecond)
	poll:
		for {
			if indexOf(tap.snapshot(), p) >= 0 {
				return sent
			}
			select {
			case <-tap.sig:
			case <-wait:
				break poll
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("bridge never forwarded a batch")
		}
	}
}

func seqTokens(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i)
	}
	return out
}

// readTestdata reads the engine package's recorded engine answers.
func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../engine/testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// consumeEvents applies the namespace's KV events on NATS to ix as a
// router does: the event core behind a core NATS subscription.
func consumeEvents(ctx context.Context, t *testing.T, nc *nats.Conn, ns string, ix *kvindex.Index) *kvevents.Core {
	t.Helper()
	core := kvevents.New(kvevents.Config{Index: ix, Logger: quiet()})
	if err := core.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := bus.SubscribeEvents(ctx, nc, ns, core); err != nil {
		t.Fatal(err)
	}
	return core
}
