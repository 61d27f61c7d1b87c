package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// endpoint is one operator endpoint, listed on GET /.
type endpoint struct {
	Method      string `json:"method"`
	Path        string `json:"path"`
	Description string `json:"description"`
	// admin endpoints are served on the admin listener (--admin-listen).
	admin bool
}

// endpoints are the operator endpoints, in the order GET / lists them.
// Metrics and health stay on the HTTP port that probes and scrapers reach;
// debug and admin endpoints move to the admin listener (loopback by
// default, optional bearer token), since they read the fleet and switch
// the router's mode.
var endpoints = []endpoint{
	{"GET", "/", "this list", false},
	{"GET", "/metrics", "Prometheus metrics (kvroute_*)", false},
	{"GET", "/healthz", "liveness: ok while the process runs", false},
	{"GET", "/readyz", "readiness: 200 once discovery synced with a worker and ext_proc is up (a NATS or etcd outage only shows in \"degraded\"); else 503 and the reason", false},
	{"GET", "/", "this list", true},
	{"GET", "/debug/workers", "every worker on one line (id, health, running, waiting, cached blocks, learned prefill rate); ?verbose=1 gives its whole record, live load and index holdings; \"degraded\" lists components the router runs without (nats, etcd, kubernetes)", true},
	{"POST", "/debug/explain", "an OpenAI body in, the decision with every candidate's terms out, without side effects (?path=/v1/completions)", true},
	{"GET", "/debug/requests", "the last decisions (--request-log-size), newest first: worker, explanation (as /debug/explain), outcome (status, TTFT, duration); ?id=X-REQUEST-ID gives one, ?limit=N the newest N", true},
	{"GET", SnapshotPath, "the KV index as a versioned binary snapshot, for a restarting replica's --warm-from", true},
	{"POST", IndexQueryPath, `the index as a service (Dynamo standalone indexer's /query): {"model_name", "token_ids"} in, per worker the leading tokens held on device, host and disk out; read-only`, true},
	{"POST", IndexQueryByHashPath, `as /index/query for kvroute router block hashes: {"model_name", "block_hashes"}`, true},
	{"GET", IndexWorkersPath, "the workers the index knows (Dynamo standalone indexer's /workers); ?model_name= filters", true},
	{"GET", "/admin/mode", "the router mode and the valid ones", true},
	{"POST", "/admin/mode", `switch the router mode at runtime: {"mode": NAME} or ?mode=NAME`, true},
}

// listed returns the endpoints one listener serves.
func listed(admin bool) []endpoint {
	var out []endpoint
	for _, e := range endpoints {
		if e.admin == admin {
			out = append(out, e)
		}
	}
	return out
}

// httpHandler serves metrics and health on the HTTP port.
func (r *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"service": "kvroute", "endpoints": listed(false)})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", r.handleReady)
	mux.HandleFunc("/", unknownOn(false))
	return mux
}

// adminHandler serves the debug and admin endpoints on the admin
// listener, behind the bearer token when one is set.
func (r *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"service": "kvroute admin", "endpoints": listed(true)})
	})
	mux.HandleFunc("GET /debug/workers", r.handleWorkers)
	mux.HandleFunc("POST /debug/explain", r.handleExplain)
	mux.HandleFunc("GET /debug/requests", r.handleRequests)
	mux.HandleFunc("GET "+SnapshotPath, r.handleSnapshot)
	mux.HandleFunc("POST "+IndexQueryPath, r.handleIndexQuery(false))
	mux.HandleFunc("POST "+IndexQueryByHashPath, r.handleIndexQuery(true))
	mux.HandleFunc("GET "+IndexWorkersPath, r.handleIndexWorkers)
	mux.HandleFunc("GET /admin/mode", r.handleMode)
	mux.HandleFunc("POST /admin/mode", r.handleMode)
	mux.HandleFunc("/", unknownOn(true))
	if r.cfg.AdminToken == "" {
		return mux
	}
	want := []byte("Bearer " + r.cfg.AdminToken)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		got := []byte(req.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute admin"`)
			writeError(w, &extproc.HTTPError{Status: http.StatusUnauthorized, Type: "authentication_error", Code: "unauthorized",
				Message: "the admin listener needs Authorization: Bearer <token> (--admin-token-file)"})
			return
		}
		mux.ServeHTTP(w, req)
	})
}

// unknownOn answers a path or method no endpoint of that listener serves,
// in the shared error shape; a path served by the other listener says so.
func unknownOn(admin bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var methods []string
		other := false
		for _, e := range endpoints {
			if e.Path != req.URL.Path {
				continue
			}
			if e.admin == admin {
				methods = append(methods, e.Method)
			} else {
				other = true
			}
		}
		switch {
		case len(methods) > 0:
			w.Header().Set("Allow", strings.Join(methods, ", "))
			writeError(w, &extproc.HTTPError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
				Message: req.Method + " " + req.URL.Path + ": use " + strings.Join(methods, " or ")})
		case other && !admin:
			writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
				Message: req.URL.Path + " is served on the admin listener (--admin-listen), not here"})
		case other:
			writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
				Message: req.URL.Path + " is served on the HTTP port (--http-addr), not on the admin listener"})
		default:
			writeError(w, &extproc.HTTPError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
				Message: "no endpoint " + req.URL.Path + "; GET / lists them"})
		}
	}
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
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason, "degraded": r.degradedList()}) // a probe's answer, not an error
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true, "workers": r.fleet.len(), "degraded": r.degradedList()})
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
	exp, err := r.picker.ExplainContext(req.Context(), &extproc.Request{Method: "POST", Path: path, Headers: headers, Body: body, HasBody: true})
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

// degradedList is Degraded as a JSON list ([] rather than null).
func (r *Server) degradedList() []string {
	if d := r.Degraded(); d != nil {
		return d
	}
	return []string{}
}
