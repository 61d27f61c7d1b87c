package bridge

import (
	"bytes"
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

const testModel = "Qwen/Qwen3-8B" // what testdata/vllm_models.json serves

func bridgeConfig(in *infra, ns string, eng *fakeEngine, es *engineSide) Config {
	ev, rep := es.endpoints()
	return Config{
		Namespace: ns, WorkerID: "w0", Engine: engine.EngineVLLM, EngineURL: eng.URL,
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
		s, err := strconv.ParseUint(m.Header.Get(bus.SeqHeader), 10, 64)
		if err != nil {
			t.Fatalf("message on %s has no valid %s header: %v", m.Subject, bus.SeqHeader, err)
		}
		out = append(out, s)
	}
	return out
}

func assertGapFree(t *testing.T, msgs []*nats.Msg) {
	t.Helper()
	for i, s := range seqs(t, msgs) {
		if s != uint64(i) {
			t.Fatalf("message %d carries %s %d; the bridge's stream must be gap-free from 0", i, bus.SeqHeader, s)
		}
	}
}

// TestBridgeEvents covers the KV event path: ZMQ in, NATS out.
func TestBridgeEvents(t *testing.T) {
	in := startInfra(t)

	t.Run("events reach NATS unchanged, led by AllBlocksCleared, and fill a kvindex.Index", func(t *testing.T) {
		ns := "events"
		ix := kvindex.New(kvindex.Config{})
		ix.AddWorker("w0", testModel, 16)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		consumeEvents(ctx, t, in.nc, ns, ix)
		tap := tapEvents(t, in.nc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		runBridge(t, bridgeConfig(in, ns, eng, es))

		sent := connect(t, es.pubs[0], tap, 0)
		// A two-block prompt, stored as a chain of two batches.
		prompt := seqTokens(1, 32)
		parent := vllmwire.HashInt(501)
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
			consumeEvents(ctx, t, in.nc, ns, ix)
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

	t.Run("after a NATS outage Resync clears and replays the worker", func(t *testing.T) {
		srv := testenv.StartNATS(t)
		var current atomic.Pointer[Bridge]
		// The bridge reconnects slower than the tap, so the tap's
		// subscription is back before the bridge publishes again.
		bnc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(400*time.Millisecond),
			nats.ReconnectHandler(func(*nats.Conn) {
				if b := current.Load(); b != nil {
					b.Resync()
				}
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer bnc.Close()
		tnc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer tnc.Close()
		ns := "natsout"
		tap := tapEvents(t, tnc, ns)
		eng := newFakeEngine(t, "vllm_metrics.txt")
		es := newEngineSide(t, 1, 0)
		cfg := bridgeConfig(in, ns, eng, es)
		cfg.NATS = bnc
		b, _ := runBridge(t, cfg)
		current.Store(b)
		sent := connect(t, es.pubs[0], tap, 0)
		before := len(tap.snapshot())

		srv.Restart(t)
		waitFor(t, "a clear and the buffer replayed after NATS came back", 15*time.Second, func() bool {
			msgs := tap.snapshot()[before:]
			return len(msgs) > len(sent) && isClear(msgs[0]) && indexOf(msgs, sent[len(sent)-1]) == len(sent)
		})
	})

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

}
