package vllmzmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func startPublisher(t *testing.T, cfg PublisherConfig) *Publisher {
	t.Helper()
	if cfg.Endpoint == "" {
		cfg.Endpoint = "tcp://127.0.0.1:0"
		cfg.Mode = Bind
	}
	cfg.Logger = quietLogger()
	p, err := NewPublisher(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// warmUp publishes throwaway batches until the subscriber sees one, so the
// SUB's subscription has reached the PUB (ZMQ's slow-joiner effect), and
// returns the sequence of the batch that got through.
func warmUp(t *testing.T, p *Publisher, recv func(ctx context.Context) (Event, error)) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan Event, 1)
	go func() {
		for {
			ev, err := recv(ctx)
			if err == nil {
				got <- ev
				return
			}
			// A connection made and lost again while a publisher
			// restarts is reported again; the stream goes on.
			if !errors.Is(err, ErrDisconnected) && !errors.Is(err, ErrBadFrames) {
				return
			}
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev := <-got:
			return ev.Seq
		case <-tick.C:
			if _, err := p.Publish([]byte("warm-up")); err != nil {
				t.Fatalf("publish: %v", err)
			}
		case <-ctx.Done():
			t.Fatalf("subscriber never received a batch")
		}
	}
}

func TestPublisherSendsVLLMFramesByteForByte(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Topic: "kv-events"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A raw zmq4 SUB, not our Subscriber: this pins the bytes on the wire.
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv-events"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(p.Endpoint()); err != nil {
		t.Fatal(err)
	}
	last := warmUp(t, p, func(context.Context) (Event, error) {
		m, err := sub.Recv()
		if err != nil {
			return Event{}, err
		}
		return ParseEvent(m.Frames)
	})
	// Drain warm-up batches still in flight.
	for p.NextSeq() != last+1 {
		m, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		last = mustSeq(t, m.Frames[1])
	}
	payload := []byte{0x93, 0xcb, 0x41, 0xd9, 0, 0, 0, 0, 0, 0, 0x90, 0x00} // [ts, [], 0]
	seq, err := p.Publish(payload)
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]byte{[]byte("kv-events"), {0, 0, 0, 0, 0, 0, 0, byte(seq)}, payload}
	if len(m.Frames) != 3 {
		t.Fatalf("got %d frames, want 3", len(m.Frames))
	}
	for i := range want {
		if !bytes.Equal(m.Frames[i], want[i]) {
			t.Errorf("frame %d = %x, want %x", i, m.Frames[i], want[i])
		}
	}
}

func mustSeq(t *testing.T, b []byte) uint64 {
	t.Helper()
	s, err := DecodeSeq(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSequenceStartsAtZeroAndCounts(t *testing.T) {
	p := startPublisher(t, PublisherConfig{})
	for want := uint64(0); want < 5; want++ {
		got, err := p.Publish([]byte{byte(want)})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("Publish #%d returned seq %d", want, got)
		}
	}
}

func TestReplay(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", BufferSteps: 4})
	for i := 0; i < 6; i++ { // seqs 0..5; the buffer keeps 2..5
		publish := p.Publish
		if i == 4 {
			publish = p.PublishDropped // dropped batches are replayed all the same
		}
		if _, err := publish([]byte(fmt.Sprintf("batch-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: p.ReplayEndpoint(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		name  string
		start uint64
		want  []uint64
	}{
		{"inside the buffer returns the tail", 3, []uint64{3, 4, 5}},
		{"the oldest buffered", 2, []uint64{2, 3, 4, 5}},
		{"before the buffer returns what is left, silently", 0, []uint64{2, 3, 4, 5}},
		{"past the newest returns only the end marker", 6, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Replay(context.Background(), tt.start)
			if err != nil {
				t.Fatalf("Replay(%d): %v", tt.start, err)
			}
			var seqs []uint64
			for _, r := range got {
				seqs = append(seqs, r.Seq)
				if want := fmt.Sprintf("batch-%d", r.Seq); string(r.Payload) != want {
					t.Errorf("seq %d payload %q, want %q", r.Seq, r.Payload, want)
				}
			}
			if fmt.Sprint(seqs) != fmt.Sprint(tt.want) {
				t.Errorf("Replay(%d) seqs = %v, want %v", tt.start, seqs, tt.want)
			}
		})
	}
}

// TestReplayAnswersAREQClientLikeVLLMs pins the ROUTER side against a plain
// REQ client, the way vLLM's example subscriber asks.
func TestReplayAnswersAREQClientLikeVLLMs(t *testing.T) {
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv"})
	for i := 0; i < 3; i++ {
		if _, err := p.Publish([]byte{0x90 + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dealer := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("req-like")))
	defer dealer.Close()
	if err := dealer.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send(zmq4.NewMsgFrom([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 1})); err != nil {
		t.Fatal(err)
	}
	want := [][][]byte{
		{{}, []byte("kv"), {0, 0, 0, 0, 0, 0, 0, 1}, {0x91}},
		{{}, []byte("kv"), {0, 0, 0, 0, 0, 0, 0, 2}, {0x92}},
		{{}, {}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {}},
	}
	for i, w := range want {
		m, err := dealer.Recv()
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if fmt.Sprintf("%x", m.Frames) != fmt.Sprintf("%x", w) {
			t.Errorf("reply %d = %x, want %x", i, m.Frames, w)
		}
	}
}

func TestSubscriberFiltersTopicAndReceives(t *testing.T) {
	p := startPublisher(t, PublisherConfig{Topic: "kv-events"})
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: p.Endpoint(), Topic: "kv", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	warmUp(t, p, s.Recv)
	seq, err := p.Publish([]byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq < seq {
			continue // warm-up stragglers
		}
		if ev.Seq != seq || ev.Topic != "kv-events" || string(ev.Payload) != "payload" {
			t.Fatalf("got %+v, want seq %d topic kv-events payload \"payload\"", ev, seq)
		}
		return
	}
}

func TestSubscriberReportsLossAndReconnectsToARestartedEngine(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + l.Addr().String()
	l.Close()
	first, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: ep, Mode: Bind, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: ep, RetryInterval: 20 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	warmUp(t, first, s.Recv)
	_ = first.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := s.Recv(ctx)
		if errors.Is(err, ErrDisconnected) {
			break
		}
		if err != nil && !errors.Is(err, ErrBadFrames) {
			t.Fatalf("waiting for the loss: %v", err)
		}
	}
	second, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: ep, Mode: Bind, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	seq := warmUp(t, second, s.Recv)
	if seq > 50 {
		t.Errorf("restarted engine's first seen seq %d; a fresh publisher starts from 0", seq)
	}
}

func TestReplayWithoutEndpoint(t *testing.T) {
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Replay(context.Background(), 0); !errors.Is(err, ErrNoReplay) {
		t.Fatalf("Replay without endpoint: %v, want ErrNoReplay", err)
	}
}

func TestOffsetEndpointPort(t *testing.T) {
	tests := []struct {
		ep      string
		rank    int
		want    string
		wantErr bool
	}{
		{"tcp://*:5557", 0, "tcp://*:5557", false},
		{"tcp://*:5557", 2, "tcp://*:5559", false},
		{"tcp://127.0.0.1:5558", 1, "tcp://127.0.0.1:5559", false},
		{"inproc://cache", 3, "inproc://cache_dp3", false},
		{"", 3, "", false},
		{"ipc:///tmp/x", 1, "", true},
		{"tcp://host:port", 1, "", true},
	}
	for _, tt := range tests {
		got, err := OffsetEndpointPort(tt.ep, tt.rank)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("OffsetEndpointPort(%q, %d) = %q, %v; want %q, err=%v", tt.ep, tt.rank, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseRejectsMalformedFrames(t *testing.T) {
	seq := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	tests := []struct {
		name  string
		parse func() error
	}{
		{"event with two frames", func() error { _, err := ParseEvent([][]byte{{}, seq}); return err }},
		{"event with a short sequence", func() error { _, err := ParseEvent([][]byte{{}, {1, 2}, {0x90}}); return err }},
		{"request without delimiter", func() error { _, _, err := ParseReplayRequest([][]byte{{1}, seq}); return err }},
		{"request with non-empty delimiter", func() error { _, _, err := ParseReplayRequest([][]byte{{1}, {2}, seq}); return err }},
		{"reply with one frame", func() error { _, _, err := ParseReplayReply([][]byte{seq}); return err }},
		{"reply with five frames", func() error { _, _, err := ParseReplayReply([][]byte{{}, {}, {'t'}, seq, {0x90}}); return err }},
		{"four-frame reply with a non-empty delimiter", func() error {
			_, _, err := ParseReplayReply([][]byte{{1}, {'t'}, seq, {0x90}})
			return err
		}},
		{"end marker with a payload", func() error {
			_, _, err := ParseReplayReply([][]byte{AppendSeq(nil, EndSeq), {1}})
			return err
		}},
	}
	for _, tt := range tests {
		if err := tt.parse(); !errors.Is(err, ErrBadFrames) {
			t.Errorf("%s: err = %v, want ErrBadFrames", tt.name, err)
		}
	}
	if !strings.Contains(fmt.Sprint(ErrBadFrames), "malformed") {
		t.Error("ErrBadFrames should say the message is malformed")
	}
}

// TestParseReplayReplyForms: vLLM 0.32 puts the topic before the sequence
// in every replay reply; earlier releases and SGLang do not. Each form
// parses, with and without the DEALER's empty delimiter.
func TestParseReplayReplyForms(t *testing.T) {
	seq := AppendSeq(nil, 7)
	end := AppendSeq(nil, EndSeq)
	tests := []struct {
		name   string
		frames [][]byte
		want   Replayed
		end    bool
	}{
		{"vLLM 0.32 through a DEALER", [][]byte{{}, []byte("kv@a"), seq, {0x93}}, Replayed{Topic: "kv@a", Seq: 7, Payload: []byte{0x93}}, false},
		{"vLLM 0.32 end marker", [][]byte{{}, {}, end, {}}, Replayed{Seq: EndSeq}, true},
		{"vLLM 0.32 through a REQ", [][]byte{[]byte("kv@a"), seq, {0x93}}, Replayed{Topic: "kv@a", Seq: 7, Payload: []byte{0x93}}, false},
		{"vLLM 0.32 with an empty topic", [][]byte{{}, {}, seq, {0x93}}, Replayed{Seq: 7, Payload: []byte{0x93}}, false},
		{"older release through a DEALER", [][]byte{{}, seq, {0x93}}, Replayed{Seq: 7, Payload: []byte{0x93}}, false},
		{"older end marker", [][]byte{{}, end, {}}, Replayed{Seq: EndSeq}, true},
		{"older release through a REQ", [][]byte{seq, {0x93}}, Replayed{Seq: 7, Payload: []byte{0x93}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, isEnd, err := ParseReplayReply(tt.frames)
			if err != nil {
				t.Fatal(err)
			}
			if isEnd != tt.end || got.Topic != tt.want.Topic || got.Seq != tt.want.Seq || !bytes.Equal(got.Payload, tt.want.Payload) {
				t.Errorf("got %+v end=%v, want %+v end=%v", got, isEnd, tt.want, tt.end)
			}
		})
	}
}
