package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
)

func logIDs(recs []requestRecord) []string {
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestRequestLogKeepsTheNewestAndFindsThemByID(t *testing.T) {
	l := newRequestLog(3, func() time.Time { return time.Unix(0, 0) })
	handles := map[string]uint64{}
	for i := range 5 {
		id := fmt.Sprintf("r%d", i)
		handles[id] = l.Decided(id, &extproc.Decision{Worker: "w" + id}, nil)
	}
	if got, want := logIDs(l.recent(0)), []string{"r4", "r3", "r2"}; !slices.Equal(got, want) {
		t.Fatalf("recent %v, want %v (newest first, bounded)", got, want)
	}
	if got := logIDs(l.recent(2)); !slices.Equal(got, []string{"r4", "r3"}) {
		t.Errorf("recent(2) = %v", got)
	}
	if _, ok := l.find("r1"); ok {
		t.Error("an evicted request is still found")
	}
	rec, ok := l.find("r3")
	if !ok || rec.Worker != "wr3" {
		t.Fatalf("find(r3) = %+v, %v", rec, ok)
	}
	// An outcome for an evicted record must not land on its slot's new owner.
	l.Finished(handles["r0"], extproc.Finish{Status: 500})
	if rec, _ := l.find("r3"); rec.Outcome != nil {
		t.Errorf("r3 took an evicted request's outcome: %+v", rec.Outcome)
	}
	l.Finished(handles["r3"], extproc.Finish{Status: 200, Outcome: extproc.OutcomeOK, TTFT: 1500 * time.Microsecond, Duration: 3 * time.Millisecond})
	rec, _ = l.find("r3")
	if o := rec.Outcome; o == nil || o.Status != 200 || o.Result != "ok" || o.TTFTMs == nil || *o.TTFTMs != 1.5 || o.DurationMs != 3 {
		t.Errorf("r3 outcome %+v", rec.Outcome)
	}
}

func TestRequestLogRepeatedIDFindsTheNewest(t *testing.T) {
	l := newRequestLog(4, nil)
	l.Decided("same", &extproc.Decision{Worker: "a"}, nil)
	l.Decided("same", &extproc.Decision{Worker: "b"}, nil)
	for range 3 { // evicts the first "same" only
		l.Decided("other", nil, &extproc.HTTPError{Status: 429, Code: "queue_full"})
	}
	if rec, ok := l.find("same"); !ok || rec.Worker != "b" {
		t.Fatalf("find(same) = %+v, %v; want the newer one (worker b)", rec, ok)
	}
	if rec, _ := l.find("other"); rec.Rejected == nil || rec.Rejected.Status != 429 {
		t.Errorf("rejection not kept: %+v", rec)
	}
}

func TestRequestLogOffWithSizeZero(t *testing.T) {
	if l := newRequestLog(0, nil); l != nil {
		t.Fatal("size 0 gave a log")
	}
	w := httptest.NewRecorder()
	(&Server{}).handleRequests(w, httptest.NewRequest("GET", "/debug/requests", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("status %d with the log off, want 404", w.Code)
	}
}

func TestDebugRequestsHandler(t *testing.T) {
	r := &Server{requests: newRequestLog(10, nil)}
	h := r.requests.Decided("abc", &extproc.Decision{Worker: "w1", Model: "m", CachedTokens: 48, Predicted: true, Explanation: map[string]int{"prompt_tokens": 64}}, nil)
	r.requests.Finished(h, extproc.Finish{Status: 200, Outcome: extproc.OutcomeOK, Duration: time.Millisecond})
	r.requests.Decided("def", &extproc.Decision{Worker: "w2"}, nil)

	get := func(target string) (int, map[string]any) {
		w := httptest.NewRecorder()
		r.handleRequests(w, httptest.NewRequest("GET", target, nil))
		var out map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s: %v in %s", target, err, w.Body)
		}
		return w.Code, out
	}
	code, one := get("/debug/requests?id=abc")
	if code != 200 || one["worker"] != "w1" || one["cached_tokens"] != 48.0 {
		t.Fatalf("?id=abc: %d %v", code, one)
	}
	if exp, _ := one["explanation"].(map[string]any); exp["prompt_tokens"] != 64.0 {
		t.Errorf("explanation %v", one["explanation"])
	}
	if out, _ := one["outcome"].(map[string]any); out["status"] != 200.0 || out["result"] != "ok" {
		t.Errorf("outcome %v", one["outcome"])
	}
	if code, _ := get("/debug/requests?id=nope"); code != 404 {
		t.Errorf("unknown id: %d, want 404", code)
	}
	code, all := get("/debug/requests?limit=1")
	reqs, _ := all["requests"].([]any)
	if code != 200 || all["capacity"] != 10.0 || len(reqs) != 1 || reqs[0].(map[string]any)["id"] != "def" {
		t.Errorf("?limit=1: %d %v", code, all)
	}
	if _, in := reqs[0].(map[string]any)["outcome"]; in {
		t.Error("an in-flight request shows an outcome")
	}
	if code, _ := get("/debug/requests?limit=x"); code != 400 {
		t.Errorf("bad limit: %d, want 400", code)
	}
}
