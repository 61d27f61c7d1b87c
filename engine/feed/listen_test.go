package feed

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
)

func TestResolve(t *testing.T) {
	fleet := []fleet.Worker{
		{ID: "a", Model: "m1", Address: "10.0.0.1:8000"},
		{ID: "b1", Model: "m1", Address: "10.0.0.2:8000"},
		{ID: "b2", Model: "m1", Address: "10.0.0.2:8001"},
		{ID: "c1", Model: "m1", Address: "10.0.0.3:8000"},
		{ID: "c2", Model: "m2", Address: "10.0.0.3:8001"},
	}
	for _, tc := range []struct {
		topic string
		want  string
		err   error
	}{
		{"kv@10.0.0.1@m1", "a", nil},
		{"kv@10.0.0.1:8000@m1", "a", nil},
		{"kv@10.0.0.1@other-model", "a", nil}, // one worker on the host: the model is not checked
		{"kv@10.0.0.2:8001@m1", "b2", nil},
		{"kv@10.0.0.2@m1", "", ErrAmbiguousPublisher}, // two engines on the pod, same model
		{"kv@10.0.0.3@m2", "c2", nil},                 // the model tells them apart
		{"kv@10.0.0.1:9000@m1", "", ErrUnknownPublisher},
		{"kv@10.0.0.9@m1", "", ErrUnknownPublisher},
		{"", "", ErrUnknownPublisher}, // vLLM's default topic names nobody
		{"kv-events", "", ErrUnknownPublisher},
	} {
		got, err := Resolve(tc.topic, fleet)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Resolve(%q) = %q, %v; want %v", tc.topic, got.ID, err, tc.err)
			}
			continue
		}
		if err != nil || got.ID != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.topic, got.ID, err, tc.want)
		}
	}
}

// rawPub is an engine's PUB socket connected to the listener, numbering
// its batches by hand so a test can leave gaps.
type rawPub struct {
	sock  zmq4.Socket
	topic string
	seq   uint64
}

func dialPub(t *testing.T, endpoint, topic string) *rawPub {
	t.Helper()
	s := zmq4.NewPub(context.Background())
	if err := s.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &rawPub{sock: s, topic: topic}
}

func (p *rawPub) send(t *testing.T, seq uint64, tokens []uint32) {
	t.Helper()
	r := 0
	payload, err := vllmwire.EncodeBatch(vllmwire.EventBatch{
		Events: []vllmwire.Event{vllmwire.BlockStored{
			BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(int64(tokens[0]))}, TokenIDs: tokens, BlockSize: len(tokens)}},
		DPRank: &r, Format: vllmwire.FormatArray,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.sock.Send(zmq4.NewMsgFrom(vllmzmq.EventFrames(p.topic, seq, payload)...)); err != nil {
		t.Fatal(err)
	}
	p.seq = seq
}

func block(first uint32) []uint32 {
	out := make([]uint32, 16)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

// Engines that connect their PUB sockets to the router's listener land on
// the workers their topics name; a topic naming nobody is counted and
// dropped; each publisher's gaps are its own.
func TestListenDemultiplexesPublishers(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	specs := []fleet.Worker{
		{ID: "w0", Model: model, Address: "127.0.0.2:8000", BlockSize: 16},
		{ID: "w1", Model: model, Address: "127.0.0.3:8000", BlockSize: 16},
	}
	var unknown atomic.Int64
	f, err := New(Config{Events: true, Listen: "tcp://127.0.0.1:0", ReplayPort: -1, Core: startCore(t, ix),
		OnUnknownPublisher: func() { unknown.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range specs {
		ix.AddWorker(s.ID, s.Model, s.BlockSize)
		f.Upsert(s)
	}
	p0 := dialPub(t, f.ListenEndpoint(), "kv@127.0.0.2@"+model)
	p1 := dialPub(t, f.ListenEndpoint(), "kv@127.0.0.3:8000@"+model)
	stray := dialPub(t, f.ListenEndpoint(), "kv@127.0.0.9@"+model)
	// Until the subscription reaches each PUB its batches are lost (ZMQ's
	// slow joiner); the streams start over with whatever arrives first.
	eventually(t, "both workers' first blocks and a stray batch", func() bool {
		p0.send(t, p0.seq+1, block(100))
		p1.send(t, p1.seq+1, block(200))
		stray.send(t, stray.seq+1, block(300))
		time.Sleep(20 * time.Millisecond)
		return blocks(ix, "w0") == 1 && blocks(ix, "w1") == 1 && unknown.Load() > 0
	})
	if got := f.Stats().UnknownPublisher.Load(); got != unknown.Load() {
		t.Errorf("Stats().UnknownPublisher = %d, the callback counted %d", got, unknown.Load())
	}
	// p0 goes on in order; p1 skips two numbers. With no replay, p1's gap
	// clears w1's view to the batch after it, and p0 is untouched.
	p0.send(t, p0.seq+1, block(116))
	p1.send(t, p1.seq+3, block(216))
	eventually(t, "w0 to hold two blocks and w1 one", func() bool {
		return blocks(ix, "w0") == 2 && blocks(ix, "w1") == 1 && f.Stats().HealFailures.Load() == 1
	})
	// Discovery drops w1: its publisher's batches are unknown from then on.
	f.Remove("w1")
	before := unknown.Load()
	eventually(t, "w1's batches to count as unknown", func() bool {
		p1.send(t, p1.seq+1, block(232))
		time.Sleep(20 * time.Millisecond)
		return unknown.Load() > before
	})
}

func TestListenRefusesABusyAddress(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	f, err := New(Config{Events: true, Listen: "tcp://127.0.0.1:0", Core: startCore(t, ix)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if g, err := New(Config{Events: true, Listen: f.ListenEndpoint(), Core: startCore(t, ix)}); err == nil {
		g.Close()
		t.Fatalf("a second listener on %s started", f.ListenEndpoint())
	}
}

// An engine that connects to the listener but still binds a replay socket
// (vLLM's replay_endpoint) gets the batches the listener missed replayed
// from tcp://<worker host>:<ReplayPort> when its stream starts.
func TestListenReplaysFromTheWorkersHost(t *testing.T) {
	ix := kvindex.New(kvindex.Config{})
	replayPort := freePort(t)
	f, err := New(Config{Events: true, Listen: "tcp://127.0.0.1:0", ReplayPort: replayPort, Core: startCore(t, ix)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	spec := fleet.Worker{ID: "w0", Model: model, Address: engineIP + ":8000", BlockSize: 16}
	ix.AddWorker(spec.ID, spec.Model, spec.BlockSize)
	f.Upsert(spec)
	// The engine's replay side: a vLLM-like publisher whose own PUB reaches
	// no one, so its first batches exist only in its replay buffer; the
	// live side is a PUB connected to the listener sending the same
	// numbered batches from then on.
	topic := "kv@" + engineIP + "@" + model
	pub, err := vllmzmq.NewPublisher(context.Background(), vllmzmq.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", Mode: vllmzmq.Bind, Topic: topic,
		ReplayEndpoint: fmt.Sprintf("tcp://%s:%d", engineIP, replayPort)})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stored := func(first uint32) []byte {
		r := 0
		b, err := vllmwire.EncodeBatch(vllmwire.EventBatch{
			Events: []vllmwire.Event{vllmwire.BlockStored{BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(int64(first))}, TokenIDs: block(first), BlockSize: 16}},
			DPRank: &r, Format: vllmwire.FormatArray})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	n := 0
	for ; n < 3; n++ {
		if _, err := pub.Publish(stored(uint32(1000 + 16*n))); err != nil {
			t.Fatal(err)
		}
	}
	live := dialPub(t, f.ListenEndpoint(), topic)
	eventually(t, "a live batch", func() bool {
		payload := stored(uint32(1000 + 16*n))
		seq, err := pub.Publish(payload)
		if err != nil {
			t.Fatal(err)
		}
		if err := live.sock.Send(zmq4.NewMsgFrom(vllmzmq.EventFrames(topic, seq, payload)...)); err != nil {
			t.Fatal(err)
		}
		n++
		time.Sleep(20 * time.Millisecond)
		return blocks(ix, "w0") > 0
	})
	eventually(t, "every batch published, the early ones replayed", func() bool { return blocks(ix, "w0") == n })
	if f.Stats().Replayed.Load() == 0 {
		t.Errorf("no batch came through replay (stats %+v)", f.Stats().Snapshot())
	}
}
