package server

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
)

// workerView is one worker on /debug/workers?verbose=1: everything the
// router holds about it.
type workerView struct {
	Record fleet.Worker         `json:"record"`
	Load   *scoring.Load        `json:"load,omitempty"`
	Index  *kvindex.WorkerStats `json:"index,omitempty"`
}

// workerLine is one worker on /debug/workers: the facts an operator looks
// for first, written on one line.
type workerLine struct {
	ID string `json:"id"`
	// Health is the first of: ejected (passive health), stale (KV events
	// lost, no overlap credit), silent (load reports stopped), no_report
	// (none fresh yet) and ok.
	Health string `json:"health"`
	// Running and Waiting come from the worker's last load report;
	// Running leaves out the requests whose response ended since, which
	// the report still counts until the next one.
	Running      int `json:"running"`
	Waiting      int `json:"waiting"`
	CachedBlocks int `json:"cached_blocks"`
	// PrefillRate is the learned prefill rate in tokens per second, to three
	// significant figures; 0 until the router has fitted one.
	PrefillRate float64 `json:"prefill_rate"`
}

// line condenses a workerView.
func (v workerView) line() workerLine {
	l := workerLine{ID: v.Record.ID, Health: "ok"}
	if v.Index != nil {
		l.CachedBlocks = v.Index.Blocks
	}
	switch {
	case v.Load == nil:
		l.Health = "no_report"
	case v.Load.Ejected:
		l.Health = "ejected"
	case v.Index != nil && v.Index.Stale:
		l.Health = "stale"
	case v.Load.ReportSilent:
		l.Health = "silent"
	case !v.Load.ReportFresh:
		l.Health = "no_report"
	}
	if v.Load != nil {
		// The report may predate requests that have ended since: they no
		// longer run, whatever the report says until the next one.
		l.Running, l.Waiting = max(0, v.Load.Report.Running-v.Load.FinishedSinceReport), v.Load.Report.Waiting
		if v.Load.FitSamples > 0 {
			l.PrefillRate = roundSig(v.Load.PrefillRate, 3)
		}
	}
	return l
}

// roundSig rounds x to n significant figures.
func roundSig(x float64, n int) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	p := math.Pow(10, float64(n)-math.Ceil(math.Log10(math.Abs(x))))
	return math.Round(x*p) / p
}

func (r *Server) handleWorkers(w http.ResponseWriter, req *http.Request) {
	st := r.index.Stats()
	byID := map[string]*kvindex.WorkerStats{}
	for i := range st.PerWorker {
		byID[st.PerWorker[i].ID] = &st.PerWorker[i]
	}
	pool := r.sched.Load().Pool()
	out := []workerView{}
	for _, rec := range r.fleet.snapshot() {
		v := workerView{Record: rec, Index: byID[rec.ID]}
		if l, ok := pool.Load(rec.ID); ok {
			v.Load = &l
		}
		out = append(out, v)
	}
	head := map[string]any{
		"mode": r.Mode(), "ready": r.Ready(), "degraded": r.degradedList(),
		"index": map[string]int{"workers": st.Workers, "blocks": st.Blocks, "entries": st.Entries, "bytes": st.Bytes},
	}
	if v, _ := strconv.ParseBool(req.URL.Query().Get("verbose")); v {
		head["workers"] = out
		writeJSON(w, http.StatusOK, head)
		return
	}
	lines := make([]workerLine, len(out))
	for i, v := range out {
		lines[i] = v.line()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(compactWorkers(head, lines))
}

// compactWorkers writes head's fields on one line and then each worker on
// a line of its own: still one JSON object, and readable with curl.
func compactWorkers(head map[string]any, lines []workerLine) []byte {
	var b bytes.Buffer
	h, _ := json.Marshal(head)
	b.Write(h[:len(h)-1]) // drop the closing brace
	b.WriteString(`,"workers":[`)
	for i, l := range lines {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n  ")
		js, _ := json.Marshal(l)
		b.Write(js)
	}
	if len(lines) > 0 {
		b.WriteByte('\n')
	}
	b.WriteString("]}\n")
	return b.Bytes()
}
