package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

const testModel = "Qwen/Qwen3-8B" // what testdata/vllm_models.json serves

func bridgeConfig(in *infra, ns string, eng *fakeEngine, es *engineSide) Config {
	ev, rep := es.endpoints()
	return Config{
		Namespace: ns, WorkerID: "w0", Engine: EngineVLLM, EngineURL: eng.URL,
		EventsEndpoint: ev, ReplayEndpoint: rep, Topic: "kv-events",
		Address: "10.0.0.5:8000", NATS: in.nc, Etcd: in.cli,
		ScrapeInterval: 50 * time.Millisecond, UnhealthyAfter: 400 * time.Millisecond,
		LeaseTTL: 2 * time.Second, ReplayTimeout: 2 * time.Second, SettleDelay: 20 * time.Millisecond,
	}
}

// seqs returns the Kvroute-Seq headers of msgs.
func seqs(t *testing.T, msgs []*nats.Msg) []uint64 {
	t.Helper()
	var out []uint64
	for _, m := range msgs {
		s, err := strconv.ParseUint(m.Header.Get(kvindex.SeqHeader), 10, 64)
		if err != nil {
			t.Fatalf("message on %s has no valid %s header: %v", m.Subject, kvindex.SeqHeader, err)
		}
		out = append(out, s)
	}
	return out
}

func assertGapFree(t *testing.T, msgs []*nats.Msg) {
	t.Helper()
	for i, s := range seqs(t, msgs) {
		if s != uint64(i) {
			t.Fatalf("message %d carries %s %d; the bridge's stream must be gap-free from 0", i, kvindex.SeqHeader, s)
		}
	}
}

func TestBridge(t *testing.T) {
	in := startInfra(t)

	t.Run("events reach NATS unchanged, led by AllBlocksCleared, and fill a kvindex.Index", func(t *testing.T) {
		ns := "events"
		ix := kvindex.New(kvindex.Config{})
		ix.AddWorker("w0", testModel, 16)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cons := kvindex.NewConsumer(in.nc, kvindex.ConsumerConfig{Namespace: ns, Index: ix, Logger: quiet()})
		if err := cons.Start(ctx); err != nil {
			t.Fatal(err)
		}
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))

		sent := connect(t, es.pubs[0], tap, 0)
		// A two-block prompt, stored as a chain of two batches.
		prompt := seqTokens(1, 32)
		parent := kvindex.HashInt(501)
		chain := [][]byte{
			storedBatch(t, 0, prompt[:16], 16, nil, 501),
			storedBatch(t, 0, prompt[16:], 16, &parent, 502),
		}
		for _, p := range chain {
			if _, err := es.pubs[0].Publish(p); err != nil {
				t.Fatal(err)
			}
		}
		sent = append(sent, chain...)
		waitFor(t, "every batch on NATS", 10*time.Second, func() bool { return indexOf(tap.snapshot(), chain[1]) >= 0 })

		msgs := tap.snapshot()
		if !isClear(msgs[0]) {
			t.Fatal("the first message of a fresh bridge is not AllBlocksCleared")
		}
		for i, m := range msgs {
			if m.Subject != "kvroute.events.events.w0" {
				t.Errorf("message %d on subject %q", i, m.Subject)
			}
		}
		// Everything the engine published arrives once, in order, byte for
		// byte: batches published before the SUB joined come via replay.
		if len(msgs) != len(sent)+1 {
			t.Fatalf("got %d messages, want %d (clear + %d batches)", len(msgs), len(sent)+1, len(sent))
		}
		for i, p := range sent {
			if indexOf(msgs, p) != i+1 {
				t.Fatalf("batch %d is at position %d, want %d", i, indexOf(msgs, p), i+1)
			}
		}
		assertGapFree(t, msgs)

		hashes := kvindex.HashBlocks(kvindex.Seed(testModel, "", ""), prompt, 16, nil)
		waitFor(t, "the index to hold the prompt", 5*time.Second, func() bool {
			return ix.Match(hashes, []string{"w0"}, nil)[0].Blocks == 2
		})
		if r := ix.Match(hashes, []string{"w0"}, nil)[0]; r.Stale {
			t.Errorf("worker marked stale after a clean stream: %+v", r)
		}
	})

	t.Run("a gap is healed by replay, in order, without clearing", func(t *testing.T) {
		ns := "gap"
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		b, _ := runBridge(t, bridgeConfig(in, ns, eng, es))
		connect(t, es.pubs[0], tap, 0)
		before := len(tap.snapshot())

		lost1 := storedBatch(t, 0, seqTokens(1, 16), 16, nil, 1)
		lost2 := storedBatch(t, 0, seqTokens(17, 16), 16, nil, 2)
		live := storedBatch(t, 0, seqTokens(33, 16), 16, nil, 3)
		for _, p := range [][]byte{lost1, lost2} {
			if _, err := es.pubs[0].PublishDropped(p); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := es.pubs[0].Publish(live); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the live batch after the gap", 10*time.Second, func() bool { return indexOf(tap.snapshot(), live) >= 0 })
		msgs := tap.snapshot()[before:]
		if len(msgs) != 3 || indexOf(msgs, lost1) != 0 || indexOf(msgs, lost2) != 1 || indexOf(msgs, live) != 2 {
			t.Fatalf("after the gap got %d messages (lost1 at %d, lost2 at %d, live at %d), want exactly lost1, lost2, live",
				len(msgs), indexOf(msgs, lost1), indexOf(msgs, lost2), indexOf(msgs, live))
		}
		assertGapFree(t, tap.snapshot())
		if s := b.Stats().Snapshot(); s.Heals != 1 || s.HealFailures != 0 {
			t.Errorf("stats: %+v, want one heal and no failure", s)
		}
	})

	t.Run("a gap replay cannot fill clears the worker first", func(t *testing.T) {
		ns := "nogap"
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 2) // the engine keeps only 2 batches for replay
		b, _ := runBridge(t, bridgeConfig(in, ns, eng, es))
		connect(t, es.pubs[0], tap, 0)
		before := len(tap.snapshot())

		var lost [][]byte
		for i := 0; i < 3; i++ {
			p := storedBatch(t, 0, seqTokens(100+16*i, 16), 16, nil, int64(10+i))
			lost = append(lost, p)
			if _, err := es.pubs[0].PublishDropped(p); err != nil {
				t.Fatal(err)
			}
		}
		live := storedBatch(t, 0, seqTokens(1, 16), 16, nil, 99)
		if _, err := es.pubs[0].Publish(live); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the live batch", 10*time.Second, func() bool { return indexOf(tap.snapshot(), live) >= 0 })
		msgs := tap.snapshot()[before:]
		if len(msgs) == 0 || !isClear(msgs[0]) {
			t.Fatal("the first message after an unfillable gap is not AllBlocksCleared")
		}
		if indexOf(msgs, lost[0]) >= 0 || indexOf(msgs, lost[1]) >= 0 {
			t.Error("batches before the hole were republished after the clear")
		}
		// What the buffer still held after the hole is kept: lost[2], then live.
		if i, j := indexOf(msgs, lost[2]), indexOf(msgs, live); i != 1 || j != 2 {
			t.Errorf("after the clear lost[2] is at %d and live at %d, want 1 and 2", i, j)
		}
		assertGapFree(t, tap.snapshot())
		if s := b.Stats().Snapshot(); s.HealFailures != 1 {
			t.Errorf("stats: %+v, want one heal failure", s)
		}
	})

	for _, lineUp := range []bool{false, true} {
		name := "an engine restart clears the worker before its new batches (numbers go back)"
		if lineUp {
			name = "an engine restart clears the worker even when its numbers line up with the old ones"
		}
		t.Run(name, func(t *testing.T) {
			ns := "restart" + strconv.FormatBool(lineUp)
			ix := kvindex.New(kvindex.Config{})
			ix.AddWorker("w0", testModel, 16)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := kvindex.NewConsumer(in.nc, kvindex.ConsumerConfig{Namespace: ns, Index: ix, Logger: quiet()}).Start(ctx); err != nil {
				t.Fatal(err)
			}
			tap := tapEvents(t, in.nc, ns)
			eng := newFakeEngine(t, "vllm_metrics.txt")
			es := newEngineSide(t, 1, 0)
			runBridge(t, bridgeConfig(in, ns, eng, es))
			connect(t, es.pubs[0], tap, 0)
			old := seqTokens(5000, 16)
			if _, err := es.pubs[0].Publish(storedBatch(t, 0, old, 16, nil, 7)); err != nil {
				t.Fatal(err)
			}
			oldHashes := kvindex.HashBlocks(kvindex.Seed(testModel, "", ""), old, 16, nil)
			waitFor(t, "the old engine's block in the index", 10*time.Second, func() bool {
				return ix.Match(oldHashes, []string{"w0"}, nil)[0].Blocks == 1
			})
			next := es.pubs[0].NextSeq()

			es.stop()
			es.start(t, 1) // same ports, sequence from 0 again, empty cache
			var early [][]byte
			if lineUp {
				// The new engine has already published as many batches as the
				// old one, none of which the bridge saw live: its next number
				// is exactly the one the bridge expects.
				for i := uint64(0); i < next; i++ {
					p := storedBatch(t, 0, seqTokens(9000+16*int(i), 16), 16, nil, int64(900+i))
					if _, err := es.pubs[0].PublishDropped(p); err != nil {
						t.Fatal(err)
					}
					early = append(early, p)
				}
			}
			before := len(tap.snapshot())
			sent := connect(t, es.pubs[0], tap, 0)
			msgs := tap.snapshot()[before:]
			if len(msgs) == 0 || !isClear(msgs[0]) {
				t.Fatal("the first message after the engine restarted is not AllBlocksCleared")
			}
			// Then everything the new engine published, from its replay buffer.
			for i, p := range append(early, sent[0]) {
				if got := indexOf(msgs, p); got != i+1 {
					t.Errorf("new engine's batch %d is at %d, want %d", i, got, i+1)
				}
			}
			assertGapFree(t, tap.snapshot())
			waitFor(t, "the old block to leave the index", 5*time.Second, func() bool {
				return ix.Match(oldHashes, []string{"w0"}, nil)[0].Blocks == 0
			})
		})
	}

	t.Run("a new engine process start time in /metrics clears and replays the worker", func(t *testing.T) {
		ns := "pstart"
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))
		sent := connect(t, es.pubs[0], tap, 0)
		before := len(tap.snapshot())
		text := bytes.Replace(readTestdata(t, "vllm_metrics.txt"),
			[]byte("process_start_time_seconds 1.76379201224e+09"), []byte("process_start_time_seconds 1.76379301224e+09"), 1)
		eng.metrics.Store(text)
		waitFor(t, "a clear and the buffer replayed after it", 10*time.Second, func() bool {
			msgs := tap.snapshot()[before:]
			return len(msgs) > len(sent) && isClear(msgs[0]) && indexOf(msgs, sent[len(sent)-1]) == len(sent)
		})
		assertGapFree(t, tap.snapshot())
	})

	t.Run("registers model, adapters and capacity, reports load, deregisters on shutdown", func(t *testing.T) {
		ns := "reg"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		loads := make(chan *nats.Msg, 64)
		sub, err := in.nc.ChanSubscribe(scoring.LoadSubject(ns, "w0"), loads)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		_, stop := runBridge(t, bridgeConfig(in, ns, eng, es))

		key := discovery.Key(ns, "w0")
		var rec discovery.Record
		waitFor(t, "the etcd record", 10*time.Second, func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			if err != nil || len(resp.Kvs) == 0 {
				return false
			}
			rec, err = discovery.ParseRecord(resp.Kvs[0].Value)
			if err != nil {
				t.Fatalf("bridge wrote an invalid record: %v", err)
			}
			if resp.Kvs[0].Lease == 0 {
				t.Fatal("record written without a lease")
			}
			return true
		})
		want := discovery.Record{ID: "w0", Model: testModel, Address: "10.0.0.5:8000", BlockSize: 16,
			KVTotalBlocks: 1000, LoRAAdapters: []string{"sql-lora"}}
		if got, _ := json.Marshal(rec); string(got) != string(mustJSON(t, want)) {
			t.Errorf("record = %s, want %s", got, mustJSON(t, want))
		}

		select {
		case m := <-loads:
			r, err := scoring.ParseLoadReport(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if r.Waiting != 3 || r.Running != 5 || r.KVUsedBlocks != 250 || r.KVTotalBlocks != 1000 {
				t.Errorf("load report %+v, want waiting 3 running 5 kv 250/1000", r)
			}
			if age := time.Since(r.Time()); age > 5*time.Second || age < -time.Second {
				t.Errorf("load report timestamp is %v old", age)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no load report")
		}

		stop() // what SIGTERM does
		resp, err := in.cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Error("record still in etcd after the bridge shut down")
		}
	})

	t.Run("an unhealthy engine leaves the fleet and rejoins when ready", func(t *testing.T) {
		ns := "health"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))
		key := discovery.Key(ns, "w0")
		present := func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			return err == nil && len(resp.Kvs) == 1
		}
		waitFor(t, "registration", 10*time.Second, present)
		eng.failing.Store(true)
		waitFor(t, "deregistration of the failing engine", 5*time.Second, func() bool { return !present() })
		eng.failing.Store(false)
		waitFor(t, "registration again", 5*time.Second, present)
	})

	t.Run("killing the bridge lets the lease lapse and the worker leaves", func(t *testing.T) {
		ns := "kill"
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.Etcd = in.etcdClient(t) // the bridge's own connection, to cut
		runBridge(t, cfg)
		key := discovery.Key(ns, "w0")
		waitFor(t, "registration", 10*time.Second, func() bool {
			resp, err := in.cli.Get(context.Background(), key)
			return err == nil && len(resp.Kvs) == 1
		})
		resp, err := in.cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		watch := in.cli.Watch(context.Background(), key, clientv3.WithRev(resp.Header.Revision+1))
		// A killed process sends nothing more: its etcd connection just dies.
		_ = cfg.Etcd.Close()
		start := time.Now()
		select {
		case wr := <-watch:
			if len(wr.Events) == 0 || wr.Events[0].Type != mvccpb.DELETE {
				t.Fatalf("watch: %+v, want the key deleted", wr)
			}
			if time.Since(start) < time.Second {
				t.Errorf("key gone after %v: it should take the lease TTL, not an explicit delete", time.Since(start))
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the record outlived its lease")
		}
	})

	t.Run("data-parallel ranks become separate workers", func(t *testing.T) {
		ns := "dp"
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics_dp2_old.txt")
		es := newEngineSide(t, 2, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.DPSize = 2
		loads := make(chan *nats.Msg, 64)
		sub, err := in.nc.ChanSubscribe(scoring.LoadSubjectWildcard(ns), loads)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		runBridge(t, cfg)
		connect(t, es.pubs[1], tap, 1)
		connect(t, es.pubs[0], tap, 0)
		for _, m := range tap.snapshot() {
			b, err := kvindex.DecodeBatch(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if want := "kvroute.dp.events.w0-dp" + strconv.Itoa(*b.DPRank); m.Subject != want {
				t.Errorf("rank %d batch on %s, want %s", *b.DPRank, m.Subject, want)
			}
		}
		for r, want := range map[int]int{0: 2000, 1: 2000} {
			key := discovery.Key(ns, "w0-dp"+strconv.Itoa(r))
			waitFor(t, key, 10*time.Second, func() bool {
				resp, err := in.cli.Get(context.Background(), key)
				if err != nil || len(resp.Kvs) == 0 {
					return false
				}
				rec, err := discovery.ParseRecord(resp.Kvs[0].Value)
				if err != nil || rec.DPRank != r || rec.BlockSize != 32 || rec.KVTotalBlocks != want {
					t.Fatalf("rank %d record %+v (err %v)", r, rec, err)
				}
				return true
			})
		}
		got := map[string]scoring.LoadReport{}
		waitFor(t, "load reports for both ranks", 5*time.Second, func() bool {
			select {
			case m := <-loads:
				r, err := scoring.ParseLoadReport(m.Data)
				if err != nil {
					t.Fatal(err)
				}
				got[m.Subject] = r
			default:
			}
			return len(got) == 2
		})
		if r := got["kvroute.dp.load.w0-dp1"]; r.Waiting != 4 || r.Running != 7 || r.KVUsedBlocks != 1000 {
			t.Errorf("rank 1 load %+v, want waiting 4 running 7 used 1000", r)
		}
		if r := got["kvroute.dp.load.w0-dp0"]; r.Waiting != 0 || r.Running != 2 || r.KVUsedBlocks != 200 {
			t.Errorf("rank 0 load %+v, want waiting 0 running 2 used 200", r)
		}
	})

	t.Run("SGLang: page size from server info, capacity from token pool", func(t *testing.T) {
		ns := "sglang"
		eng := newFakeEngine(t, "sglang_metrics.txt")
		es := newEngineSide(t, 1, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.Engine = EngineSGLang
		b, _ := runBridge(t, cfg)
		waitFor(t, "registration", 10*time.Second, func() bool { return len(b.Records()) == 1 })
		if rec := b.Records()[0]; rec.BlockSize != 16 || rec.KVTotalBlocks != 10240 {
			t.Errorf("record %+v, want block size 16 and 163840/16 blocks", rec)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
