package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/envoy/envoytest"
	"github.com/kvroute/kvroute/extproc"
)

// upstreamWorker is an HTTP model server stand-in that remembers what
// reached it.
type upstreamWorker struct {
	id   string
	srv  *httptest.Server
	mu   sync.Mutex
	hits []http.Header
	body []string
}

func newUpstreamWorker(t *testing.T, id string) *upstreamWorker {
	w := &upstreamWorker{id: id}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.hits = append(w.hits, r.Header.Clone())
		w.body = append(w.body, string(b))
		w.mu.Unlock()
		rw.Header().Set("content-type", "application/json")
		fmt.Fprintf(rw, `{"object":"chat.completion","served_by":%q}`, id)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *upstreamWorker) addr() string { return strings.TrimPrefix(w.srv.URL, "http://") }

func (w *upstreamWorker) seen() ([]http.Header, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]http.Header(nil), w.hits...), append([]string(nil), w.body...)
}

// TestShippedOriginalDstBootstrapReachesTheChosenWorker runs the shipped
// envoy/original-dst.yaml (FULL_DUPLEX_STREAMED, ORIGINAL_DST cluster by
// x-gateway-destination-endpoint) in envoytest.Gateway in front of a real
// router. Envoy's ORIGINAL_DST reads that header as one ip:port, so the
// bootstrap needs --fallbacks 0; with the protocol's default list the
// upstream lookup fails with 503, which is why the flag exists.
func TestShippedOriginalDstBootstrapReachesTheChosenWorker(t *testing.T) {
	workers := []*upstreamWorker{newUpstreamWorker(t, "w0"), newUpstreamWorker(t, "w1")}
	var recs []map[string]any
	for _, w := range workers {
		recs = append(recs, map[string]any{"id": w.id, "model": model, "address": w.addr(), "cluster": w.id,
			"block_size": 16, "kv_total_blocks": 4096, "max_num_batched_tokens": 8192})
	}
	data, _ := json.Marshal(recs)
	wf := filepath.Join(t.TempDir(), "workers.json")
	if err := os.WriteFile(wf, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		fallbacks  int
		wantStatus int
	}{
		{name: "fallbacks 0: the single ip:port reaches the chosen worker", fallbacks: 0, wantStatus: 200},
		{name: "fallbacks 2: a list is no upstream for ORIGINAL_DST", fallbacks: 2, wantStatus: 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.WorkersFile, cfg.Fallbacks, cfg.HTTPAddr, cfg.AdminAddr = wf, tt.fallbacks, "-", "-"
			r := start(t, cfg)
			eventually(t, "ready", r.Ready)
			gw, err := envoytest.LoadGatewayFile("../envoy/original-dst.yaml", envoytest.GatewayOptions{
				ListenAddress: "127.0.0.1:0",
				Endpoints:     map[string][]string{"kvroute": {r.GRPCAddr()}},
				Logger:        quiet(),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := gw.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer gw.Close()

			before := make([]int, len(workers))
			for i, w := range workers {
				h, _ := w.seen()
				before[i] = len(h)
			}
			body := chatBody(7)
			resp, err := http.Post(gw.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, out, tt.wantStatus)
			}
			var reached []string
			for i, w := range workers {
				hits, bodies := w.seen()
				for j := before[i]; j < len(hits); j++ {
					reached = append(reached, w.id)
					// The router's choice travels in the header ORIGINAL_DST
					// connected by: it must name this very worker.
					if got := hits[j].Get(extproc.DestinationHeader); got != w.addr() {
						t.Errorf("%s got %s %q, want its own address %s", w.id, extproc.DestinationHeader, got, w.addr())
					}
					// The bootstrap strips the cluster answer before the upstream.
					if got := hits[j].Get(extproc.DefaultTargetHeader); got != "" {
						t.Errorf("%s got %s %q; the bootstrap removes it", w.id, extproc.DefaultTargetHeader, got)
					}
					if bodies[j] != body {
						t.Errorf("%s got a body of %d bytes, want the client's %d", w.id, len(bodies[j]), len(body))
					}
				}
			}
			switch {
			case tt.wantStatus == 200 && len(reached) != 1:
				t.Fatalf("request reached %v, want exactly one worker", reached)
			case tt.wantStatus == 200 && !strings.Contains(string(out), reached[0]):
				t.Errorf("client got %s, not %s's answer", out, reached[0])
			case tt.wantStatus != 200 && len(reached) != 0:
				t.Errorf("a failed request reached %v", reached)
			}
		})
	}
}
