package server

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Dependencies the router can run without for a while, as Degraded and
// kvroute_degraded name them.
const (
	depNATS = "nats"
	depEtcd = "etcd"
	depKube = "kubernetes"
)

// degradedEffect says what the router does without each dependency, for
// the log line that reports it missing.
var degradedEffect = map[string]string{
	depNATS: "routing by load and the index it has: no KV events, load reports or replica sync until it connects",
	depEtcd: "routing over the last known workers: no joins or leaves until etcd answers",
	depKube: "routing over the last known pods: no joins or leaves until the API server answers",
}

// dependencies tracks which dependencies are away, for one log line when
// each goes and one when it comes back.
type dependencies struct {
	mu   sync.Mutex
	down map[string]time.Time // since when
}

// dependencyDown records name as away; the first report of an outage logs.
func (r *Server) dependencyDown(name string, err error) {
	r.deps.mu.Lock()
	defer r.deps.mu.Unlock()
	if _, already := r.deps.down[name]; already {
		return
	}
	if r.deps.down == nil {
		r.deps.down = map[string]time.Time{}
	}
	r.deps.down[name] = time.Now()
	r.log.Warn("dependency degraded", "component", name, "err", err, "effect", degradedEffect[name])
}

// dependencyUp records name as back; the first report after an outage logs.
func (r *Server) dependencyUp(name string) {
	r.deps.mu.Lock()
	defer r.deps.mu.Unlock()
	since, was := r.deps.down[name]
	if !was {
		return
	}
	delete(r.deps.down, name)
	r.log.Info("dependency recovered", "component", name, "was_away", time.Since(since).Round(time.Millisecond))
}

// isDown reports whether name is away. NATS is asked directly: its client
// knows best whether it is connected.
func (r *Server) isDown(name string) bool {
	if name == depNATS {
		return r.nc != nil && !r.nc.IsConnected()
	}
	r.deps.mu.Lock()
	defer r.deps.mu.Unlock()
	_, down := r.deps.down[name]
	return down
}

// dependenciesInUse are the dependencies this configuration has, in the
// order Degraded lists them.
func (r *Server) dependenciesInUse() []string {
	deps := []string{depNATS} // reported (as 0) even without NATS, as it always was
	if ws, err := r.cfg.workerSource(); err == nil && ws.dep != "" {
		deps = append(deps, ws.dep)
	}
	return deps
}

// Degraded lists what the router runs without while it still routes:
// "nats" when the event bus is not connected (no KV events, load reports
// or replica sync until it is), "etcd" while worker discovery cannot reach
// etcd (the last known workers are kept), "kubernetes" while InferencePool
// discovery cannot reach the API server (the last known pods are kept).
// Empty when nothing is missing.
func (r *Server) Degraded() []string {
	var out []string
	for _, d := range r.dependenciesInUse() {
		if r.isDown(d) {
			out = append(out, d)
		}
	}
	return out
}

// unreachable reports whether a NATS connect error means "no server
// answered" (refused, timed out, name not resolved), which the router
// rides out, rather than a refusal (authorization, TLS), which stops it.
func unreachable(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.As(err, &ne)
}
