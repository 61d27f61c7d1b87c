package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/testenv"
)

// A passive health ejection is a log line naming the worker, the cause,
// the failures counted and how long it is out; its end is another.
func TestEjectionIsLogged(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkersFile = workersFile(t, 2)
	cfg.NATSURL = testenv.StartNATS(t).URL
	cfg.Scoring.EjectAfter, cfg.Scoring.EjectBackoff = 2, 300*time.Millisecond
	var logs testenv.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r := start(t, cfg)
	eventually(t, "ready", r.Ready)

	// Two requests to the same worker end with a 5xx.
	var victim string
	for failed := 0; failed < 2; {
		d, err := r.Picker().Decide(context.Background(), &extproc.Request{Path: "/v1/chat/completions", HasBody: true, Body: []byte(chatBody(50)), Headers: map[string]string{}})
		if err != nil {
			t.Fatal(err)
		}
		if victim == "" {
			victim = d.Cluster
		}
		if d.Cluster == victim {
			d.Ticket.Free(extproc.OutcomeUpstreamError)
			failed++
		} else {
			d.Ticket.Free(extproc.OutcomeOK)
		}
	}
	eventually(t, "the ejection's end logged", func() bool { return strings.Contains(logs.String(), "worker back from ejection") })
	var ejected, back string
	for line := range strings.Lines(logs.String()) {
		switch {
		case strings.Contains(line, "worker ejected by passive health"):
			ejected = line
		case strings.Contains(line, "worker back from ejection"):
			back = line
		}
	}
	for _, want := range []string{"worker=" + victim, `reason="5xx response`, "failures=2", "ejections_in_a_row=1", "for=300ms", "until="} {
		if !strings.Contains(ejected, want) {
			t.Errorf("ejection line %q lacks %q", ejected, want)
		}
	}
	if !strings.Contains(back, "worker="+victim) {
		t.Errorf("return line %q does not name %s", back, victim)
	}
}
