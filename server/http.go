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

// endpoint is one operator endpoint, listed on GET /.
type endpoint struct {
	Method      string `json:"method"`
	Path        string `json:"path"`
	Description string `json:"description"`
}

// endpoints are the operator endpoints, in the order GET / lists them.
var endpoints = []endpoint{
	{"GET", "/", "this list"},
	{"GET", "/metrics", "Prometheus metrics (kvroute_*)"},
	{"GET", "/healthz", "liveness: ok while the process runs"},
	{"GET", "/readyz", "readiness: 200 with tokenizers loaded, a worker and NATS; else 503 and the reason"},
	{"GET", "/debug/workers", "every worker: its record, live load and index holdings"},
	{"POST", "/debug/explain", "an OpenAI body in, the decision with every candidate's terms out, without side effects (?path=/v1/completions)"},
	{"GET", SnapshotPath, "the KV index as a versioned binary snapshot, for a restarting replica's --warm-from"},
	{"GET", "/admin/mode", "the router mode and the valid ones"},
	{"POST", "/admin/mode", `switch the router mode at runtime: {"mode": NAME} or ?mode=NAME`},
}

// httpHandler serves the operator endpoints.
func (r *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"service": "kvroute", "endpoints": endpoints})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", r.handleReady)
	mux.HandleFunc("GET /debug/workers", r.handleWorkers)
	mux.HandleFunc("POST /debug/explain", r.handleExplain)
	mux.HandleFunc("GET "+SnapshotPath, r.handleSnapshot)
	mux.HandleFunc("GET /admin/mode", r.handleMode)
	mux.HandleFunc("POST /admin/mode", r.handleMode)
	mux.HandleFunc("/", handleUnknown)
	return mux
}

// handleUnknown answers a path or method no endpoint serves, in the
// shared error shape.
func handleUnknown(w http.ResponseWriter, req *http.Request) {
	var methods []string
	for _, e := range endpoints {
		if e.Path == req.URL.Path {
			methods = append(methods, e.Method)
		}
	}
	if len(methods) > 0 {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeError(w, &extproc.HTTPError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: req.Method + " " + req.URL.Path + ": use " + strings.Join(methods, " or ")})
		return
	}
	writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: "no endpoint " + req.URL.Path + "; GET / lists them"})
}

// writeError answers with the OpenAI-style error the data path uses
// ({"error": {"message", "type", "param", "code"}}).
func writeError(w http.ResponseWriter, e *extproc.HTTPError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(e.Body(), '\n'))
}

// badRequest is a 400 in the shared error shape.
func badRequest(code, msg string) *extproc.HTTPError {
	return &extproc.HTTPError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
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
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason}) // a probe's answer, not an error
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
		writeError(w, &extproc.HTTPError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "body_too_large", Message: err.Error()})
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
			writeError(w, he)
			return
		}
		writeError(w, &extproc.HTTPError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error", Message: err.Error()})
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
				writeError(w, badRequest("invalid_body", `want {"mode": NAME} or ?mode=NAME: `+err.Error()))
				return
			}
			mode = in.Mode
		}
		if err := r.SetMode(mode); err != nil {
			writeError(w, badRequest("unknown_mode", err.Error()))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"mode": r.Mode(), "modes": scoring.ModeNames()})
}
