package scoring

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// benchRouter returns a router over n workers, each carrying some load,
// and candidates where a quarter of the workers hold part of the prompt.
func benchRouter(b *testing.B, n int, change func(*Options)) (*Scheduler, []Candidate) {
	b.Helper()
	o := testOptions(newFakeClock(), 1)
	o.Now = nil // the real clock, as in production
	change(&o)
	r := newTestScheduler(b, o, n)
	cs := r.Pool().AppendCandidates(nil, "m")
	for i := range cs {
		req := &Request{ID: fmt.Sprint("bg", i), PromptTokens: 512 + 16*(i%7), Hashes: hashes(uint64(i), 32, i%5, i)}
		if err := r.Pool().Add(req, cs[i].Worker, 0); err != nil {
			b.Fatal(err)
		}
		if i%4 == 0 {
			cs[i].MatchedBlocks, cs[i].CachedBlocks = 8+i%64, 1000+i
		}
	}
	return r, cs
}

// BenchmarkPick measures one routing decision (no state change) over 8,
// 64, 512 and 1,000 workers: targets 2, 10, 80 and 160 µs.
func BenchmarkPick(b *testing.B) {
	for _, mode := range []struct {
		name   string
		change func(*Options)
	}{
		{"kv", func(*Options) {}},
		{"kv_T0.5", func(o *Options) { o.Temperature = 0.5 }},
		{"kv_weighted", func(o *Options) { o.CostModel = CostWeighted }},
		{"least_loaded", func(o *Options) { o.Mode = ModeLeastLoaded }},
	} {
		for _, n := range []int{8, 64, 512, 1000} {
			b.Run(fmt.Sprintf("%s/workers=%d", mode.name, n), func(b *testing.B) {
				r, cs := benchRouter(b, n, mode.change)
				req := &Request{ID: "r", Model: "m", PromptTokens: 2048}
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if _, err := r.Pick(req, cs, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/pick")
			})
		}
	}
}

// BenchmarkPickExplained is Pick with the explanation filled in, the
// debug path.
func BenchmarkPickExplained(b *testing.B) {
	r, cs := benchRouter(b, 64, func(*Options) {})
	req := &Request{ID: "r", Model: "m", PromptTokens: 2048}
	exp := &Explanation{}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Pick(req, cs, exp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLifecycle measures the four lifecycle operations of one
// request (Add, PrefillDone, Progress, Free) with a 32-block prompt that
// shares 24 blocks with the worker's other requests; target ≥ 1 M ops/s.
// It runs with the defaults, so Add also records 28 pending blocks (see
// BenchmarkPendingOverlay for the lifecycle with the overlay off).
func BenchmarkLifecycle(b *testing.B) {
	r, _ := benchRouter(b, 64, func(*Options) {})
	benchLifecycle(b, r.Pool(), true)
	b.ReportMetric(4*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mops/s")
}

// BenchmarkLifecycleFromEvents is BenchmarkLifecycle with the first token
// from the worker's KV events: Add (the request waits for its last prompt
// block), BlocksStored of the prompt's 8 new blocks (which ends the
// prefill), AfterApply, Free.
func BenchmarkLifecycleFromEvents(b *testing.B) {
	r, _ := benchRouter(b, 64, func(*Options) {})
	p := r.Pool()
	const live = 1 << 14
	reqs := make([]*Request, live)
	for i := range reqs {
		reqs[i] = &Request{ID: fmt.Sprint("req", i), Model: "m", PromptTokens: 32*16 + 5,
			Hashes: append(hashes(99, 24, 0, 0), hashes(0, 0, 8, i)...)}
	}
	workers := p.AppendCandidates(nil, "m")
	for _, c := range workers {
		p.BlocksStored(c.Worker, []uint64{1})
	}
	inPrefill := mustLoad(b, p, workers[0].Worker).PrefillRequests // the background's
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		req := reqs[i%live]
		w := workers[i%len(workers)].Worker
		if err := p.Add(req, w, 4); err != nil {
			b.Fatal(err)
		}
		p.BlocksStored(w, req.Hashes[24:])
		p.AfterApply()
		p.Free(req.ID)
		i++
	}
	if mustLoad(b, p, workers[0].Worker).PrefillRequests != inPrefill {
		b.Fatal("a request's prefill outlived its KV event")
	}
}

// benchLifecycle runs Add, PrefillDone, Progress (when progress is set)
// and Free of one request per iteration, round-robin over p's workers.
func benchLifecycle(b *testing.B, p *Pool, progress bool) {
	// More distinct IDs than the tombstone ring holds, so an ID is
	// forgotten before it comes round again.
	const live = 1 << 14
	reqs := make([]*Request, live)
	for i := range reqs {
		reqs[i] = &Request{ID: fmt.Sprint("req", i), Model: "m", PromptTokens: 32*16 + 5,
			Hashes: append(hashes(99, 24, 0, 0), hashes(0, 0, 8, i)...)}
	}
	workers := p.AppendCandidates(nil, "m")
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		req := reqs[i%live]
		w := workers[i%len(workers)].Worker
		if err := p.Add(req, w, 4); err != nil {
			b.Fatal(err)
		}
		p.PrefillDone(req.ID)
		if progress {
			p.Progress(req.ID, 40)
		}
		p.Free(req.ID)
		i++
	}
}

// BenchmarkPickUnderChurn is the pool-side half of the InferencePool churn
// figure: one decision over 500 workers (candidates gathered from the pool
// each time, as the picker does), quiet and while workers are replaced at
// 50 per second (one removed, one added, every 20 ms). It isolates what
// churn costs Pick through the pool's locks from the CPU an API server and
// its informers take on a shared machine
// (discovery/kubepool's BenchmarkKubeAPIServerPickUnderChurn measures both).
func BenchmarkPickUnderChurn(b *testing.B) {
	const workers = 500
	r := newTestScheduler(b, DefaultOptions(), workers)
	req := &Request{ID: "r", Model: "m", PromptTokens: 2048}
	pick := func(b *testing.B) {
		var cs []Candidate
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			cs = r.Pool().AppendCandidates(cs[:0], "m")
			if _, err := r.Pick(req, cs, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/pick")
	}
	b.Run("quiet", pick)
	b.Run("churn=50/s", func(b *testing.B) {
		stop, done := make(chan struct{}), make(chan int)
		go func() {
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			oldest, next, n := 0, workers, 0
			for {
				select {
				case <-stop:
					done <- n
					return
				case <-t.C:
				}
				r.Pool().Remove(fmt.Sprintf("w%d", oldest))
				if err := r.Pool().Upsert(spec(fmt.Sprintf("w%d", next))); err != nil {
					panic(err)
				}
				oldest, next, n = oldest+1, next+1, n+1
			}
		}()
		pick(b)
		close(stop)
		b.ReportMetric(float64(<-done), "replaced")
	})
}

// BenchmarkPendingOverlay measures what the pending overlay adds to the
// hot path, against the same work with it off: a pick over 64 workers for
// a 128-block prompt that a quarter of them hold pending after their
// indexed prefix of 8–68 blocks; Add, PrefillDone and Free of a 32-block
// prompt (Add records the 28 blocks after the 4 indexed, Free after the
// first token keeps them); and an Add followed by the reconciliation of
// an event batch reporting its 32 blocks stored.
func BenchmarkPendingOverlay(b *testing.B) {
	for _, ttl := range []time.Duration{0, DefaultPendingTTL} {
		name := "on"
		if ttl == 0 {
			name = "off"
		}
		b.Run("pick/"+name, func(b *testing.B) {
			r, cs := benchRouter(b, 64, func(o *Options) { o.PendingTTL = ttl })
			prompt := hashes(77, 128, 0, 0)
			for i := range cs {
				if i%4 == 0 {
					req := &Request{ID: fmt.Sprint("p", i), PromptTokens: 128 * 16, Hashes: prompt}
					if err := r.Pool().addLocal(req, cs[i].Worker, 0, cs[i].MatchedBlocks); err != nil {
						b.Fatal(err)
					}
				}
			}
			req := &Request{ID: "r", Model: "m", PromptTokens: 128 * 16, Hashes: prompt}
			exp := &Explanation{}
			if _, err := r.Pick(req, cs, exp); err != nil {
				b.Fatal(err)
			}
			if credited := slices.ContainsFunc(exp.Workers, func(t Terms) bool { return t.PendingBlocks > 0 }); credited != (ttl > 0) {
				b.Fatalf("pending credit given: %v, overlay on: %v", credited, ttl > 0)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := r.Pick(req, cs, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("lifecycle/"+name, func(b *testing.B) {
			r, _ := benchRouter(b, 64, func(o *Options) { o.PendingTTL = ttl })
			benchLifecycle(b, r.Pool(), false)
		})
	}
	b.Run("reconcile", func(b *testing.B) {
		r, cs := benchRouter(b, 64, func(*Options) {})
		p := r.Pool()
		stored := hashes(5, 32, 0, 0)
		b.ReportAllocs()
		b.ResetTimer()
		i := 0
		for b.Loop() {
			w := cs[i%len(cs)].Worker
			if err := p.addLocal(&Request{ID: fmt.Sprint("x", i), PromptTokens: 32 * 16, Hashes: stored}, w, 0, 0); err != nil {
				b.Fatal(err)
			}
			p.BlocksStored(w, stored)
			i++
		}
	})
}
