package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/server"
)

// postThroughGateway sends a non-streaming chat with the given request id
// and returns the response headers and the worker the body names.
func postThroughGateway(t *testing.T, s *system, id string) (http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 4, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": longText("request log", 10)}},
	})
	req, err := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-request-id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("gateway answered %s: %s", resp.Status, b)
	}
	worker := bench.WorkerFromID(b) // kvsim names itself in the completion id
	if worker == "" {
		t.Fatalf("response names no worker: %s", b)
	}
	return resp.Header, worker
}

// The worker header reaches the client only when asked for, and
// /debug/requests finds the request by its x-request-id with the same
// worker, an explanation and the outcome.
func TestResponseWorkerHeaderAndRequestLogThroughEnvoy(t *testing.T) {
	for _, on := range []bool{false, true} {
		name := "header_off"
		if on {
			name = "header_on"
		}
		t.Run(name, func(t *testing.T) {
			s := start(t, options{workers: 2, router: func(c *server.Config) { c.Stream.ResponseWorkerHeader = on }})
			id := "e2e-request-" + name
			h, worker := postThroughGateway(t, s, id)
			got := h.Get("x-kvroute-worker")
			switch {
			case on && got != worker:
				t.Errorf("x-kvroute-worker %q, want the serving worker %q", got, worker)
			case !on && got != "":
				t.Errorf("x-kvroute-worker %q present with the flag off", got)
			}

			var rec struct {
				ID          string `json:"id"`
				Worker      string `json:"worker"`
				Explanation struct {
					Chosen string   `json:"chosen"`
					Lines  []string `json:"lines"`
				} `json:"explanation"`
				Outcome *struct {
					Status     int     `json:"status"`
					Result     string  `json:"result"`
					DurationMs float64 `json:"duration_ms"`
				} `json:"outcome"`
			}
			// The outcome lands when Envoy closes the ext_proc stream, which
			// may be a moment after the client has its response.
			t.Cleanup(func() {
				if t.Failed() {
					if resp, err := http.Get(s.AdminURL() + "/debug/requests?limit=3"); err == nil {
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						t.Logf("/debug/requests?limit=3: %s", b)
					}
				}
			})
			eventually(t, "/debug/requests to hold the finished request", func() bool {
				resp, err := http.Get(s.AdminURL() + "/debug/requests?id=" + url.QueryEscape(id))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if resp.StatusCode != 200 {
					return false
				}
				if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
					t.Fatal(err)
				}
				return rec.Outcome != nil
			})
			if rec.ID != id || rec.Worker != worker || rec.Explanation.Chosen != worker || len(rec.Explanation.Lines) != 2 {
				t.Errorf("logged %+v, want id %q, worker %q chosen among 2 candidates", rec, id, worker)
			}
			if o := rec.Outcome; o.Status != 200 || o.Result != "ok" || o.DurationMs <= 0 {
				t.Errorf("outcome %+v, want 200 ok with a duration", *o)
			}
			// Once the request is over, /debug/workers shows nothing
			// running, whatever the last load report said.
			eventually(t, "/debug/workers to show no request running", func() bool {
				resp, err := http.Get(s.AdminURL() + "/debug/workers")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var v struct {
					Workers []struct {
						Running int `json:"running"`
					} `json:"workers"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
					t.Fatal(err)
				}
				for _, w := range v.Workers {
					if w.Running != 0 {
						return false
					}
				}
				return len(v.Workers) == 2
			})
		})
	}
}
