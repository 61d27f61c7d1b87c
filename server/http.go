package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// httpHandler serves the operator endpoints.
func (r *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", r.handleReady)
	mux.HandleFunc("GET /debug/workers", r.handleWorkers)
	mux.HandleFunc("POST /debug/explain", r.handleExplain)
	mux.HandleFunc("GET /admin/mode", r.handleMode)
	mux.HandleFunc("POST /admin/mode", r.handleMode)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (r *Server) handleReady(w http.ResponseWriter, _ *http.Request) {
	if reason := r.NotReadyReason(); reason != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true, "workers": r.fleet.len()})
}

// workerView is one worker on /debug/workers.
type workerView struct {
	Record scoring.WorkerSpec   `json:"record"`
	Load   *scoring.Load        `json:"load,omitempty"`
	Index  *kvindex.WorkerStats `json:"index,omitempty"`
}

func (r *Server) handleWorkers(w http.ResponseWriter, _ *http.Request) {
	st := r.index.Stats()
	byID := map[string]*kvindex.WorkerStats{}
	for i := range st.PerWorker {
		byID[st.PerWorker[i].ID] = &st.PerWorker[i]
	}
	pool := r.sched.Load().Pool()
	var out []workerView
	for _, rec := range r.fleet.snapshot() {
		v := workerView{Record: rec, Index: byID[rec.ID]}
		if l, ok := pool.Load(rec.ID); ok {
			v.Load = &l
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"mode": r.Mode(), "ready": r.Ready(), "workers": out,
		"index": map[string]int{"workers": st.Workers, "blocks": st.Blocks, "entries": st.Entries, "bytes": st.Bytes},
	})
}

// handleExplain decides for a posted OpenAI body without side effects.
// ?path= names the API path (default /v1/chat/completions).
func (r *Server) handleExplain(w http.ResponseWriter, req *http.Request) {
	limit := r.cfg.Stream.MaxBodyBytes
	if limit <= 0 {
		limit = 16 << 20
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, int64(limit)))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"error": err.Error()})
		return
	}
	path := req.URL.Query().Get("path")
	if path == "" {
		path = "/v1/chat/completions"
	}
	headers := map[string]string{":path": path, ":method": "POST"}
	for k, v := range req.Header {
		if len(v) > 0 {
			headers[strings.ToLower(k)] = v[0]
		}
	}
	exp, err := r.picker.Explain(&extproc.Request{Method: "POST", Path: path, Headers: headers, Body: body, HasBody: true})
	if err != nil {
		var he *extproc.HTTPError
		if errors.As(err, &he) {
			writeJSON(w, he.Status, map[string]any{"error": map[string]string{"message": he.Message, "type": he.Type, "code": he.Code}})
			return
		}
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, exp)
}

// handleMode reports (GET) or switches (POST {"mode": "..."} or ?mode=)
// the router mode.
func (r *Server) handleMode(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodPost {
		mode := req.URL.Query().Get("mode")
		if mode == "" {
			var in struct {
				Mode string `json:"mode"`
			}
			if err := json.NewDecoder(io.LimitReader(req.Body, 4096)).Decode(&in); err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "want {\"mode\": NAME} or ?mode=NAME: " + err.Error()})
				return
			}
			mode = in.Mode
		}
		if err := r.SetMode(mode); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": err.Error(), "modes": scoring.ModeNames()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"mode": r.Mode(), "modes": scoring.ModeNames()})
}
