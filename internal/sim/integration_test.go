package sim

import (
	"context"
	"encoding/binary"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type fleetEnv struct {
	fleet  *Fleet
	nc     *nats.Conn
	etcd   *clientv3.Client
	events chan *nats.Msg
	loads  chan *nats.Msg
}

func startFleetEnv(t *testing.T, workers int) *fleetEnv {
	t.Helper()
	ns := testenv.StartNATS(t)
	et := testenv.StartEtcd(t)
	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	env := &fleetEnv{nc: nc, events: make(chan *nats.Msg, 1024), loads: make(chan *nats.Msg, 1024)}
	if _, err := nc.ChanSubscribe(bus.EventsWildcard("it"), env.events); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.ChanSubscribe(bus.LoadSubjectWildcard("it"), env.loads); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	env.etcd, err = clientv3.New(clientv3.Config{Endpoints: et.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.etcd.Close() })
	env.fleet, err = StartFleet(context.Background(), FleetConfig{
		Workers:       workers,
		NATSURL:       ns.URL,
		EtcdEndpoints: et.Endpoints,
		AdminAddr:     "127.0.0.1:0",
		Worker: WorkerConfig{
			Model: "it-model", Namespace: "it", Engine: EngineConfig{NumGPUBlocks: 64, BlockSize: 16},
			Speedup: 1000, LeaseTTL: time.Second, Logger: quietLogger(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		env.fleet.Close(ctx)
	})
	return env
}

// nextBatch returns the next events message for worker, decoded.
func (e *fleetEnv) nextBatch(t *testing.T, worker string) (*nats.Msg, vllmwire.EventBatch) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case m := <-e.events:
			if m.Subject != bus.EventsSubject("it", worker) {
				continue
			}
			b, err := vllmwire.DecodeBatch(m.Data)
			if err != nil {
				t.Fatalf("decode batch: %v", err)
			}
			return m, b
		case <-timeout:
			t.Fatalf("no event batch from %s", worker)
		}
	}
}

func seqOf(t *testing.T, m *nats.Msg) uint64 {
	t.Helper()
	s, err := strconv.ParseUint(m.Header.Get(bus.SeqHeader), 10, 64)
	if err != nil {
		t.Fatalf("seq header %q: %v", m.Header.Get(bus.SeqHeader), err)
	}
	return s
}

func (e *fleetEnv) admin(t *testing.T, path string) {
	t.Helper()
	resp, err := http.Post("http://"+e.fleet.AdminAddr()+path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("admin %s: status %d", path, resp.StatusCode)
	}
}

// mp is a minimal msgpack writer for hand-building vLLM frames.
type mp []byte

func (b mp) arr(n int) mp { return append(b, 0x90|byte(n)) }
func (b mp) nil_() mp     { return append(b, 0xc0) }
func (b mp) str(s string) mp {
	return append(append(b, 0xa0|byte(len(s))), s...)
}
func (b mp) arr16(n int) mp { return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n)) }
func (b mp) f64(f float64) mp {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}
func (b mp) fixmap(n int) mp { return append(b, 0x80|byte(n)) }

func (b mp) int(v int64) mp {
	switch {
	case v >= 0 && v < 128:
		return append(b, byte(v))
	case v >= 0 && v < 256:
		return append(b, 0xcc, byte(v))
	case v >= 0 && v < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v >= 0 && v < 1<<32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	case v >= 0:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), uint64(v))
	case v >= -32:
		return append(b, byte(int8(v)))
	case v >= math.MinInt8:
		return append(b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(int32(v)))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func TestEventsOnNATSAreVLLMBatchesByteForByte(t *testing.T) {
	env := startFleetEnv(t, 1)
	w := env.fleet.Worker("w0")
	// 40 tokens, 1 output: two full blocks are stored.
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(1000, 40)+`,"max_tokens":1}`)
	m, batch := env.nextBatch(t, "w0")
	if seqOf(t, m) != 0 {
		t.Fatalf("first batch seq %d, want 0", seqOf(t, m))
	}
	toks := seq(1000, 32)
	h0 := blockHash(0, toks[:16])
	h1 := blockHash(h0, toks[16:])
	// Hand-built vLLM 0.32 frame: [ts, [event], dp_rank], the event a
	// tagged map in BlockStored's field order, unset optional fields left
	// out, one None per block in extra_keys.
	want := mp{}.arr(3).f64(batch.TS).arr(1).
		fixmap(11).str("type").str("BlockStored").str("block_hashes").arr(2).int(h0).int(h1).
		str("parent_block_hash").nil_().str("token_ids").arr16(32)
	for _, tok := range toks {
		want = want.int(int64(tok))
	}
	want = want.str("block_size").int(16).str("lora_id").nil_().str("medium").str("GPU").str("lora_name").nil_().
		str("extra_keys").arr(2).nil_().nil_().str("group_idx").int(0).str("kv_cache_spec_kind").str("full_attention").int(0)
	if string(m.Data) != string(want) {
		t.Fatalf("frame\n got %x\nwant %x", m.Data, []byte(want))
	}
	// The engine's hashes are not the router's.
	router := kvindex.HashBlocks(kvindex.Seed("it-model", "", ""), toUint32(toks), 16, nil)
	if uint64(h0) == router[0] {
		t.Fatal("engine hash equals router hash")
	}
}

func toUint32(s []int32) []uint32 {
	out := make([]uint32, len(s))
	for i, v := range s {
		out[i] = uint32(v)
	}
	return out
}

func TestFaultSwitchesDropDuplicateAndReset(t *testing.T) {
	env := startFleetEnv(t, 2)
	w := env.fleet.Worker("w1")
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(0, 20)+`,"max_tokens":1}`)
	m, _ := env.nextBatch(t, "w1")
	first := seqOf(t, m)

	env.admin(t, "/admin/workers/w1/drop-events")
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(100, 20)+`,"max_tokens":1}`)
	waitUntil(t, "the batch to be dropped", func() bool { return w.Stats().DroppedBatches == 1 })
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(200, 20)+`,"max_tokens":1}`)
	m, _ = env.nextBatch(t, "w1")
	if got := seqOf(t, m); got != first+2 {
		t.Fatalf("after a dropped batch seq %d, want %d (a gap)", got, first+2)
	}

	env.admin(t, "/admin/workers/w1/duplicate-events")
	post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(300, 20)+`,"max_tokens":1}`)
	a, _ := env.nextBatch(t, "w1")
	b, _ := env.nextBatch(t, "w1")
	if seqOf(t, a) != first+3 || seqOf(t, b) != seqOf(t, a) || string(a.Data) != string(b.Data) {
		t.Fatalf("duplicate: seqs %d,%d equal data %v", seqOf(t, a), seqOf(t, b), string(a.Data) == string(b.Data))
	}

	env.admin(t, "/admin/workers/w1/reset")
	_, batch := env.nextBatch(t, "w1")
	if len(batch.Events) != 1 || batch.Events[0].Tag() != "AllBlocksCleared" {
		t.Fatalf("after reset: %+v", batch.Events)
	}
	_, body := post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(0, 20)+`,"max_tokens":1}`)
	if !strings.Contains(string(body), `"cached_tokens":0`) {
		t.Fatalf("cache survived the reset: %s", body)
	}
}

func TestLoadReportsAndEtcdLifecycle(t *testing.T) {
	env := startFleetEnv(t, 2)
	seen := map[string]fleet.LoadReport{}
	timeout := time.After(5 * time.Second)
	for len(seen) < 2 {
		select {
		case m := <-env.loads:
			rep, err := bus.ParseLoadReport(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			seen[m.Subject] = rep
		case <-timeout:
			t.Fatalf("load reports from %d workers, want 2", len(seen))
		}
	}
	if rep := seen[bus.LoadSubject("it", "w0")]; rep.KVTotalBlocks != 64 || rep.TSMillis == 0 {
		t.Fatalf("report %+v", rep)
	}

	get := func(id string) (fleet.Worker, bool) {
		resp, err := env.etcd.Get(context.Background(), bus.WorkerKey("it", id))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return fleet.Worker{}, false
		}
		rec, err := discovery.ParseRecord(resp.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		return rec, true
	}
	for _, want := range env.fleet.Records() {
		got, ok := get(want.ID)
		if !ok || !slices.Equal(mustJSON(got), mustJSON(want)) {
			t.Fatalf("etcd record %+v, want %+v", got, want)
		}
		if want.BlockSize != 16 || want.KVTotalBlocks != 64 || want.MaxNumSeqs != DefaultMaxNumSeqs {
			t.Fatalf("record %+v does not describe the engine", want)
		}
	}

	// Kill w1: HTTP goes away at once, the record when the 1 s lease lapses.
	w1 := env.fleet.Worker("w1")
	url := w1.URL()
	env.admin(t, "/admin/workers/w1/kill")
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url + "/health")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("killed worker still serves HTTP")
		}
		time.Sleep(20 * time.Millisecond)
	}
	deadline = time.Now().Add(30 * time.Second)
	for _, ok := get("w1"); ok; _, ok = get("w1") {
		if time.Now().After(deadline) {
			t.Fatal("killed worker's record outlived its lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := get("w0"); !ok {
		t.Fatal("w0's record vanished")
	}

	// A clean shutdown deletes w0's record at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := env.fleet.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := get("w0"); ok {
		t.Fatal("record present after Close")
	}
}

func TestZMQPublishingAndReplay(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{ZMQEndpoint: "tcp://127.0.0.1:0", ZMQReplayEndpoint: "tcp://127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := vllmzmq.Dial(ctx, vllmzmq.SubscriberConfig{
		Endpoint: w.ZMQEndpoint(), ReplayEndpoint: w.ZMQReplayEndpoint(), Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// A SUB socket misses what is published before it connects; send
	// requests until one batch arrives, then check replay from 0.
	got := make(chan vllmzmq.Event, 1)
	go func() {
		ev, err := sub.Recv(ctx)
		if err == nil {
			got <- ev
		}
	}()
	var live vllmzmq.Event
	for i := 0; ; i++ {
		post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(i*100, 20)+`,"max_tokens":1}`)
		select {
		case live = <-got:
		case <-time.After(100 * time.Millisecond):
			continue
		case <-ctx.Done():
			t.Fatal("no ZMQ batch received")
		}
		break
	}
	if _, err := vllmwire.DecodeBatch(live.Payload); err != nil {
		t.Fatalf("ZMQ payload: %v", err)
	}
	replayed, err := sub.Replay(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(replayed) == 0 || replayed[0].Seq != 0 {
		t.Fatalf("replay from 0 returned %d batches", len(replayed))
	}
	for i, r := range replayed {
		if r.Seq != uint64(i) {
			t.Fatalf("replayed seq %d at %d", r.Seq, i)
		}
		if r.Seq == live.Seq && string(r.Payload) != string(live.Payload) {
			t.Fatal("replayed payload differs from the live one")
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func natsConn(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
