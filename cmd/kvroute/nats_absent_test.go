package main

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/server"
)

// A router whose NATS server is unreachable at start serves anyway: ready
// within seconds, routing by load, "nats" degraded. Before, it exited with
// "no servers available", so a router restarted during a NATS outage
// crash-looped.
func TestServeStartsWithoutNATS(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"no kv events, scraped load", []string{"--kv-events=false", "--engine-load", "scrape"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs testenv.SyncBuffer
			begin := time.Now()
			r, err := serveWith(t, &logs, append([]string{"--nats-url", "nats://127.0.0.1:1"}, tt.args...)...)
			if err != nil {
				t.Fatalf("start: %v\n%s", err, logs.String())
			}
			for !r.Ready() {
				if time.Since(begin) > 5*time.Second {
					t.Fatalf("not ready 5 s after the start: %s", r.NotReadyReason())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got := r.Degraded(); len(got) != 1 || got[0] != "nats" {
				t.Errorf("Degraded() = %v, want [nats]", got)
			}
			routes(t, r)
		})
	}
}

// routes asks r for a worker as Envoy would for a chat request.
func routes(t *testing.T, r *server.Server) {
	t.Helper()
	req := &extproc.Request{Path: "/v1/chat/completions", HasBody: true, Headers: map[string]string{},
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)}
	d, err := r.Picker().Decide(context.Background(), req)
	if err != nil {
		t.Fatalf("no decision: %v", err)
	}
	if d.Cluster != "w0" {
		t.Fatalf("routed to %q, want w0", d.Cluster)
	}
	d.Ticket.Free(extproc.OutcomeOK)
}
