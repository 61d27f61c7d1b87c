package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cannedServer streams a fixed 4-token completion after delay and records
// how many requests were in flight at most and when each arrived.
type cannedServer struct {
	delay          time.Duration
	inFlight, peak atomic.Int64
	mu             sync.Mutex
	arrivals       []time.Time
}

func (s *cannedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.mu.Lock()
	s.arrivals = append(s.arrivals, time.Now())
	s.mu.Unlock()
	time.Sleep(s.delay)
	w.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < 4; i++ {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-w9-%d\",\"choices\":[{\"text\":\"t\"}]}\n\n", i)
	}
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\ndata: [DONE]\n\n")
}

func flows(n int, gap time.Duration) *Workload {
	w := &Workload{Name: "test"}
	for i := 0; i < n; i++ {
		w.Flows = append(w.Flows, Flow{At: time.Duration(i) * gap, Items: []Item{{Path: PathCompletions, Body: []byte(`{}`), OutputLen: 4}}})
	}
	return w
}

func TestRunHoldsFixedConcurrency(t *testing.T) {
	srv := &cannedServer{delay: 20 * time.Millisecond}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := NewClient(ts.URL)
	defer c.Close()
	var progress atomic.Int64
	res, err := Run(context.Background(), c, flows(24, 0), RunOptions{
		Arrival:  Arrival{Kind: ArrivalConcurrency, Concurrency: 4},
		Progress: func(done, _ int) { progress.Store(int64(done)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 24 || progress.Load() != 24 {
		t.Fatalf("%d results, progress %d; want 24", len(res), progress.Load())
	}
	if p := srv.peak.Load(); p != 4 {
		t.Errorf("peak concurrency %d, want 4", p)
	}
	m := Measure(res, time.Second)
	if m.Errors != 0 || m.HitRate != 0.5 || m.WorkerShare["w9"] != 1 {
		t.Errorf("errors %d, hit rate %v, shares %v", m.Errors, m.HitRate, m.WorkerShare)
	}
}

func TestRunFollowsTraceTimestamps(t *testing.T) {
	srv := &cannedServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := NewClient(ts.URL)
	defer c.Close()
	start := time.Now()
	if _, err := Run(context.Background(), c, flows(5, 40*time.Millisecond), RunOptions{Arrival: Arrival{Kind: ArrivalTrace}}); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.arrivals) != 5 {
		t.Fatalf("%d arrivals", len(srv.arrivals))
	}
	for i, at := range srv.arrivals {
		// Arrivals may be late on a busy machine, never early.
		if early := time.Duration(i)*40*time.Millisecond - at.Sub(start); early > 0 {
			t.Errorf("request %d arrived %v before its timestamp", i, early)
		}
	}
}

func TestRunStopsStartingFlowsAfterDuration(t *testing.T) {
	srv := &cannedServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := NewClient(ts.URL)
	defer c.Close()
	res, err := Run(context.Background(), c, flows(50, 10*time.Millisecond), RunOptions{
		Arrival: Arrival{Kind: ArrivalTrace}, Duration: 95 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 10 {
		t.Errorf("%d requests started within 95ms of 10ms-spaced arrivals, want 10", len(res))
	}
}

func TestRunPoissonSendsEveryFlowAndChatFlowsInOrder(t *testing.T) {
	srv := &cannedServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := NewClient(ts.URL)
	defer c.Close()
	w := &Workload{}
	for s := 0; s < 3; s++ {
		fl := Flow{Think: time.Millisecond}
		for turn := 0; turn < 3; turn++ {
			fl.Items = append(fl.Items, Item{Path: PathCompletions, Body: []byte(fmt.Sprintf(`{"s":%d,"t":%d}`, s, turn))})
		}
		w.Flows = append(w.Flows, fl)
	}
	res, err := Run(context.Background(), c, w, RunOptions{Arrival: Arrival{Kind: ArrivalPoisson, Rate: 200, Seed: 3}})
	if err != nil || len(res) != 9 {
		t.Fatalf("%d results, err %v", len(res), err)
	}
}

func TestArrivalValidate(t *testing.T) {
	for _, a := range []Arrival{{Kind: "burst"}, {Kind: ArrivalPoisson}, {Kind: ArrivalConcurrency}} {
		if a.Validate() == nil {
			t.Errorf("%+v accepted", a)
		}
	}
}

func TestWorkloadLimitCutsFlowsAtTheRequestCount(t *testing.T) {
	w, err := ChatWorkload(ChatOptions{Model: "m", Sessions: 3, Turns: 4, SystemPrompts: 1, SystemWords: 5, UserWords: 3, ReplyWords: 3, OutputTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	w.Limit(6)
	if w.Requests() != 6 || len(w.Flows) != 2 {
		t.Errorf("%d requests in %d flows, want 6 in 2", w.Requests(), len(w.Flows))
	}
}
