package e2e

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/fleet"
)

// kvroute ends a request's prefill, for the load model and the learned
// prefill rate, when the worker produced its first token, whatever Envoy
// shows it of the response. kvsim, like vLLM, starts a streamed answer's
// headers at once and sends its first event with the first token, and
// publishes each engine step's KV events as the step ends. With
// --response-path streamed the first body chunk or the worker's
// BlockStored for the prompt's last block ends it, whichever comes first;
// with headers the BlockStored, never the response headers.
//
// The worker's first request, before its events have shown it stores
// blocks, is left out (its prefill ends at its response headers, untimed).
// Each request's prefill end in the router (the pool's PrefillDone event)
// is compared with the moment the worker wrote the first token (its
// kvsim_t stamp): within 10 ms plus 10 % of the time to that token.
func TestPrefillEndsAtTheFirstToken(t *testing.T) {
	const requests = 6
	predicted := map[string]float64{} // the learned model's time for a 3,000-token prompt, s
	for _, path := range []string{envoy.ResponsePathStreamed, envoy.ResponsePathHeaders, envoy.ResponsePathObserved} {
		t.Run(path, func(t *testing.T) {
			s := start(t, options{workers: 1, speedup: 1, responsePath: path})
			// A worker's requests wait for its events once they have shown it
			// stores blocks: the first request's prefill ends at its headers.
			s.send(t, chat(longText("warm-up "+path, 20), "q"))
			eventually(t, "the warm-up's blocks in the index", func() bool { return s.Router.Index().Stats().Blocks > 0 })
			pool := s.Router.Picker().Scheduler().Pool()
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
			samples := func() int {
				n := 0
				for _, f := range pool.Fits() {
					n += f.Samples
				}
				return n
			}
			before := samples()
			var worst float64
			for i := range requests {
				r := s.send(t, chat(longText(fmt.Sprintf("first token %s %d", path, i), 60+30*i), "q"))
				if r.FirstEmit.IsZero() {
					t.Fatalf("request %d: the first token carried no kvsim_t stamp", i)
				}
				var add, end time.Time
				eventually(t, "the request's prefill to end in the router", func() bool {
					mu.Lock()
					defer mu.Unlock()
					if len(added) != i+1 {
						return false
					}
					for id, at := range added {
						if d, ok := done[id]; ok && at.After(r.Start) {
							add, end = at, d
							return true
						}
					}
					return false
				})
				prefill := r.FirstEmit.Sub(add)
				off := end.Sub(r.FirstEmit)
				t.Logf("request %d: %d prompt tokens, first token %.1f ms after dispatch; router's prefill end %+.1f ms from it",
					i, r.PromptTokens, ms(prefill), ms(off))
				if tol := 10*time.Millisecond + prefill/10; off > tol || off < -tol {
					t.Errorf("request %d: the router ended its prefill %+.1f ms from the first token (tolerance ±%.1f ms)", i, ms(off), ms(tol))
				}
				worst = math.Max(worst, math.Abs(ms(off)))
			}
			t.Logf("worst offset %.1f ms", worst)
			if got := samples() - before; got != requests {
				t.Errorf("the rate fit learned from %d requests, want %d", got, requests)
			}
			f := pool.Fits()[0]
			predicted[path] = f.OverheadSeconds + 3000/f.PrefillRate + f.ContextSeconds*3000*3000/2
			t.Logf("learned model (with its prior): %.0f tokens/s, overhead %.1f ms, context %.3g s; 3,000 uncached tokens: %.1f ms",
				f.PrefillRate, 1e3*f.OverheadSeconds, f.ContextSeconds, 1e3*predicted[path])
			if path != envoy.ResponsePathStreamed {
				if got := s.metric(t, "kvroute_first_tokens_total", `signal="kv_event"`); got != requests {
					t.Errorf("%v prefills ended by the KV event, want %d", got, requests)
				}
			}
		})
	}
	for _, path := range []string{envoy.ResponsePathHeaders, envoy.ResponsePathObserved} {
		if a, b := predicted[envoy.ResponsePathStreamed], predicted[path]; a > 0 && b > 0 && math.Abs(b/a-1) > 0.15 {
			t.Errorf("learned time for 3,000 tokens: %.1f ms with %s, %.1f ms streamed; want within 15 %%", 1e3*b, path, 1e3*a)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
