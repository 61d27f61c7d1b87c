package server

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/extproc"
)

// DefaultRequestLogSize is how many recent decisions /debug/requests keeps
// unless --request-log-size says otherwise.
const DefaultRequestLogSize = 1000

// requestRecord is one request in the log: what was decided, and how the
// exchange ended once it has.
type requestRecord struct {
	seq uint64

	ID           string    `json:"id"`
	Time         time.Time `json:"time"`
	Model        string    `json:"model,omitempty"`
	Mode         string    `json:"mode,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	Address      string    `json:"address,omitempty"`
	CachedTokens int       `json:"cached_tokens"`
	Predicted    bool      `json:"predicted"`
	// Rejected is the router's own answer when it did not route.
	Rejected *rejection `json:"rejected,omitempty"`
	// Explanation has the shape of POST /debug/explain's answer.
	Explanation any `json:"explanation,omitempty"`
	// Outcome is nil while the request is in flight.
	Outcome *requestOutcome `json:"outcome,omitempty"`
}

type rejection struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

type requestOutcome struct {
	Status int    `json:"status"`
	Result string `json:"result"`
	// TTFTMs is omitted when no response byte was seen.
	TTFTMs     *float64 `json:"ttft_ms,omitempty"`
	DurationMs float64  `json:"duration_ms"`
}

// requestLog is a bounded ring of the most recent decisions, findable by
// request id; it implements extproc.RequestLog. Streams write it (one
// Decided and one Finished each), the admin handler reads copies.
type requestLog struct {
	mu   sync.Mutex
	ring []requestRecord
	next uint64            // seq of the next record; slot = seq % len(ring)
	byID map[string]uint64 // newest seq per id
	now  func() time.Time
}

var _ extproc.RequestLog = (*requestLog)(nil)

// newRequestLog returns a log of size records, or nil when size is not
// positive (the log is off).
func newRequestLog(size int, now func() time.Time) *requestLog {
	if size <= 0 {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	return &requestLog{ring: make([]requestRecord, size), next: 1, byID: make(map[string]uint64, size), now: now}
}

// Decided implements extproc.RequestLog.
func (l *requestLog) Decided(id string, d *extproc.Decision, rejected *extproc.HTTPError) uint64 {
	rec := requestRecord{ID: id, Time: l.now()}
	if d != nil {
		rec.Model, rec.Mode, rec.Worker, rec.Address = d.Model, d.Mode, d.Worker, d.Address
		rec.CachedTokens, rec.Predicted, rec.Explanation = d.CachedTokens, d.Predicted, d.Explanation
	}
	if rejected != nil {
		rec.Rejected = &rejection{Status: rejected.Status, Code: rejected.Code, Message: rejected.Message}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.seq = l.next
	l.next++
	slot := &l.ring[rec.seq%uint64(len(l.ring))]
	if slot.seq != 0 && l.byID[slot.ID] == slot.seq {
		delete(l.byID, slot.ID)
	}
	*slot = rec
	l.byID[id] = rec.seq
	return rec.seq
}

// Finished implements extproc.RequestLog. A record already overwritten by
// newer ones is left alone.
func (l *requestLog) Finished(handle uint64, end extproc.Finish) {
	out := &requestOutcome{Status: end.Status, Result: string(end.Outcome), DurationMs: ms(end.Duration)}
	if end.TTFT > 0 {
		t := ms(end.TTFT)
		out.TTFTMs = &t
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if slot := &l.ring[handle%uint64(len(l.ring))]; slot.seq == handle {
		slot.Outcome = out
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// find returns the newest record filed under id.
func (l *requestLog) find(id string) (requestRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq, ok := l.byID[id]
	if !ok {
		return requestRecord{}, false
	}
	return l.ring[seq%uint64(len(l.ring))], true
}

// recent returns up to limit records, newest first (limit <= 0: all).
func (l *requestLog) recent(limit int) []requestRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(uint64(len(l.ring)), l.next-1)
	if limit > 0 && uint64(limit) < n {
		n = uint64(limit)
	}
	out := make([]requestRecord, 0, n)
	for seq := l.next - 1; seq > l.next-1-n; seq-- {
		out = append(out, l.ring[seq%uint64(len(l.ring))])
	}
	return out
}

// handleRequests serves GET /debug/requests: the recent decisions, newest
// first (?limit=N), or the one request ?id= names.
func (r *Server) handleRequests(w http.ResponseWriter, req *http.Request) {
	l := r.requests
	if l == nil {
		writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "request_log_off",
			Message: "the request log is off (--request-log-size 0)"})
		return
	}
	q := req.URL.Query()
	if q.Has("id") {
		rec, ok := l.find(q.Get("id"))
		if !ok {
			writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "request_not_found",
				Message: "no request with that id among the last " + strconv.Itoa(len(l.ring)) + " decisions"})
			return
		}
		writeJSON(w, http.StatusOK, rec)
		return
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, &extproc.HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "bad_limit",
				Message: "limit must be a non-negative integer"})
			return
		}
		limit = n
	}
	writeJSON(w, http.StatusOK, map[string]any{"capacity": len(l.ring), "requests": l.recent(limit)})
}
