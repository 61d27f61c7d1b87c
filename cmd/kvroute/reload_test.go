package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// schedRouter is a running scheduler as a reload sees it.
type schedRouter struct{ s *scoring.Scheduler }

func (r schedRouter) Reconfigure(o scoring.Options) error { return r.s.Reconfigure(o) }
func (r schedRouter) Mode() string                        { return r.s.Mode().Name() }

// syncBuffer is a log sink safe for the reloader's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

const reloadBase = "discovery:\n  workers-file: w.yaml\nserver:\n  grpc-addr: \":9002\"\nrouting:\n  mode: kv\n  queue:\n    threshold: 4\n"

// startReloader loads file as serve does and watches it for a scheduler
// built from it.
func startReloader(t *testing.T, file string) (*reloader, *scoring.Scheduler, *syncBuffer, *prometheus.Registry) {
	t.Helper()
	args := []string{"--config", file}
	st, err := loadServe(args, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil), os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := st.config(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scoring.NewScheduler(cfg.Scoring)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	rl, err := newReloader(st, args, envOf(nil), schedRouter{sched}, slog.New(slog.NewTextHandler(logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	return rl, sched, logs, reg
}

func rewrite(t *testing.T, file, body string) {
	t.Helper()
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A reload applies the routing section, reports the rest as needing a
// restart, refuses a bad file keeping the configuration in use, and counts
// each outcome.
func TestReloadAppliesRoutingAndRefusesBadFiles(t *testing.T) {
	file := writeConfig(t, reloadBase)
	rl, sched, logs, _ := startReloader(t, file)

	steps := []struct {
		name     string
		body     string // "" keeps the file
		force    bool   // SIGHUP rather than a poll
		want     string // outcome
		wantMode string
		wantW    float64 // decode-active-request-weight
		wantLog  string
	}{
		{name: "poll, same content", want: "", wantMode: "kv", wantW: 8},
		{name: "SIGHUP, same content", force: true, want: reloadUnchanged, wantMode: "kv", wantW: 8, wantLog: "configuration file unchanged"},
		{name: "mode, weight and an infrastructure key",
			body: strings.Replace(reloadBase, "mode: kv", "mode: round_robin\n  cost:\n    params:\n      decode-active-request-weight: 3", 1) + "limits:\n  max-body-bytes: 1024\n",
			want: reloadApplied, wantMode: "round_robin", wantW: 3, wantLog: "keys=[limits.max-body-bytes]"},
		{name: "unknown mode is refused", body: strings.Replace(reloadBase, "mode: kv", "mode: magic", 1),
			want: reloadRejected, wantMode: "round_robin", wantW: 3, wantLog: "routing.mode"},
		{name: "the same bad file is not retried by the poll", want: "", wantMode: "round_robin", wantW: 3},
		{name: "not YAML is refused", body: "routing: {\n", want: reloadRejected, wantMode: "round_robin", wantW: 3, wantLog: "not YAML"},
		{name: "turning the queue off needs a restart", body: strings.Replace(reloadBase, "threshold: 4", "threshold: 0", 1),
			want: reloadRejected, wantMode: "round_robin", wantW: 3, wantLog: "needs a restart"},
		{name: "back to the first file", body: reloadBase, want: reloadApplied, wantMode: "kv", wantW: 8},
	}
	for _, s := range steps {
		if s.body != "" {
			rewrite(t, file, s.body)
		}
		if got := rl.reload(s.force); got != s.want {
			t.Errorf("%s: outcome %q, want %q\n%s", s.name, got, s.want, logs.String())
		}
		o := sched.Options()
		if o.Mode != s.wantMode || o.DecodeActiveRequestWeight != s.wantW {
			t.Errorf("%s: mode %s weight %g, want %s %g", s.name, o.Mode, o.DecodeActiveRequestWeight, s.wantMode, s.wantW)
		}
		if s.wantLog != "" && !strings.Contains(logs.String(), s.wantLog) {
			t.Errorf("%s: logs lack %q:\n%s", s.name, s.wantLog, logs.String())
		}
	}
	for outcome, want := range map[string]float64{reloadApplied: 2, reloadRejected: 3, reloadUnchanged: 1} {
		if got := counter(rl, outcome); got != want {
			t.Errorf("kvroute_config_reloads_total{outcome=%q} = %g, want %g", outcome, got, want)
		}
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("want a WARN for the restart and ERRORs for the refusals:\n%s", logs.String())
	}
}

// A mode switched at runtime (/admin/mode) survives a reload that does not
// change routing.mode.
func TestReloadKeepsARuntimeModeSwitch(t *testing.T) {
	file := writeConfig(t, reloadBase)
	rl, sched, _, _ := startReloader(t, file)
	if err := sched.SetMode("random"); err != nil {
		t.Fatal(err)
	}
	rewrite(t, file, reloadBase+"  cost:\n    params:\n      weighted-a: 5\n")
	if got := rl.reload(false); got != reloadApplied {
		t.Fatalf("outcome %q", got)
	}
	if o := sched.Options(); o.Mode != "random" || o.WeightedA != 5 {
		t.Errorf("mode %s weighted-a %g, want random 5", o.Mode, o.WeightedA)
	}
}

// The running loop reloads on SIGHUP and on a change of the file, and
// exports its metrics.
func TestReloadOnSIGHUPAndFileChange(t *testing.T) {
	file := writeConfig(t, reloadBase)
	rl, sched, logs, reg := startReloader(t, file)
	rl.interval = time.Hour // only SIGHUP
	defer rl.watchHUP()()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); rl.run(ctx) }()
	waitMode := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for sched.Mode().Name() != want {
			if time.Now().After(deadline) {
				t.Fatalf("mode %s, want %s\n%s", sched.Mode().Name(), want, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	rewrite(t, file, strings.Replace(reloadBase, "mode: kv", "mode: least_loaded", 1))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitMode("least_loaded")
	cancel()
	<-done

	// The same reloader, now polling.
	rl.interval = 20 * time.Millisecond
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { defer close(done); rl.run(ctx) }()
	rewrite(t, file, strings.Replace(reloadBase, "mode: kv", "mode: round_robin", 1))
	waitMode("round_robin")
	cancel()
	<-done

	mfs, err := reg.Gather()
	n := 0
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "kvroute_config_") {
			n += len(mf.GetMetric())
		}
	}
	if err != nil || n != 5 {
		t.Errorf("%d series (%v), want 3 outcomes, the timestamp and the file's hash", n, err)
	}
	if got := counter(rl, reloadApplied); got != 2 {
		t.Errorf("applied %g, want 2", got)
	}
}

func counter(rl *reloader, outcome string) float64 {
	var m dto.Metric
	_ = rl.reloads.WithLabelValues(outcome).Write(&m)
	return m.GetCounter().GetValue()
}
