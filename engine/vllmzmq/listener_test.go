package vllmzmq

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestListenerReceivesFromEveryConnectedPublisher(t *testing.T) {
	l, err := Listen(context.Background(), ListenerConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv@", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	topics := []string{"kv@10.0.0.1@m", "kv@10.0.0.2:8000@m"}
	pubs := make([]*Publisher, len(topics))
	for i, topic := range topics {
		pubs[i] = startPublisher(t, PublisherConfig{Endpoint: l.Endpoint(), Mode: Connect, Topic: topic})
	}
	// A publisher whose topic the filter refuses never reaches Recv.
	other := startPublisher(t, PublisherConfig{Endpoint: l.Endpoint(), Mode: Connect, Topic: "other"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := map[string]bool{}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	got := make(chan Event, 64)
	go func() {
		for {
			ev, err := l.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			got <- ev
		}
	}()
	for len(seen) < len(topics) {
		select {
		case ev := <-got:
			if !strings.HasPrefix(ev.Topic, "kv@") {
				t.Fatalf("received topic %q past the filter", ev.Topic)
			}
			seen[ev.Topic] = true
		case <-tick.C:
			for _, p := range append(pubs, other) {
				if _, err := p.Publish([]byte("batch")); err != nil {
					t.Fatal(err)
				}
			}
		case <-ctx.Done():
			t.Fatalf("saw only %v", seen)
		}
	}
}

func TestListenerReportsABusyAddress(t *testing.T) {
	l, err := Listen(context.Background(), ListenerConfig{Endpoint: "tcp://127.0.0.1:0", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Listen(context.Background(), ListenerConfig{Endpoint: l.Endpoint(), Logger: quietLogger()}); err == nil {
		t.Fatalf("second Listen on %s succeeded", l.Endpoint())
	}
}

func TestListenerCloseReturns(t *testing.T) {
	l, err := Listen(context.Background(), ListenerConfig{Endpoint: "tcp://127.0.0.1:0", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := l.Recv(context.Background()); err == nil {
		t.Fatal("Recv after Close returned no error")
	}
	if _, err := l.Replay(context.Background(), 0); !errors.Is(err, ErrNoReplay) {
		t.Fatalf("Replay without endpoint: %v, want ErrNoReplay", err)
	}
}
