package vllmzmq

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPublishToSubscriber measures batches per second from Publish to
// Subscriber.Recv over loopback TCP, with 1 KiB payloads (a BlockStored of
// a few blocks).
func BenchmarkPublishToSubscriber(b *testing.B) {
	p, err := NewPublisher(context.Background(), PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", Mode: Bind, ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events", Logger: quietLogger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: p.Endpoint(), Topic: "kv-events", Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Join: publish until one arrives, then note where the stream is.
	joined := make(chan uint64, 1)
	go func() {
		ev, err := s.Recv(ctx)
		if err == nil {
			joined <- ev.Seq
		}
	}()
	payload := make([]byte, 1024)
	for waiting := true; waiting; {
		if _, err := p.Publish(payload); err != nil {
			b.Fatal(err)
		}
		select {
		case <-joined:
			waiting = false
		case <-time.After(10 * time.Millisecond):
		}
	}
	last := p.NextSeq() - 1
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	go func() {
		for i := 0; i < b.N; i++ {
			if _, err := p.Publish(payload); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	want := last + uint64(b.N)
	for {
		ev, err := s.Recv(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if ev.Seq >= want {
			break
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "batches/s")
}
