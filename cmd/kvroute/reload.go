package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/prometheus/client_golang/prometheus"
)

// reloadInterval is how often the configuration file's content is checked
// for a change.
const reloadInterval = 2 * time.Second

// Outcomes of a reload, the label of kvroute_config_reloads_total.
const (
	reloadApplied   = "applied"
	reloadRejected  = "rejected"
	reloadUnchanged = "unchanged"
)

// router is what a reload changes: the running server.
type router interface {
	Reconfigure(scoring.Options) error
	Mode() string
}

// reloader re-reads the configuration file on SIGHUP and when its content
// changes, and applies the routing settings to the running router; a
// change of any other setting is logged as needing a restart. One
// goroutine (run) owns all its state.
type reloader struct {
	file      string
	args      []string
	lookupEnv func(string) (string, bool)
	router    router
	log       *slog.Logger
	interval  time.Duration
	hup       <-chan os.Signal // nil: SIGHUP is not watched

	running map[string]string // every flag's value in use
	loaded  [sha256.Size]byte // the file content last applied
	seen    [sha256.Size]byte // the file content last looked at

	reloads  *prometheus.CounterVec
	lastTime prometheus.Gauge
	info     *prometheus.GaugeVec
}

// newReloader watches st's file for a router started from st; its metrics
// go to reg.
func newReloader(st *serveSetup, args []string, lookupEnv func(string) (string, bool), r router, log *slog.Logger, reg prometheus.Registerer) (*reloader, error) {
	rl := &reloader{
		file: st.file, args: args, lookupEnv: lookupEnv, router: r, log: log, interval: reloadInterval,
		running: st.values(), loaded: st.hash, seen: st.hash,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_config_reloads_total",
			Help: "Reloads of the --config file by outcome: applied (routing settings in effect), rejected (a bad file; the configuration in use is kept) or unchanged (same content)."}, []string{"outcome"}),
		lastTime: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_config_last_reload_timestamp_seconds",
			Help: "When the configuration file in use was loaded (at start or by the last applied reload), Unix seconds."}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvroute_config_info",
			Help: "1 for the SHA-256 of the configuration file in use."}, []string{"sha256"}),
	}
	for _, c := range []prometheus.Collector{rl.reloads, rl.lastTime, rl.info} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("config reload metrics: %w", err)
		}
	}
	for _, o := range []string{reloadApplied, reloadRejected, reloadUnchanged} {
		rl.reloads.WithLabelValues(o)
	}
	rl.lastTime.SetToCurrentTime()
	rl.info.WithLabelValues(hex.EncodeToString(st.hash[:])).Set(1)
	return rl, nil
}

// watchHUP makes run reload on SIGHUP; stop undoes it.
func (rl *reloader) watchHUP() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	rl.hup = ch
	return func() { signal.Stop(ch) }
}

// run reloads on SIGHUP and on a change of the file's content until ctx
// ends.
func (rl *reloader) run(ctx context.Context) {
	tick := time.NewTicker(rl.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rl.hup:
			rl.log.Info("SIGHUP: reloading the configuration", "file", rl.file)
			rl.reload(true)
		case <-tick.C:
			rl.reload(false)
		}
	}
}

// reload reads the file; unless forced it does nothing while the content
// is the one last looked at. It returns the outcome ("" when it did
// nothing).
func (rl *reloader) reload(force bool) string {
	data, err := os.ReadFile(rl.file)
	if err != nil {
		h := sha256.Sum256([]byte("\x00" + err.Error()))
		if !force && h == rl.seen {
			return ""
		}
		rl.seen = h
		return rl.reject(err)
	}
	h := sha256.Sum256(data)
	if !force && h == rl.seen {
		return ""
	}
	rl.seen = h
	if h == rl.loaded {
		rl.reloads.WithLabelValues(reloadUnchanged).Inc()
		rl.log.Info("configuration file unchanged", "file", rl.file)
		return reloadUnchanged
	}
	st, err := loadServe(rl.args, io.Discard, io.Discard, rl.lookupEnv, func(string) ([]byte, error) { return data, nil })
	if err != nil {
		return rl.reject(err)
	}
	cfg, err := st.config(io.Discard)
	if err != nil {
		return rl.reject(err)
	}
	next := st.values()
	var apply, restart []string
	for name, v := range next {
		if v == rl.running[name] {
			continue
		}
		key := st.schema.Key(name)
		if key == "" {
			key = "--" + name
		}
		if reloadable[name] {
			apply = append(apply, name)
		} else {
			restart = append(restart, key)
		}
	}
	slices.Sort(apply)
	slices.Sort(restart)
	if len(apply) > 0 {
		o := cfg.Scoring
		if !slices.Contains(apply, "router-mode") {
			o.Mode = rl.router.Mode() // keep a mode switched at runtime (/admin/mode)
		}
		if err := rl.router.Reconfigure(o); err != nil {
			return rl.reject(err)
		}
		for _, name := range apply {
			rl.running[name] = next[name]
		}
	}
	if len(restart) > 0 {
		rl.log.Warn("configuration reload: settings that need a restart were not applied", "file", rl.file, "keys", restart)
	}
	keys := make([]string, len(apply))
	for i, name := range apply {
		keys[i] = st.schema.Key(name)
	}
	rl.loaded = h
	rl.reloads.WithLabelValues(reloadApplied).Inc()
	rl.lastTime.SetToCurrentTime()
	rl.info.Reset()
	rl.info.WithLabelValues(hex.EncodeToString(h[:])).Set(1)
	rl.log.Info("configuration reloaded", "file", rl.file, "sha256", hex.EncodeToString(h[:6]), "applied", keys)
	return reloadApplied
}

func (rl *reloader) reject(err error) string {
	rl.reloads.WithLabelValues(reloadRejected).Inc()
	rl.log.Error("configuration reload refused; the configuration in use is kept", "file", rl.file, "err", err)
	return reloadRejected
}
