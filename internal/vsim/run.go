package vsim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/sim"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// Fleet sizes the simulated workers and the router's view of them.
type Fleet struct {
	// Workers is the number of engines; all serve Model.
	Workers int
	Model   string
	// Engine configures every engine (KV blocks, block size, batch limits).
	Engine sim.EngineConfig
	// EventLag is how long a KV event batch takes from the engine's step to
	// the router's index; ReportEvery is the load-report period.
	EventLag, ReportEvery time.Duration
	// Timing gives every engine step's duration; nil means sim.Polynomial.
	Timing sim.Timing
}

// timing is the fleet's timing, sim.Polynomial when none is set.
func (f Fleet) timing() sim.Timing {
	if f.Timing == nil {
		return sim.Polynomial{}
	}
	return f.Timing
}

// DefaultFleet is the reference fleet: 8 workers of 5,632 blocks
// of 64 tokens, events 5 ms late, load reports every 250 ms.
func DefaultFleet() Fleet {
	return Fleet{
		Workers: 8, Model: "sim",
		Engine:   sim.EngineConfig{NumGPUBlocks: 5632, BlockSize: 64},
		EventLag: 5 * time.Millisecond, ReportEvery: 250 * time.Millisecond,
	}
}

// Point is one mode at one load, in the sweep's JSON shape.
type Point struct {
	Load     float64 `json:"load"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	// HitRate is cached prompt tokens ÷ prompt tokens, as the engines
	// reported them.
	HitRate float64 `json:"hit_rate"`
	// TTFT counts each shed request with the time it waited before it was
	// shed.
	TTFT bench.Summary `json:"ttft_ms"`
	ITL  bench.Summary `json:"itl_ms"`
	E2E  bench.Summary `json:"e2e_ms"`
	// FirstTurnHitRate and FollowUpHitRate split HitRate between sessions'
	// first turns (every request of a single-turn workload) and their later
	// turns (0 when there are none).
	FirstTurnHitRate float64 `json:"first_turn_hit_rate"`
	FollowUpHitRate  float64 `json:"follow_up_hit_rate"`
	// Stickiness is the share of follow-up requests routed to a worker that
	// held their previous request's prefix, among those for which the
	// previous request's worker (or the chosen one) still held it.
	Stickiness float64 `json:"stickiness"`
	// SameWorker is the share of sessions' later turns routed to the worker
	// that served the turn before (0 when there are none).
	SameWorker float64 `json:"same_worker"`
	// OverlapExact is the share of requests whose predicted cached tokens
	// equal what the engine then reported.
	OverlapExact float64 `json:"overlap_exact"`
	// Preemptions counts engine preemptions.
	Preemptions uint64 `json:"preemptions"`
}

// Result is one run: one mode at one load.
type Result struct {
	Mode string `json:"mode"`
	Point
	// Shed counts requests the admission queue refused.
	Shed int `json:"shed"`
	// SpanSeconds is the virtual time from the first arrival to the last
	// finish.
	SpanSeconds float64 `json:"span_seconds"`
	// Fits are the router's learned prefill models per worker at the end.
	Fits []scoring.RateFit `json:"fits,omitempty"`
	// RouterCost is the router's CPU, when the sweep measured it.
	RouterCost *RouterCost `json:"router_cost,omitempty"`
	// Records holds one record per request that got its first token, in
	// the order first tokens came, when the run was asked to keep them.
	Records []RequestRecord `json:"-"`
	// Explains holds the router's explanation of each decision the run
	// was asked to explain, in the order they were made.
	Explains []ExplainRecord `json:"-"`
}

// reqState is one turn in flight.
type reqState struct {
	session, turn int32
	worker        int32 // -1 until admitted
	arrive        time.Duration
	first, last   time.Duration
	tokens        int
	prompt        []int32 // the engine appends the output here
	hashes        []uint64
	predicted     int // predicted cached tokens on the chosen worker
	// parent and shared name the earlier request whose prefix this one
	// extends, and how many leading blocks they share.
	parent int32
	shared int
	done   bool
}

type workerState struct {
	id     string
	eng    *sim.Engine
	busy   bool
	events []vllmwire.Event
	// outputs of the step in progress, copied out of the engine's result.
	outputs []sim.Output
}

type runner struct {
	w       *Workload
	fleet   Fleet
	timing  sim.Timing
	mode    string
	load    float64
	clock   clock
	router  *scoring.Scheduler
	index   *kvindex.Index
	approx  *kvindex.Approx
	overlap scoring.OverlapSource
	workers []*workerState
	byID    map[string]int32

	reqs    []reqState
	first   []int32 // first request index of each session
	pending int     // requests not yet finished or failed
	batches [][]byte

	cands []scoring.Candidate
	ids   []string
	match []kvindex.MatchResult
	tok32 []uint32
	ehash []int64

	ttft, itl, e2e []float64
	// keepRequests asks for a RequestRecord per first token in requests.
	keepRequests bool
	requests     []RequestRecord
	// explain names the requests whose decisions go to explains.
	explain              map[int]bool
	explains             []ExplainRecord
	promptTok, cachedTok int
	// first-turn share of promptTok and cachedTok
	firstPromptTok, firstCachedTok int
	followUps, sameWorker          int
	exact, predictedN              int
	sticky, stickyEligible         int
	errors, shed                   int
	lastFinish                     time.Duration
	buildErr                       error
	// meter times the router's calls; nil unless measuring.
	meter *meter
}

// Run simulates w on fleet with the router configured by opts (its Mode
// names the router mode) at load × the workload's own arrival rate. It
// is deterministic: the same inputs give the same Result.
func Run(w *Workload, fleet Fleet, opts scoring.Options, load float64, seed uint64) (Result, error) {
	return runMeasured(w, fleet, opts, load, seed, measureNone)
}

// measure says what a run measures beside its Result.
type measure uint8

const (
	measureNone measure = iota
	// measureCPU times the router's calls (Result.RouterCost).
	measureCPU
	// measureHeap also measures the index's heap at the end.
	measureHeap
)

func runMeasured(w *Workload, fleet Fleet, opts scoring.Options, load float64, seed uint64, what measure) (Result, error) {
	return runRecorded(w, fleet, opts, load, seed, what, recording{})
}

// recording says what a run records beside its Result: every request
// (Result.Records), and the decisions of the requests in explain
// (Result.Explains).
type recording struct {
	requests bool
	explain  map[int]bool
}

// runRecorded is runMeasured that also records what rec asks for.
func runRecorded(w *Workload, fleet Fleet, opts scoring.Options, load float64, seed uint64, what measure, rec recording) (Result, error) {
	if !(load > 0) {
		return Result{}, fmt.Errorf("load %g must be positive", load)
	}
	if fleet.Workers < 1 {
		return Result{}, errors.New("fleet needs at least one worker")
	}
	r := &runner{w: w, fleet: fleet, timing: fleet.timing(), mode: opts.Mode, load: load, byID: map[string]int32{}, keepRequests: rec.requests, explain: rec.explain}
	if what != measureNone {
		r.meter = newMeter(what == measureHeap)
	}
	if err := r.setup(opts, seed); err != nil {
		r.meter.abandon()
		return Result{}, err
	}
	r.loop()
	if r.buildErr != nil {
		r.meter.abandon()
		return Result{}, r.buildErr
	}
	res := r.result()
	if r.meter != nil {
		r.meter.finish(r, &res)
	}
	return res, nil
}

func (r *runner) setup(opts scoring.Options, seed uint64) error {
	now := r.clock.time
	opts.Now = now
	opts.Rand = rand.New(rand.NewPCG(seed, 0x51b))
	r.approx = kvindex.NewApprox(kvindex.ApproxConfig{Now: now})
	if strings.EqualFold(opts.Mode, scoring.ModeKVWithoutEvents) {
		// Only the approximate mode reads what the recorder learns.
		opts.Recorder = r.approx
	}
	router, err := scoring.NewScheduler(opts)
	if err != nil {
		return err
	}
	r.router = router
	r.overlap = router.Mode().Overlap()
	r.index = kvindex.New(kvindex.Config{})
	r.index.SetObserver(router.Pool())
	cfg := r.fleet.Engine
	for i := 0; i < r.fleet.Workers; i++ {
		id := fmt.Sprintf("w%02d", i)
		ws := &workerState{id: id}
		eng, err := sim.NewEngine(cfg, sim.EventSinkFunc(func(e sim.Event) {
			ws.events = append(ws.events, sim.KVIndexEvent(e))
		}))
		if err != nil {
			return err
		}
		ws.eng = eng
		ec := eng.Config()
		spec := fleet.Worker{ID: id, Model: r.fleet.Model, Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			BlockSize: ec.BlockSize, KVTotalBlocks: ec.NumGPUBlocks, MaxNumBatchedTokens: ec.MaxNumBatchedTokens, MaxNumSeqs: ec.MaxNumSeqs}
		if err := router.Pool().Upsert(spec); err != nil {
			return err
		}
		r.index.AddWorker(id, r.fleet.Model, ec.BlockSize)
		r.index.Reserve(id, ec.NumGPUBlocks) // as the router does from the record
		r.byID[id] = int32(i)
		r.workers = append(r.workers, ws)
		// Reports are staggered so the fleet's do not all land at once.
		if r.fleet.ReportEvery > 0 {
			r.clock.at(r.fleet.ReportEvery*time.Duration(i)/time.Duration(r.fleet.Workers), evReport, int32(i), 0)
		}
	}
	r.reqs = make([]reqState, 0, r.w.Requests())
	for s := range r.w.Sessions {
		r.first = append(r.first, int32(len(r.reqs)))
		for t := range r.w.Sessions[s].Turns {
			r.reqs = append(r.reqs, reqState{session: int32(s), turn: int32(t), worker: -1, parent: -1})
		}
	}
	r.tracePrefixParents()
	r.pending = len(r.reqs)
	for s := range r.w.Sessions {
		at := time.Duration(float64(r.w.Sessions[s].Start) / r.load)
		r.clock.at(at, evArrive, r.first[s], 0)
	}
	r.clock.at(0, evTick, 0, 0)
	return nil
}

// tracePrefixParents links each single-turn request to the latest earlier
// one with which it shares the longest prefix of more than Workload.RootIDs
// hash ids (in the conversation trace one id alone is the system prompt
// every request shares): the previous turn of its conversation, or the
// last request of its shared-prefix group.
func (r *runner) tracePrefixParents() {
	type node struct {
		last int32
		kids map[int64]*node
	}
	root := &node{kids: map[int64]*node{}}
	bs := r.fleet.Engine.BlockSize
	if bs == 0 {
		bs = sim.DefaultBlockSize
	}
	for s := range r.w.Sessions {
		t := &r.w.Sessions[s].Turns[0]
		if len(r.w.Sessions[s].Turns) > 1 || len(t.Trace) <= r.w.RootIDs {
			continue
		}
		i := r.first[s]
		n := root
		parent, depth := int32(-1), 0
		for d, h := range t.Trace {
			k := n.kids[h]
			if k == nil {
				k = &node{last: -1, kids: map[int64]*node{}}
				n.kids[h] = k
			}
			if d >= r.w.RootIDs && k.last >= 0 {
				parent, depth = k.last, d+1
			}
			k.last = i
			n = k
		}
		if parent >= 0 {
			shared := min(depth*r.w.TraceBlock, t.Input)
			r.reqs[i].parent, r.reqs[i].shared = parent, shared/bs
		}
	}
}

func (r *runner) loop() {
	for r.pending > 0 && r.buildErr == nil {
		e, ok := r.clock.next()
		if !ok {
			return
		}
		switch e.kind {
		case evArrive:
			r.arrive(e.a)
		case evDeliver:
			r.deliver(e.a)
		case evStepDone:
			r.stepDone(e.a)
		case evStart:
			r.startStep(e.a)
		case evKV:
			r.applyBatch(e.a, e.b)
		case evReport:
			r.report(e.a)
		case evTick:
			t := r.meter.now()
			r.router.ShedExpired()
			if r.clock.now%time.Second == 0 {
				r.router.Pool().Sweep()
			}
			r.meter.add(callTimers, t, 0)
			r.clock.at(r.clock.now+100*time.Millisecond, evTick, 0, 0)
		}
	}
}

func (r *runner) arrive(i int32) {
	q := &r.reqs[i]
	q.arrive = r.clock.now
	sess := &r.w.Sessions[q.session]
	turn := &sess.Turns[q.turn]
	var hist []int32
	if q.turn > 0 {
		prev := &r.reqs[i-1]
		hist = prev.prompt // prompt + generated output
		prev.prompt = nil
		q.parent = i - 1
		if !turn.Whole {
			q.shared = len(hist) / r.blockSize()
		}
	}
	var prompt []int32
	if turn.Whole {
		prompt = make([]int32, 0, turn.Input+turn.New+turn.Output)
	} else {
		prompt = make([]int32, 0, len(hist)+turn.Input+turn.New+turn.Output)
		prompt = append(prompt, hist...)
	}
	q.prompt = r.w.appendPrompt(prompt, turn)
	if turn.Whole && q.turn > 0 {
		q.shared = commonPrefix(hist, q.prompt) / r.blockSize()
	}

	r.tok32 = r.tok32[:0]
	for _, t := range q.prompt {
		r.tok32 = append(r.tok32, uint32(t))
	}
	bs := r.blockSize()
	t := r.meter.now()
	q.hashes = kvindex.HashBlocks(kvindex.Seed(r.fleet.Model, "", ""), r.tok32, bs, nil)
	r.meter.add(callHash, t, 0)
	t = r.meter.now()
	// excluded is the part of the decision counted apart (Match) or not
	// the router's at all (the copy of the candidates below).
	var excluded time.Duration
	req := &scoring.Request{ID: strconv.Itoa(int(i)), Model: r.fleet.Model, PromptTokens: len(q.prompt),
		Hashes: q.hashes, ExpectedOutputTokens: turn.Output}
	r.cands = r.router.Pool().AppendCandidates(r.cands[:0], r.fleet.Model)
	var m kvindex.Matcher
	switch r.overlap {
	case scoring.OverlapEvents:
		m = r.index
	case scoring.OverlapApprox:
		m = r.approx
	}
	if m != nil {
		r.ids = r.ids[:0]
		for _, c := range r.cands {
			r.ids = append(r.ids, c.Worker)
		}
		tm := r.meter.now()
		r.match = m.Match(q.hashes, r.ids, r.match)
		excluded = r.meter.add(callMatch, tm, 0)
		for k := range r.cands {
			r.cands[k].MatchedBlocks, r.cands[k].CachedBlocks = int(r.match[k].Blocks), int(r.match[k].Cached)
			r.cands[k].HostBlocks, r.cands[k].DiskBlocks = int(r.match[k].HostBlocks), int(r.match[k].DiskBlocks)
			r.cands[k].Stale = r.match[k].Stale
		}
	}
	// The candidates are copied: a queued request keeps its own. The
	// picker needs no copy (Route blocks), so it is not timed.
	tc := r.meter.now()
	cands := append([]scoring.Candidate(nil), r.cands...)
	excluded += r.meter.since(tc)
	var exp *scoring.Explanation
	if r.explain[int(i)] {
		exp = &scoring.Explanation{}
	}
	r.router.Submit(req, cands, exp, func(d scoring.Decision, err error) {
		if err != nil {
			r.fail(i, err)
			return
		}
		if exp != nil {
			r.explains = append(r.explains, ExplainRecord{Mode: r.mode, Load: r.load, Request: int(i),
				AtMs: ms(r.clock.now), Explanation: *exp})
		}
		q := &r.reqs[i]
		q.worker = r.byID[d.Worker]
		maxHit := (len(q.prompt) - 1) / bs
		q.predicted = min(d.MatchedBlocks, maxHit) * bs
		// Delivery is an event of its own: done runs inside the router.
		r.clock.at(r.clock.now, evDeliver, i, 0)
	})
	r.meter.add(callDecide, t, excluded)
}

func (r *runner) blockSize() int {
	if bs := r.fleet.Engine.BlockSize; bs > 0 {
		return bs
	}
	return sim.DefaultBlockSize
}

func (r *runner) fail(i int32, err error) {
	q := &r.reqs[i]
	if q.done {
		return
	}
	var shed *scoring.ShedError
	if errors.As(err, &shed) {
		// A shed request's client waited this long for its 429: it counts
		// in the TTFT distribution, or shedding would flatter a mode.
		r.shed++
		r.ttft = append(r.ttft, ms(r.clock.now-q.arrive))
	}
	r.errors++
	q.done = true
	r.pending--
	t := r.meter.now()
	r.router.Pool().Free(strconv.Itoa(int(i)))
	r.meter.add(callLifecycle, t, 0)
	// A session whose turn failed goes on with its next turn, as a client
	// retrying with the same history would.
	r.next(i)
}

// next schedules the session's following turn, Think and its Delay after
// now.
func (r *runner) next(i int32) {
	q := &r.reqs[i]
	sess := &r.w.Sessions[q.session]
	if k := int(q.turn) + 1; k < len(sess.Turns) {
		pause := sess.Think + sess.Turns[k].Delay
		r.clock.at(r.clock.now+time.Duration(float64(pause)/r.load), evArrive, i+1, 0)
	}
}

// commonPrefix is the number of leading tokens a and b share.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func (r *runner) deliver(i int32) {
	q := &r.reqs[i]
	w := r.workers[q.worker]
	// Stickiness: did the chosen worker hold the previous request's prefix?
	if q.parent >= 0 && q.shared > 0 {
		r.ehash = sim.PromptHashes(w.eng.Config(), q.prompt[:q.shared*r.blockSize()], r.ehash[:0])
		chosen := w.eng.HeldPrefix(r.ehash) >= q.shared
		eligible := chosen
		if p := r.reqs[q.parent].worker; !eligible && p >= 0 {
			eligible = r.workers[p].eng.HeldPrefix(r.ehash) >= q.shared
		}
		if eligible {
			r.stickyEligible++
			if chosen {
				r.sticky++
			}
		}
	}
	if q.turn > 0 {
		r.followUps++
		if r.reqs[i-1].worker == q.worker {
			r.sameWorker++
		}
	}
	out := r.w.Sessions[q.session].Turns[q.turn].Output
	if err := w.eng.Add(uint64(i), q.prompt, out); err != nil {
		r.fail(i, err)
		return
	}
	if !w.busy {
		// The step starts once every event of this instant has run, so
		// that requests arriving together share it, as an engine's
		// scheduler takes all that is waiting when it builds a batch.
		w.busy = true
		r.clock.at(r.clock.now, evStart, q.worker, 0)
	}
}

func (r *runner) startStep(wi int32) {
	w := r.workers[wi]
	res := w.eng.Step()
	if res.Scheduled == 0 {
		w.busy = false
		return
	}
	w.busy = true
	w.outputs = append(w.outputs[:0], res.Outputs...)
	cfg := w.eng.Config()
	ms := r.timing.StepMillis(res, cfg.NumGPUBlocks*cfg.BlockSize)
	end := r.clock.now + time.Duration(ms*float64(time.Millisecond))
	if len(w.events) > 0 {
		if r.overlap == scoring.OverlapEvents {
			b, err := vllmwire.EncodeBatch(vllmwire.EventBatch{TS: float64(base.Add(end).UnixMilli()) / 1000, Events: w.events})
			if err != nil {
				r.buildErr = fmt.Errorf("encode KV events of %s: %w", w.id, err)
				return
			}
			r.batches = append(r.batches, b)
			r.clock.at(end+r.fleet.EventLag, evKV, wi, int32(len(r.batches)-1))
		}
		clear(w.events)
		w.events = w.events[:0]
	}
	r.clock.at(end, evStepDone, wi, 0)
}

func (r *runner) applyBatch(wi, bi int32) {
	t := r.meter.now()
	b, err := vllmwire.DecodeBatch(r.batches[bi])
	r.batches[bi] = nil
	if err != nil {
		r.buildErr = fmt.Errorf("decode KV events of %s: %w", r.workers[wi].id, err)
		return
	}
	r.index.Apply(r.workers[wi].id, b)
	if r.meter != nil {
		r.meter.add(callApply, t, 0)
		r.meter.events(eventBlocks(b))
	}
}

// eventBlocks counts the block hashes a batch stores or removes.
func eventBlocks(b vllmwire.EventBatch) int {
	n := 0
	for _, e := range b.Events {
		switch e := e.(type) {
		case vllmwire.BlockStored:
			n += len(e.BlockHashes)
		case vllmwire.BlockRemoved:
			n += len(e.BlockHashes)
		}
	}
	return n
}

func (r *runner) stepDone(wi int32) {
	w := r.workers[wi]
	pool := r.router.Pool()
	bs := r.blockSize()
	now := r.clock.now
	for _, o := range w.outputs {
		i := int32(o.ID)
		q := &r.reqs[i]
		id := strconv.Itoa(int(i))
		if o.Index == 0 {
			q.first = now
			r.ttft = append(r.ttft, ms(now-q.arrive))
			if r.keepRequests {
				r.requests = append(r.requests, RequestRecord{Mode: r.mode, Load: r.load, Request: int(i), Worker: w.id,
					ArrivalMs: ms(q.arrive), PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens,
					PredictedCachedTokens: q.predicted, TTFTMs: ms(now - q.arrive),
					FloorMs: floorMillis(r.timing, w.eng.Config(), o.PromptTokens, o.CachedTokens)})
			}
			r.promptTok += o.PromptTokens
			r.cachedTok += o.CachedTokens
			if q.turn == 0 {
				r.firstPromptTok += o.PromptTokens
				r.firstCachedTok += o.CachedTokens
			}
			r.predictedN++
			if q.predicted == o.CachedTokens {
				r.exact++
			}
			t := r.meter.now()
			pool.PrefillDone(id)
			r.meter.add(callLifecycle, t, 0)
		}
		q.tokens = o.Index + 1
		q.last = now
		if q.tokens%bs == 0 && !o.Finished {
			t := r.meter.now()
			pool.Progress(id, q.tokens)
			r.meter.add(callLifecycle, t, 0)
		}
		if o.Finished {
			t := r.meter.now()
			pool.Free(id)
			r.meter.add(callLifecycle, t, 0)
			if q.tokens > 1 {
				r.itl = append(r.itl, ms(q.last-q.first)/float64(q.tokens-1))
			}
			r.e2e = append(r.e2e, ms(now-q.arrive))
			q.done = true
			q.hashes = nil
			r.pending--
			r.lastFinish = now
			if int(q.turn)+1 < len(r.w.Sessions[q.session].Turns) {
				// The engine appended the output behind the prompt, in the
				// spare capacity arrive gave it: that is the next turn's history.
				q.prompt = q.prompt[:len(q.prompt)+q.tokens]
				r.next(i)
			} else {
				q.prompt = nil
			}
		}
	}
	w.outputs = w.outputs[:0]
	r.startStep(wi)
}

func (r *runner) report(wi int32) {
	w := r.workers[wi]
	st := w.eng.Stats()
	t := r.meter.now()
	_ = r.router.Pool().SetLoadReport(w.id, fleet.LoadReport{
		TSMillis: r.clock.time().UnixMilli(), Waiting: st.Waiting, Running: st.Running,
		KVUsedBlocks: st.UsedBlocks, KVTotalBlocks: st.TotalBlocks,
	})
	r.meter.add(callReports, t, 0)
	r.clock.at(r.clock.now+r.fleet.ReportEvery, evReport, wi, 0)
}

// ratio is n ÷ d, or 0 when d is 0.
func ratio(n, d int) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *runner) result() Result {
	res := Result{Mode: r.mode, Point: Point{Load: r.load, Requests: len(r.reqs), Errors: r.errors}, Shed: r.shed,
		SpanSeconds: r.lastFinish.Seconds()}
	res.HitRate = ratio(r.cachedTok, r.promptTok)
	res.FirstTurnHitRate = ratio(r.firstCachedTok, r.firstPromptTok)
	res.FollowUpHitRate = ratio(r.cachedTok-r.firstCachedTok, r.promptTok-r.firstPromptTok)
	res.SameWorker = ratio(r.sameWorker, r.followUps)
	res.Stickiness = ratio(r.sticky, r.stickyEligible)
	res.OverlapExact = ratio(r.exact, r.predictedN)
	res.TTFT, res.ITL, res.E2E = bench.Summarize(r.ttft), bench.Summarize(r.itl), bench.Summarize(r.e2e)
	res.Records = r.requests
	res.Explains = r.explains
	for _, w := range r.workers {
		res.Preemptions += w.eng.Stats().Preemptions
	}
	res.Fits = r.router.Pool().Fits()
	return res
}
