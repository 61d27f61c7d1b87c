//go:build vllm

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/testenv"
)

// TestVLLMFirstToken: behind the real Envoy, kvroute ends a request's
// prefill when vLLM (CPU build) produced its first token, with every
// response path: vLLM's OpenAI server sends a streamed answer's headers
// before its first token, so with --response-path headers or observed (the
// default) the end comes from vLLM's BlockStored for the prompt's last block (published with the
// step that sampled the token), not from the headers. Each request's
// prefill end in the router is compared with the client's first body byte
// (the first token, through Envoy): within 10 ms plus 10 % of the time to
// it.
func TestVLLMFirstToken(t *testing.T) {
	py := os.Getenv("KVROUTE_VLLM_PYTHON")
	if py == "" || os.Getenv("KVROUTE_ENVOY") == "" {
		t.Fatal("KVROUTE_VLLM_PYTHON and KVROUTE_ENVOY must be set: run `make test-vllm`")
	}
	testenv.Quiet()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	engines := startVLLMs(t, ctx, py, tinyModel(t, py), vllmSpec{"vllm0", "127.0.0.43", 0})
	rt := startZMQLayout(t, ctx, engines)
	defer rt.stop()
	waitFor(t, ctx, "the engine's KV events in the index", func() bool {
		directChat(t, ctx, engines[0], fmt.Sprintf("wake-up %d", time.Now().UnixNano()))
		return len(workersWithBlocks(rt.r)) == 1
	})
	pool := rt.r.Picker().Scheduler().Pool()
	var mu sync.Mutex
	added, done := map[string]time.Time{}, map[string]time.Time{}
	pool.SetSink(func(ev fleet.SyncEvent) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		switch ev.Op {
		case fleet.OpAdd:
			added[ev.ID] = now
		case fleet.OpPrefillDone:
			if _, ok := done[ev.ID]; !ok {
				done[ev.ID] = now
			}
		}
	})
	const requests = 6
	rnd := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her she there one all we their has been if more when will would who so no time out up do about into than its some could them other only new these may first any like then people now over also after most made many")
	for _, path := range []string{envoy.ResponsePathStreamed, envoy.ResponsePathHeaders, envoy.ResponsePathObserved} {
		px, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, ResponsePath: path,
			Workers: []envoy.Worker{{Cluster: engines[0].id, Address: engines[0].addr()}}, ExtProcAddr: rt.r.GRPCAddr(), Edit: echoRouting})
		if err != nil {
			t.Fatal(err)
		}
		kvEvents := rt.metricValue(t, `kvroute_first_tokens_total{signal="kv_event"}`)
		for i := range requests {
			var prompt strings.Builder
			for range 700 + 20*i {
				prompt.WriteString(words[rnd.IntN(len(words))] + " ")
			}
			mu.Lock()
			n := len(added)
			mu.Unlock()
			start, headers, first := streamChat(t, ctx, px.URL(), prompt.String())
			var add, end time.Time
			waitFor(t, ctx, "the request's prefill end in the router", func() bool {
				mu.Lock()
				defer mu.Unlock()
				for id, at := range added {
					if d, ok := done[id]; ok && at.After(start) && len(added) == n+1 {
						add, end = at, d
						return true
					}
				}
				return false
			})
			prefill, off := first.Sub(add), end.Sub(first)
			t.Logf("%s %d: response headers %.1f ms, first token %.1f ms after dispatch; router's prefill end %+.1f ms from the first token",
				path, i, ms(headers.Sub(add)), ms(prefill), ms(off))
			if tol := 10*time.Millisecond + prefill/10; off > tol || off < -tol {
				t.Errorf("%s %d: the router ended the prefill %+.1f ms from the first token (tolerance ±%.1f ms)", path, i, ms(off), ms(tol))
			}
		}
		if got := rt.metricValue(t, `kvroute_first_tokens_total{signal="kv_event"}`) - kvEvents; path != envoy.ResponsePathStreamed && got != requests {
			t.Errorf("%s: %v prefills ended by the KV event, want %d", path, got, requests)
		}
		_ = px.Close()
	}
	for _, f := range pool.Fits() {
		t.Logf("learned model (with its prior) of %s: %.0f tokens/s, overhead %.1f ms, %d samples", f.Worker, f.PrefillRate, 1e3*f.OverheadSeconds, f.Samples)
	}
}

// streamChat sends one streamed chat through url and returns when it was
// sent, when its response headers came and when its first body byte did.
func streamChat(t *testing.T, ctx context.Context, url, content string) (start, headers, first time.Time) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 4, "ignore_eos": true,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start = time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	headers = time.Now()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.Peek(1); err != nil {
		t.Fatal(err)
	}
	first = time.Now()
	for {
		if _, err := r.ReadString('\n'); err != nil {
			break
		}
	}
	return start, headers, first
}
