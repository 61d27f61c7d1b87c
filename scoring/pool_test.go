package scoring

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/fleet"
)

func TestPoolGroupsWorkersByModelAndAdapter(t *testing.T) {
	p := NewPool(DefaultOptions())
	for _, s := range []fleet.Worker{
		{ID: "b", Model: "base", BlockSize: 16, LoRAAdapters: []string{"sql"}},
		{ID: "a", Model: "base", BlockSize: 16},
		{ID: "c", Model: "other", BlockSize: 16, LoRAAdapters: []string{"sql", "chat"}},
	} {
		if err := p.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(model string) []string {
		var out []string
		for _, c := range p.AppendCandidates(nil, model) {
			out = append(out, c.Worker)
		}
		return out
	}
	tests := []struct {
		model string
		want  []string
	}{
		{"base", []string{"a", "b"}},
		{"sql", []string{"b", "c"}},
		{"chat", []string{"c"}},
		{"other", []string{"c"}},
		{"missing", nil},
	}
	for _, tt := range tests {
		if got := ids(tt.model); !slices.Equal(got, tt.want) {
			t.Errorf("candidates(%q) = %v, want %v", tt.model, got, tt.want)
		}
	}
	if got, want := p.Models(), []string{"base", "chat", "other", "sql"}; !slices.Equal(got, want) {
		t.Errorf("Models() = %v, want %v", got, want)
	}
	// An update that drops the adapter moves the worker out of its group.
	if err := p.Upsert(fleet.Worker{ID: "b", Model: "base", BlockSize: 16}); err != nil {
		t.Fatal(err)
	}
	if got := ids("sql"); !slices.Equal(got, []string{"c"}) {
		t.Errorf("after update candidates(sql) = %v, want [c]", got)
	}
	p.Remove("c")
	if got := ids("sql"); got != nil {
		t.Errorf("after remove candidates(sql) = %v, want none", got)
	}
}

func TestUpsertRejectsInvalidSpecs(t *testing.T) {
	p := NewPool(DefaultOptions())
	for name, s := range map[string]fleet.Worker{
		"no id":           {Model: "m", BlockSize: 16},
		"no model":        {ID: "w", BlockSize: 16},
		"zero block":      {ID: "w", Model: "m"},
		"negative kv":     {ID: "w", Model: "m", BlockSize: 16, KVTotalBlocks: -1},
		"negative weight": {ID: "w", Model: "m", BlockSize: 16, Weight: -1},
	} {
		if err := p.Upsert(s); err == nil {
			t.Errorf("%s: Upsert accepted %+v", name, s)
		}
	}
	if p.Len() != 0 {
		t.Errorf("pool holds %d workers after invalid upserts", p.Len())
	}
}

func TestUpsertKeepsLiveLoad(t *testing.T) {
	clock := newFakeClock()
	p := NewPool(testOptions(clock, 1))
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	req := &Request{ID: "r1", PromptTokens: 100, Hashes: hashes(1, 6, 0, 1)}
	if err := p.Add(req, "w0", 0); err != nil {
		t.Fatal(err)
	}
	s := spec("w0")
	s.Weight = 3
	if err := p.Upsert(s); err != nil {
		t.Fatal(err)
	}
	l := mustLoad(t, p, "w0")
	if l.ActiveRequests != 1 || l.ActiveBlocks != 7 || l.PrefillTokens != 100 || l.Weight != 3 {
		t.Errorf("after update load = %+v, want 1 request, 7 blocks, 100 prefill tokens, weight 3", l)
	}
}

// Behaviour 6: cancel or free releases exactly the blocks that were added.
func TestFreeReleasesExactlyTheBlocksAdded(t *testing.T) {
	clock := newFakeClock()
	p := NewPool(testOptions(clock, 1))
	for _, id := range []string{"w0", "w1"} {
		if err := p.Upsert(spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Background load that must survive untouched.
	bg := &Request{ID: "bg", PromptTokens: 160, Hashes: hashes(7, 10, 0, 0)}
	if err := p.Add(bg, "w0", 0); err != nil {
		t.Fatal(err)
	}
	before := mustLoad(t, p, "w0")

	// Three requests sharing a 4-block system prompt with bg's first blocks
	// and two more of their own, plus a partial block (3*16+... tokens).
	var reqs []*Request
	for i := range 3 {
		h := append(hashes(7, 4, 0, 0), hashes(0, 0, 2, 100+i)...)
		reqs = append(reqs, &Request{ID: string(rune('a' + i)), PromptTokens: 6*16 + 5, Hashes: h})
	}
	for _, r := range reqs {
		if err := p.Add(r, "w0", 4); err != nil {
			t.Fatal(err)
		}
	}
	mid := mustLoad(t, p, "w0")
	// Shared blocks count once: bg's 10 + 3×(2 unique + 1 partial).
	if want := before.ActiveBlocks + 3*3; mid.ActiveBlocks != want {
		t.Errorf("active blocks with 3 sharing requests = %d, want %d", mid.ActiveBlocks, want)
	}
	if want := before.PrefillTokens + 3*(6*16+5-4*16); mid.PrefillTokens != want {
		t.Errorf("prefill tokens = %d, want %d", mid.PrefillTokens, want)
	}
	p.Progress("a", 40) // 101+40 = 141 tokens → 9 blocks: 2 more private
	p.PrefillDone("b")
	p.Free("a")
	p.Free("b")
	p.Free("c")
	p.Free("a") // double free is a no-op
	after := mustLoad(t, p, "w0")
	if after.ActiveBlocks != before.ActiveBlocks || after.ActiveRequests != before.ActiveRequests ||
		after.PrefillTokens != before.PrefillTokens || after.PrefillRequests != before.PrefillRequests {
		t.Errorf("after freeing: %+v, want the background load %+v", after, before)
	}
	p.Free("bg")
	if l := mustLoad(t, p, "w0"); l.ActiveBlocks != 0 || l.ActiveRequests != 0 || l.PrefillTokens != 0 {
		t.Errorf("empty worker still holds load: %+v", l)
	}
	if l := mustLoad(t, p, "w1"); l.ActiveBlocks != 0 || l.ActiveRequests != 0 {
		t.Errorf("untouched worker gained load: %+v", l)
	}
}

func TestLifecycleCallsInAnyOrder(t *testing.T) {
	tests := []struct {
		name  string
		calls func(p *Pool)
		// want is the worker's load after the calls.
		wantBlocks, wantReqs, wantPrefill int
	}{
		{"add only", func(p *Pool) { add(t, p, "r", 0) }, 3, 1, 40},
		{"add twice is one request", func(p *Pool) { add(t, p, "r", 0); add(t, p, "r", 0) }, 3, 1, 40},
		{"prefill done clears prefill", func(p *Pool) { add(t, p, "r", 0); p.PrefillDone("r") }, 3, 1, 0},
		{"progress implies prefill done", func(p *Pool) { add(t, p, "r", 0); p.Progress("r", 1) }, 3, 1, 0},
		{"progress fills decode blocks", func(p *Pool) { add(t, p, "r", 0); p.Progress("r", 40) }, 5, 1, 0},
		{"lower progress is ignored", func(p *Pool) { add(t, p, "r", 0); p.Progress("r", 40); p.Progress("r", 2) }, 5, 1, 0},
		{"lifecycle before add is ignored", func(p *Pool) { p.PrefillDone("r"); p.Progress("r", 9); add(t, p, "r", 0) }, 3, 1, 40},
		{"add after free stays freed", func(p *Pool) { add(t, p, "r", 0); p.Free("r"); add(t, p, "r", 0) }, 0, 0, 0},
		{"free before add blocks the add", func(p *Pool) { p.Free("r"); add(t, p, "r", 0) }, 0, 0, 0},
		{"calls after free are ignored", func(p *Pool) { add(t, p, "r", 0); p.Free("r"); p.PrefillDone("r"); p.Progress("r", 99) }, 0, 0, 0},
		{"overlap reduces prefill", func(p *Pool) { add(t, p, "r", 2) }, 3, 1, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPool(testOptions(newFakeClock(), 1))
			if err := p.Upsert(spec("w0")); err != nil {
				t.Fatal(err)
			}
			tt.calls(p)
			l := mustLoad(t, p, "w0")
			if l.ActiveBlocks != tt.wantBlocks || l.ActiveRequests != tt.wantReqs || l.PrefillTokens != tt.wantPrefill {
				t.Errorf("load = blocks %d, requests %d, prefill %d; want %d, %d, %d",
					l.ActiveBlocks, l.ActiveRequests, l.PrefillTokens, tt.wantBlocks, tt.wantReqs, tt.wantPrefill)
			}
		})
	}
}

// add adds a 40-token request (2 full blocks + a partial) to w0.
func add(t *testing.T, p *Pool, id string, matched int) {
	t.Helper()
	if err := p.Add(&Request{ID: id, PromptTokens: 40, Hashes: []uint64{1, 2}}, "w0", matched); err != nil {
		t.Fatal(err)
	}
}

func TestAddToUnknownWorkerFails(t *testing.T) {
	p := NewPool(DefaultOptions())
	err := p.Add(&Request{ID: "r", PromptTokens: 10}, "nope", 0)
	if !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("Add to unknown worker: %v, want ErrUnknownWorker", err)
	}
}

func TestMoveTransfersTheLoad(t *testing.T) {
	p := NewPool(testOptions(newFakeClock(), 1))
	for _, id := range []string{"w0", "w1"} {
		if err := p.Upsert(spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	add(t, p, "r", 0)
	if err := p.Move("r", "w1"); err != nil {
		t.Fatal(err)
	}
	if l := mustLoad(t, p, "w0"); l.ActiveBlocks != 0 || l.ActiveRequests != 0 || l.PrefillTokens != 0 {
		t.Errorf("source keeps load after move: %+v", l)
	}
	if l := mustLoad(t, p, "w1"); l.ActiveBlocks != 3 || l.ActiveRequests != 1 || l.PrefillTokens != 40 {
		t.Errorf("target load after move: %+v, want 3 blocks, 1 request, 40 prefill", l)
	}
	if err := p.Move("r", "gone"); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("move to unknown worker: %v", err)
	}
	p.Free("r")
	if l := mustLoad(t, p, "w1"); l.ActiveBlocks != 0 || l.ActiveRequests != 0 {
		t.Errorf("free after move leaves load: %+v", l)
	}
}

func TestSweepForceFreesIdleRequests(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.MaxRequestAge = 300 * time.Second
	p := NewPool(o)
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	add(t, p, "old", 0)
	clock.Advance(200 * time.Second)
	add(t, p, "young", 0)
	clock.Advance(101 * time.Second)
	if n := p.Sweep(); n != 1 {
		t.Fatalf("Sweep freed %d, want 1", n)
	}
	if p.Active("old") || !p.Active("young") {
		t.Errorf("after sweep old active=%v young active=%v", p.Active("old"), p.Active("young"))
	}
	// Activity keeps a long stream alive.
	clock.Advance(250 * time.Second)
	p.Progress("young", 5)
	clock.Advance(250 * time.Second)
	if n := p.Sweep(); n != 0 || !p.Active("young") {
		t.Errorf("sweep freed a request with recent progress (n=%d)", n)
	}
	clock.Advance(301 * time.Second)
	p.Sweep()
	if l := mustLoad(t, p, "w0"); l.ActiveRequests != 0 || l.ActiveBlocks != 0 || l.PrefillTokens != 0 {
		t.Errorf("load left after sweeping everything: %+v", l)
	}
}

func TestRemoveDropsTheWorkersRequests(t *testing.T) {
	p := NewPool(testOptions(newFakeClock(), 1))
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	add(t, p, "r", 0)
	p.Remove("w0")
	if p.Active("r") {
		t.Error("request on a removed worker is still active")
	}
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	if l := mustLoad(t, p, "w0"); l.ActiveRequests != 0 {
		t.Errorf("re-registered worker inherited load: %+v", l)
	}
}

func TestStaleLoadReportIsIgnored(t *testing.T) {
	clock := newFakeClock()
	o := testOptions(clock, 1)
	o.StaleReportAge = 2 * time.Second
	p := NewPool(o)
	if err := p.Upsert(spec("w0")); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLoadReport("w0", fleet.LoadReport{Waiting: 3, Running: 2, KVUsedBlocks: 500}); err != nil {
		t.Fatal(err)
	}
	if l := mustLoad(t, p, "w0"); !l.ReportFresh || l.KVUsedBlocks() != 500 || l.Waiting() != 3 {
		t.Errorf("fresh report not used: fresh=%v used=%d waiting=%d", l.ReportFresh, l.KVUsedBlocks(), l.Waiting())
	}
	clock.Advance(2100 * time.Millisecond)
	if l := mustLoad(t, p, "w0"); l.ReportFresh || l.KVUsedBlocks() != 0 || l.Waiting() != 0 {
		t.Errorf("stale report still used: fresh=%v used=%d waiting=%d", l.ReportFresh, l.KVUsedBlocks(), l.Waiting())
	}
	if err := p.SetLoadReport("nope", fleet.LoadReport{}); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("report for unknown worker: %v", err)
	}
}

func TestCandidatesBySubsetAndAddress(t *testing.T) {
	p := NewPool(DefaultOptions())
	for i, id := range []string{"w0", "w1", "w2"} {
		s := spec(id)
		s.Address = "10.0.0." + string(rune('1'+i)) + ":8000"
		if err := p.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	subset := map[string]bool{"10.0.0.2:8000": true, "w2": true}
	var got []string
	for _, c := range p.AppendCandidatesFunc(nil, "m", func(id, addr string) bool { return subset[id] || subset[addr] }) {
		got = append(got, c.Worker)
	}
	if !slices.Equal(got, []string{"w1", "w2"}) {
		t.Errorf("subset candidates = %v, want [w1 w2]", got)
	}
	if id, ok := p.WorkerByAddress("10.0.0.3:8000"); !ok || id != "w2" {
		t.Errorf("WorkerByAddress = %q, %v; want w2", id, ok)
	}
	p.Remove("w2")
	if _, ok := p.WorkerByAddress("10.0.0.3:8000"); ok {
		t.Error("removed worker's address still resolves")
	}
}
