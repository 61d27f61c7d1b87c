package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/nats-io/nats.go"
)

// A replica started with --warm-from holds its peer's index when Start
// returns (before it is ready), and the live tail continues after the
// snapshot: the next batch applies without a gap, the ones the snapshot
// held are not applied twice.
func TestWarmStartLoadsPeerIndexThenLiveTail(t *testing.T) {
	testenv.Quiet()
	n := testenv.StartNATS(t)
	file := workersFile(t, 3)
	cfgA := testConfig(t)
	cfgA.WorkersFile, cfgA.NATSURL = file, n.URL
	a := start(t, cfgA)

	nc, err := nats.Connect(n.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tokens := promptTokens(t, chatBody(300))
	per := len(tokens) / 16 / 3
	publish := func(worker string, seq uint64, part int) {
		t.Helper()
		hs := make([]vllmwire.EngineHash, per)
		for i := range hs {
			hs[i] = vllmwire.HashInt(int64(part*per + i + 1))
		}
		ev := vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[part*per*16 : (part+1)*per*16], BlockSize: 16}
		if part > 0 {
			parent := vllmwire.HashInt(int64(part * per))
			ev.ParentBlockHash = &parent
		}
		if err := bus.PublishEvents(nc, cfgA.Namespace, worker, seq, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{ev}}); err != nil {
			t.Fatal(err)
		}
	}
	publish("w1", 0, 0)
	publish("w1", 1, 1)
	eventually(t, "peer A indexes two batches", func() bool { return a.Index().Stats().Entries == 2*per })

	cfgB := testConfig(t)
	cfgB.WorkersFile, cfgB.NATSURL = file, n.URL
	cfgB.Recovery.WarmFrom = "http://" + a.AdminAddr()
	b := start(t, cfgB)
	if got := b.Index().Stats().Entries; got != 2*per {
		t.Fatalf("warm replica holds %d entries when Start returns, want the peer's %d", got, 2*per)
	}
	// The next batch extends the chain on both; a repeat of batch 1 is
	// skipped by B (the snapshot holds it), and nothing is stale.
	publish("w1", 1, 1)
	publish("w1", 2, 2)
	eventually(t, "both replicas apply the live tail", func() bool {
		return a.Index().Stats().Entries == 3*per && b.Index().Stats().Entries == 3*per
	})
	if b.Index().NeedsResync("w1") {
		t.Fatal("w1 stale on the warm replica after the live tail")
	}
	if st := b.events.Stats(); st.Gaps != 0 || st.Restarts != 0 || st.Duplicates != 1 {
		t.Fatalf("warm replica's consumer %+v, want no gap or restart and the repeated batch skipped", st)
	}
	if got, want := b.Index().Match(kvindex.HashBlocks(kvindex.Seed(model, "", ""), tokens, 16, nil), []string{"w1"}, nil)[0].Blocks, int32(3*per); got != want {
		t.Fatalf("warm replica matches %d blocks of the prompt on w1, want %d", got, want)
	}
}

func TestSnapshotEndpointServesAVersionedSnapshot(t *testing.T) {
	r, _ := startReady(t, 2)
	resp, err := http.Get("http://" + r.AdminAddr() + SnapshotPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Kvroute-Snapshot-Version") != "1" {
		t.Fatalf("%s, version header %q", resp.Status, resp.Header.Get("Kvroute-Snapshot-Version"))
	}
	s, err := kvindex.ReadSnapshot(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Workers) != 2 {
		t.Fatalf("snapshot of %d workers, want 2", len(s.Workers))
	}
}

// With --engine-events zmq a warm start works as over NATS: the peer's
// snapshot carries each worker's engine sequence number, and the warm
// replica's stream resumes after it (the batches it missed meanwhile come
// from the engine's replay socket) instead of clearing the worker at its
// first batch.
func TestWarmStartOverZMQResumesAfterThePeersSnapshot(t *testing.T) {
	testenv.Quiet()
	pubPort, replayPort := freeTCPPort(t), freeTCPPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eng, err := vllmzmq.NewPublisher(ctx, vllmzmq.PublisherConfig{
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", replayPort),
		Mode: vllmzmq.Bind, Logger: quiet(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	file := filepath.Join(t.TempDir(), "workers.yaml")
	rec := fmt.Sprintf("workers:\n- {id: w1, model: %q, address: '127.0.0.1:8000', block_size: 16, kv_total_blocks: 4096}\n", model)
	if err := os.WriteFile(file, []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	zmqConfig := func() Config {
		cfg := testConfig(t)
		cfg.WorkersFile, cfg.EngineEvents = file, EngineEventsZMQ
		cfg.EngineEventsPort, cfg.EngineReplayPort = pubPort, replayPort
		return cfg
	}
	tokens := promptTokens(t, chatBody(300))
	per := len(tokens) / 16 / 3
	publish := func(part int) {
		t.Helper()
		var ev vllmwire.Event = vllmwire.BlockRemoved{BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(1 << 40)}} // holds nothing: a no-op
		if part >= 0 {
			hs := make([]vllmwire.EngineHash, per)
			for i := range hs {
				hs[i] = vllmwire.HashInt(int64(part*per + i + 1))
			}
			st := vllmwire.BlockStored{BlockHashes: hs, TokenIDs: tokens[part*per*16 : (part+1)*per*16], BlockSize: 16}
			if part > 0 {
				parent := vllmwire.HashInt(int64(part * per))
				st.ParentBlockHash = &parent
			}
			ev = st
		}
		data, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{ev}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Publish(data); err != nil {
			t.Fatal(err)
		}
	}
	a := start(t, zmqConfig())
	publish(0)
	publish(1)
	// A's subscription joins in the background; its first live batch
	// replays the engine's buffer from 0.
	eventually(t, "peer A indexes two batches", func() bool {
		publish(-1)
		time.Sleep(10 * time.Millisecond)
		return a.Index().Stats().Entries == 2*per
	})

	cfgB := zmqConfig()
	cfgB.Recovery.WarmFrom = "http://" + a.AdminAddr()
	b := start(t, cfgB)
	if got := b.Index().Stats().Entries; got != 2*per {
		t.Fatalf("warm replica holds %d entries when Start returns, want the peer's %d", got, 2*per)
	}
	// B joins the engine after the snapshot: the no-ops it misses are
	// replayed, the next part extends the chain, and B never starts the
	// worker over.
	publish(-1)
	publish(2)
	eventually(t, "both replicas apply the live tail", func() bool {
		publish(-1)
		time.Sleep(10 * time.Millisecond)
		return a.Index().Stats().Entries == 3*per && b.Index().Stats().Entries == 3*per
	})
	if st := b.EngineFeeds().Stats().Snapshot(); st.Resets != 0 || st.Clears != 0 {
		t.Fatalf("warm replica's engine stream %+v: want it resumed after the snapshot, never reset", st)
	}
	if st := b.events.Stats(); st.Fresh != 0 || st.Gaps != 0 || st.Restarts != 0 {
		t.Fatalf("warm replica's event core %+v: want no fresh start, gap or restart", st)
	}
	if got, want := b.Index().Match(kvindex.HashBlocks(kvindex.Seed(model, "", ""), tokens, 16, nil), []string{"w1"}, nil)[0].Blocks, int32(3*per); got != want {
		t.Fatalf("warm replica matches %d blocks of the prompt on w1, want %d", got, want)
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
