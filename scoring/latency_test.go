package scoring

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestDefaultCostKnobs(t *testing.T) {
	// 160-token prompt in 16-token blocks: 10 prompt blocks, 10 own blocks.
	tests := []struct {
		name        string
		change      func(*Options)
		load        Load
		wantPrefill float64
		wantLogit   float64
	}{
		{"credit 1 takes cached blocks off", nil, Load{MatchedBlocks: 4}, 6, 16},
		{"credit 2 also eats the backlog", func(o *Options) { o.OverlapCredit = 2 }, Load{MatchedBlocks: 4, PrefillBacklog: 64}, 6, 16},
		{"credit never drives prefill negative", func(o *Options) { o.OverlapCredit = 5 }, Load{MatchedBlocks: 4}, 0, 10},
		{"scale weighs prefill", func(o *Options) { o.PrefillLoadScale = 4 }, Load{MatchedBlocks: 4}, 6, 34},
		{"host blocks count three quarters", nil, Load{MatchedBlocks: 2, HostBlocks: 4}, 5, 15},
		{"disk blocks count a quarter", nil, Load{DiskBlocks: 8}, 8, 18},
		{"active requests add block-equivalents", func(o *Options) { o.DecodeActiveRequestWeight = 16 }, Load{ActiveRequests: 2}, 10, 52},
		{"deprecated weight maps to scale with credit 1", func(o *Options) { o.OverlapWeight = 3; o.OverlapCredit = 7 }, Load{MatchedBlocks: 4}, 6, 28},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			if tt.change != nil {
				tt.change(&o)
			}
			m := costOf[*dynamoCost](o, CostDefault)
			l := tt.load
			l.BlockSize = 16
			got := m.termsOf(&Request{PromptTokens: 160}, &l)
			if got.prefill != tt.wantPrefill || got.logit != tt.wantLogit {
				t.Errorf("prefill %g logit %g, want %g %g", got.prefill, got.logit, tt.wantPrefill, tt.wantLogit)
			}
		})
	}
}

func TestLatencyCostTerms(t *testing.T) {
	o := DefaultOptions()
	o.CostModel = CostLatency
	o.DecodeSlowdownWeight = 0.5
	o.DecodeActiveRequestWeight = 0
	m := costOf[*latencyCost](o, CostLatency)
	o.DecodeActiveRequestWeight = 8
	perRequest := costOf[*latencyCost](o, CostLatency)
	base := Load{BlockSize: 16, KVTotalBlocks: 1000, PrefillRate: 1000, PrefillOverhead: 0.02}
	tests := []struct {
		name string
		load func(*Load)
		want latencyTerms
	}{
		{"idle, nothing cached", func(*Load) {}, latencyTerms{ttft: 0.02 + 0.16}},
		{"cached blocks are not computed", func(l *Load) { l.MatchedBlocks = 5 }, latencyTerms{ttft: 0.02 + 0.08}},
		{"backlog waits first", func(l *Load) { l.PrefillBacklog = 500 }, latencyTerms{ttft: 0.02 + 0.66}},
		{"a prompt no one holds costs a busy worker no slowdown", func(l *Load) { l.ActiveRequests, l.PrefillRequests = 3, 1 }, latencyTerms{ttft: 0.18}},
		{"a busy worker recomputing blocks held elsewhere stalls each stream", func(l *Load) { l.ActiveRequests, l.PrefillRequests = 3, 1 },
			latencyTerms{ttft: 0.18, slowdown: 0.5 * 3 * 0.16, duplicate: 0.75 * 0.16}},
		{"a full cache preempts", func(l *Load) { l.ActiveBlocks = 995 }, latencyTerms{ttft: 0.18 + DefaultDecodeKVCost*995*16, memory: 5 * 16 / 1000.0}},
		{"blocks held elsewhere cost again", func(*Load) {}, latencyTerms{ttft: 0.18, duplicate: 0.75 * 0.16}},
		{"what it holds itself is no duplicate", func(l *Load) { l.MatchedBlocks = 10 }, latencyTerms{ttft: 0.02}},
	}
	t.Run("active requests cost their block-equivalents", func(t *testing.T) {
		l := base
		l.ActiveRequests, l.PrefillRequests = 3, 3 // none decoding yet
		got := perRequest.termsOf(&Request{PromptTokens: 160}, &l, fleetView{})
		if want := 3 * 8 * 16 / 1000.0; math.Abs(got.slowdown-want) > 1e-9 {
			t.Fatalf("slowdown %g, want %g (3 requests × 8 blocks × 16 tokens at 1,000 tokens/s)", got.slowdown, want)
		}
	})
	t.Run("every pass decodes the running requests' context", func(t *testing.T) {
		l := base
		l.MaxNumBatchedTokens, l.ActiveBlocks, l.PrefillBacklog = 1024, 500, 600
		got := m.termsOf(&Request{PromptTokens: 2000}, &l, fleetView{})
		// 600 + 2,000 tokens ahead of the first token: 3 passes of 1,024,
		// each reading 500 blocks × 16 tokens.
		if want := DefaultDecodeKVCost * 3 * 500 * 16; math.Abs(got.decodeKV-want) > 1e-12 || math.Abs(got.ttft-(0.02+2.6+want)) > 1e-9 {
			t.Fatalf("terms %+v, want decode kv %g inside ttft", got, want)
		}
	})
	t.Run("a long prompt goes where less context is running, a short one does not care", func(t *testing.T) {
		o := DefaultOptions()
		o.DecodeKVCost = 1e-6
		c := costOf[*latencyCost](o, CostLatency)
		busy, queued := base, base
		busy.MaxNumBatchedTokens, queued.MaxNumBatchedTokens = 1024, 1024
		busy.ActiveBlocks = 900     // 14,400 running KV tokens, nothing queued
		queued.PrefillBacklog = 100 // 0.1 s of prefill queued, nothing running
		long, short := &Request{PromptTokens: 16000}, &Request{PromptTokens: 500}
		if b, q := c.termsOf(long, &busy, fleetView{}).logit, c.termsOf(long, &queued, fleetView{}).logit; !(q < b) {
			t.Fatalf("16k-token prompt: running context costs %g, a queue %g: want the queue", b, q)
		}
		if b, q := c.termsOf(short, &busy, fleetView{}).logit, c.termsOf(short, &queued, fleetView{}).logit; !(b < q) {
			t.Fatalf("500-token prompt: running context costs %g, a queue %g: want the running context", b, q)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := base
			tt.load(&l)
			held := 0 // another candidate's prefix, for the duplicate cases
			if strings.Contains(tt.name, "elsewhere") || strings.Contains(tt.name, "itself") {
				held = 160
			}
			got := m.termsOf(&Request{PromptTokens: 160}, &l, fleetView{held: held})
			tt.want.logit = tt.want.ttft + tt.want.slowdown + tt.want.memory + tt.want.duplicate
			for _, p := range [][2]float64{{got.ttft, tt.want.ttft}, {got.slowdown, tt.want.slowdown}, {got.memory, tt.want.memory},
				{got.duplicate, tt.want.duplicate}, {got.logit, tt.want.logit}} {
				if math.Abs(p[0]-p[1]) > 1e-9 {
					t.Fatalf("terms %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

// TestSessionStickiness pins the decision a follow-up turn faces: its home
// worker holds its 2,000-token history, another worker is idle. A home
// that is slightly busier keeps the session; a saturated home loses it.
func TestSessionStickiness(t *testing.T) {
	const prompt = 2048 // 128 blocks of 16, 125 of them cached at home
	for name, knobs := range map[string]func(*Options){
		"shipped defaults": func(*Options) {},
		"default cost with credit 2, scale 4": func(o *Options) {
			o.CostModel, o.OverlapCredit, o.PrefillLoadScale = CostDefault, 2, 4
		},
	} {
		for _, tt := range []struct {
			name     string
			busyReqs int // requests of 1,024 uncached tokens already on home
			want     string
		}{
			{"slightly busier home stays home", 1, "w0"},
			{"saturated home moves", 40, "w1"},
		} {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				clock := newFakeClock()
				o := testOptions(clock, 1)
				knobs(&o)
				r := newTestScheduler(t, o, 2)
				for i := range tt.busyReqs {
					req := &Request{ID: fmt.Sprint("busy", i), PromptTokens: 1024, Hashes: hashes(9, 0, 64, i)}
					if err := r.Pool().Add(req, "w0", 0); err != nil {
						t.Fatal(err)
					}
				}
				cands := r.Pool().AppendCandidates(nil, "m")
				cands[0].MatchedBlocks, cands[0].CachedBlocks = 125, 125
				d, err := r.Pick(&Request{ID: "turn", PromptTokens: prompt, ExpectedOutputTokens: 100}, cands, nil)
				if err != nil {
					t.Fatal(err)
				}
				if d.Worker != tt.want {
					t.Errorf("picked %s, want %s", d.Worker, tt.want)
				}
			})
		}
	}
}

func TestPrefillBacklogDrainsAtTheLearnedRate(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.PrefillRate = 1000 // tokens per second
	o.PrefillOverhead = 500 * time.Millisecond
	o.PrefillContextCost = 0
	o.NoLearnRates = true
	r := newTestScheduler(t, o, 1)
	p := r.Pool()
	add := func(id string, tokens int) {
		t.Helper()
		if err := p.Add(&Request{ID: id, PromptTokens: tokens}, "w0", 0); err != nil {
			t.Fatal(err)
		}
	}
	add("a", 2000)
	add("b", 1000)
	if got := mustLoad(t, p, "w0").PrefillBacklog; got != 3000 {
		t.Fatalf("backlog at dispatch %g, want 3000", got)
	}
	// The model predicts the backlog's first token after 0.5 s of
	// overhead and 3 s of tokens: half of it is left after 1.75 s.
	clock.Advance(1750 * time.Millisecond)
	if got := mustLoad(t, p, "w0").PrefillBacklog; math.Abs(got-1500) > 1e-6 {
		t.Fatalf("backlog after 1.75 s %g, want 1500", got)
	}
	// b's first token: only a's work is pending, and a was due already.
	p.PrefillDone("b")
	if got := mustLoad(t, p, "w0").PrefillBacklog; got != 1500 {
		t.Fatalf("backlog after b's first token %g, want 1500 (min of model and pending)", got)
	}
	clock.Advance(10 * time.Second)
	if got := mustLoad(t, p, "w0").PrefillBacklog; got != 0 {
		t.Fatalf("backlog never below 0: %g", got)
	}
	if l := mustLoad(t, p, "w0"); l.PrefillTokens != 2000 {
		t.Fatalf("prefill tokens in flight %d, want 2000 (a has no first token yet)", l.PrefillTokens)
	}

	o.NoPrefillDecay = true
	r2 := newTestScheduler(t, o, 1)
	if err := r2.Pool().Add(&Request{ID: "a", PromptTokens: 2000}, "w0", 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if got := mustLoad(t, r2.Pool(), "w0").PrefillBacklog; got != 2000 {
		t.Fatalf("without decay the backlog is charged whole: %g", got)
	}
}

// TestRatesAreLearnedFromFirstTokens feeds a worker whose first tokens
// come exactly at overhead + tokens ÷ rate and checks the fit finds both.
func TestRatesAreLearnedFromFirstTokens(t *testing.T) {
	const trueRate, trueOverhead = 45000.0, 0.030
	clock := newFakeClock()
	o := testOptions(clock, 1)
	r := newTestScheduler(t, o, 1)
	p := r.Pool()
	for i := range 400 {
		tokens := 500 + (i*7919)%12000
		id := fmt.Sprint("r", i)
		if err := p.Add(&Request{ID: id, PromptTokens: tokens}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Duration((trueOverhead + float64(tokens)/trueRate) * float64(time.Second)))
		p.PrefillDone(id)
		p.Free(id)
	}
	f := p.Fits()[0]
	if math.Abs(f.PrefillRate/trueRate-1) > 0.02 || math.Abs(f.OverheadSeconds/trueOverhead-1) > 0.05 {
		t.Fatalf("fit %+v, want rate %g overhead %g", f, trueRate, trueOverhead)
	}
	l := mustLoad(t, p, "w0")
	if l.PrefillRate != f.PrefillRate || l.FitSamples != 400 {
		t.Fatalf("load shows rate %g from %d samples, want the fit's", l.PrefillRate, l.FitSamples)
	}
}

// TestDecodeKVIsNotLearnedAsPrefill: first tokens come at overhead +
// tokens ÷ rate + the decode steps beside the prefill, which read the KV
// of a request that keeps running on the worker. The fit takes the decode
// steps' share off as Options.DecodeKVCost prices it and learns the
// prefill's own rate.
func TestDecodeKVIsNotLearnedAsPrefill(t *testing.T) {
	const trueRate, trueOverhead, kvCost = 45000.0, 0.030, 2e-6
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.DecodeKVCost = kvCost
	r := newTestScheduler(t, o, 1)
	p := r.Pool()
	for i := range 400 {
		resident := 16 * (i * 104729 % 500) // up to 8,000 tokens running beside
		rid := fmt.Sprint("resident", i)
		if err := p.Add(&Request{ID: rid, PromptTokens: resident}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		p.PrefillDone(rid)
		tokens := 500 + (i*7919)%3500
		id := fmt.Sprint("r", i)
		if err := p.Add(&Request{ID: id, PromptTokens: tokens}, "w0", 0); err != nil {
			t.Fatal(err)
		}
		passes := math.Ceil(float64(tokens) / 1024)
		clock.Advance(time.Duration((trueOverhead + float64(tokens)/trueRate + kvCost*passes*float64(resident)) * float64(time.Second)))
		p.PrefillDone(id)
		p.Free(id)
		p.Free(rid)
	}
	f := p.Fits()[0]
	if math.Abs(f.PrefillRate/trueRate-1) > 0.02 || math.Abs(f.OverheadSeconds/trueOverhead-1) > 0.05 {
		t.Fatalf("fit %+v, want rate %g overhead %g", f, trueRate, trueOverhead)
	}
}

func TestRateFitIgnoresNonsense(t *testing.T) {
	f := newRateFit(20000, 25*time.Millisecond, DefaultPrefillContextCost)
	for _, xy := range [][2]float64{{-1, 1}, {100, 0}, {math.NaN(), 1}, {math.Inf(1), 1}, {100, math.Inf(1)}} {
		f.add(xy[0], 0, 0, xy[1])
	}
	if f.samples != 0 || f.rate != 20000 {
		t.Fatalf("nonsense was learned: %+v", f)
	}
	// Samples that say "infinitely slow" clamp at a twentieth of the prior.
	for range 1000 {
		f.add(10000, 0, 0, 1e6)
		f.add(0, 0, 0, 1)
	}
	if f.rate < 1000 || f.rate > 400000 {
		t.Fatalf("rate %g escaped the clamp", f.rate)
	}
}

func TestSubmitQueuesWithoutBlocking(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.QueueThreshold = 1
	o.QueueMaxWait = time.Second
	r := newTestScheduler(t, o, 1)
	type outcome struct {
		d   Decision
		err error
	}
	var got []outcome
	submit := func(id string) {
		r.Submit(&Request{ID: id, Model: "m", PromptTokens: 2048}, r.Pool().AppendCandidates(nil, "m"), nil,
			func(d Decision, err error) { got = append(got, outcome{d, err}) })
	}
	submit("a") // admitted: 2,048 tokens in prefill > 1 × 1,024
	submit("b") // queued
	submit("c") // queued
	if len(got) != 1 || got[0].err != nil || r.QueueLen() != 2 {
		t.Fatalf("after three submits: %d outcomes %v, queue %d; want a admitted and two waiting", len(got), got, r.QueueLen())
	}
	r.Pool().PrefillDone("a") // room: b is admitted from inside the lifecycle call
	if len(got) != 2 || got[1].err != nil || got[1].d.Worker != "w0" {
		t.Fatalf("after a's first token: %v", got)
	}
	clock.Advance(600 * time.Millisecond)
	submit("d") // queued behind c, younger
	clock.Advance(600 * time.Millisecond)
	if n := r.ShedExpired(); n != 1 {
		t.Fatalf("ShedExpired shed %d, want 1 (c waited past the max wait, d did not)", n)
	}
	var shed *ShedError
	if len(got) != 3 || !errors.As(got[2].err, &shed) || shed.Reason != ShedMaxWait {
		t.Fatalf("c's outcome %v, want a max-wait shed", got)
	}
	if r.QueueLen() != 1 {
		t.Fatalf("queue %d after shedding, want d still waiting", r.QueueLen())
	}
	r.Pool().PrefillDone("b") // room again: d, kept in line, is admitted
	if len(got) != 4 || got[3].err != nil || r.QueueLen() != 0 {
		t.Fatalf("after b's first token: %v, queue %d; want d admitted", got, r.QueueLen())
	}
}
