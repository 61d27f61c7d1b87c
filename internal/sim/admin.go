package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

type adminServer struct {
	ln  net.Listener
	srv *http.Server
}

func startAdmin(addr string, f *Fleet) (*adminServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	a := &adminServer{ln: ln, srv: &http.Server{Handler: f.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			f.log.Error("admin server", "err", err)
		}
	}()
	return a, nil
}

func (a *adminServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return a.srv.Shutdown(ctx)
}

// workerStatus is one row of GET /admin/workers.
type workerStatus struct {
	ID      string      `json:"id"`
	Address string      `json:"address"`
	Stats   WorkerStats `json:"stats"`
}

// AdminHandler serves the fleet's fault switches:
//
//	GET  /admin/workers                      list workers and their stats
//	POST /admin/workers/{id}/kill            stop HTTP and the etcd keepalive, as a crash
//	POST /admin/workers/{id}/reset           drop the prefix cache (AllBlocksCleared)
//	POST /admin/workers/{id}/resync          re-announce the cache (AllBlocksCleared + every block)
//	POST /admin/workers/{id}/drop-events?n=1       drop the next n KV event batches
//	POST /admin/workers/{id}/duplicate-events?n=1  send the next n batches twice
func (f *Fleet) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/workers", func(rw http.ResponseWriter, _ *http.Request) {
		rows := make([]workerStatus, len(f.workers))
		for i, w := range f.workers {
			rows[i] = workerStatus{ID: w.ID(), Address: w.Record().Address, Stats: w.Stats()}
		}
		writeJSON(rw, http.StatusOK, rows)
	})
	mux.HandleFunc("POST /admin/workers/{id}/{action}", func(rw http.ResponseWriter, r *http.Request) {
		w := f.Worker(r.PathValue("id"))
		if w == nil {
			writeError(rw, http.StatusNotFound, "NotFoundError", "no worker "+strconv.Quote(r.PathValue("id")))
			return
		}
		n := 1
		if s := r.URL.Query().Get("n"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				writeError(rw, http.StatusBadRequest, "BadRequestError", "n must be a positive integer")
				return
			}
			n = v
		}
		switch r.PathValue("action") {
		case "kill":
			go w.Kill() // Kill waits for the worker's goroutines; answer first
		case "reset":
			w.ResetCache()
		case "resync":
			w.Resync()
		case "drop-events":
			w.DropNextBatches(n)
		case "duplicate-events":
			w.DuplicateNextBatches(n)
		default:
			writeError(rw, http.StatusNotFound, "NotFoundError", "unknown action "+strconv.Quote(r.PathValue("action")))
			return
		}
		f.log.Info("admin fault switch", "worker", w.ID(), "action", r.PathValue("action"), "n", n)
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(map[string]any{"worker": w.ID(), "action": r.PathValue("action"), "n": n})
	})
	return mux
}
