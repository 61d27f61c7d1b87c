package server

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/nats-io/nats.go"
)

// Every line the NATS adapters write goes through the configured logger,
// in its format and at its level: replica sync (a silent peer, another
// process under our router id) and load reports (a rejected report, at
// debug). Before, they wrote plain text through slog.Default().
func TestBusLogsGoThroughTheConfiguredLogger(t *testing.T) {
	testenv.Quiet()
	var def testenv.SyncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })

	var logs testenv.SyncBuffer
	cfg := testConfig(t)
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.WorkersFile = workersFile(t, 1)
	cfg.ReplicaSync, cfg.RouterID = true, "r1"
	cfg.Recovery.SyncHeartbeat = 50 * time.Millisecond
	r := start(t, cfg)

	nc, err := nats.Connect(r.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	publish := func(subject, body string) {
		t.Helper()
		if err := nc.Publish(subject, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	sync := bus.SyncSubject(cfg.Namespace)
	publish(sync, `{"router":"ghost","op":"heartbeat","interval_ms":50,"incarnation":"g1"}`) // then silent
	publish(sync, `{"router":"r1","op":"heartbeat","interval_ms":50,"incarnation":"not-ours"}`)
	publish(bus.LoadSubject(cfg.Namespace, "w0"), `{"waiting":-1}`)

	want := map[string]string{
		"peer replica silent":          "scoring.sync",
		"another kvroute replica uses": "scoring.sync",
		"load report rejected":         "scoring.load_reports",
	}
	eventually(t, "the three lines in the configured logger", func() bool {
		found := 0
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec struct{ Msg, Component string }
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			for msg, comp := range want {
				if strings.HasPrefix(rec.Msg, msg) && rec.Component == comp {
					found++
				}
			}
		}
		return found >= len(want)
	})
	for msg := range want {
		if strings.Contains(def.String(), msg) {
			t.Errorf("%q went to slog.Default():\n%s", msg, def.String())
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line that is not JSON reached the JSON handler: %q", line)
		}
	}
}
