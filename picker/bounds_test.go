package picker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/scoring"
)

// chatOf returns a chat body of n short user messages.
func chatOf(n int, content string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"messages":[`, testModel)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":%q}`, content)
	}
	b.WriteString(`]}`)
	return b.String()
}

// Over a cap the request is still routed, by load, and counted by reason;
// under it, the prompt is matched as usual.
func TestPickerCapsRouteByLoad(t *testing.T) {
	for _, tc := range []struct {
		name      string
		req       *extproc.Request
		reason    string // "" means matched against the index
		predicted bool
	}{
		{"chat under both caps", chatReq(chatOf(8, "hello there")), "", true},
		{"too many messages", chatReq(chatOf(9, "hi")), "too_many_messages", false},
		{"rendered prompt too large", chatReq(chatOf(2, strings.Repeat("x", 600))), "prompt_too_large", false},
		{"completion prompt too large", &extproc.Request{Method: "POST", Path: "/v1/completions", HasBody: true, Headers: map[string]string{},
			Body: []byte(fmt.Sprintf(`{"model":%q,"prompt":%q}`, testModel, strings.Repeat("y", 1100)))}, "prompt_too_large", false},
		{"completion under the cap", &extproc.Request{Method: "POST", Path: "/v1/completions", HasBody: true, Headers: map[string]string{},
			Body: []byte(fmt.Sprintf(`{"model":%q,"prompt":"short"}`, testModel))}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, func(_ *scoring.Options, c *Config) { c.MaxMessages, c.MaxPromptBytes = 8, 1024 })
			d, err := rg.picker.Decide(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Ticket.Free(extproc.OutcomeOK)
			if d.Cluster == "" || d.Predicted != tc.predicted {
				t.Errorf("decision %+v, want routed with predicted=%v", d, tc.predicted)
			}
			if tc.reason != "" && rg.metrics.byLoad[tc.reason] != 1 {
				t.Errorf("by-load reasons %v, want %s once", rg.metrics.byLoad, tc.reason)
			}
			if tc.reason == "" && len(rg.metrics.byLoad) != 0 {
				t.Errorf("by-load reasons %v for a request under the caps", rg.metrics.byLoad)
			}
		})
	}
}

// checkCtx is a context whose Err turns Canceled after a number of checks,
// so a test can cancel "in the middle" of a decision without timing.
type checkCtx struct {
	context.Context
	left, checks atomic.Int64
}

func (c *checkCtx) Err() error {
	c.checks.Add(1)
	if c.left.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// A decision stops when its request's context ends: before it starts,
// and part-way through tokenizing a long chat (the context is checked
// between messages), holding no load and counted as cancelled.
func TestPickerStopsWhenCancelled(t *testing.T) {
	rg := newRig(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rg.picker.Decide(ctx, chatReq(longChat(50))); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before: err = %v", err)
	}

	// A long chat, its context cancelled at the 3rd check: after parse,
	// after render, then in the first chunks of the encoding.
	body := chatOf(2000, "a few words per message, as agents send them")
	cc := &checkCtx{Context: context.Background()}
	cc.left.Store(3)
	_, err := rg.picker.Decide(cc, chatReq(body))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled mid-decision: err = %v", err)
	}
	if rg.metrics.outcomes["cancelled"] != 2 {
		t.Errorf("outcomes %v, want 2 cancelled", rg.metrics.outcomes)
	}
	if rg.metrics.phases["match"] != 0 {
		t.Errorf("a cancelled decision went on to match (%v)", rg.metrics.phases)
	}
	if n := cc.checks.Load(); n > 6 {
		t.Errorf("the context was checked %d times after it ended; work went on", n)
	}
	for _, w := range []string{"w0", "w1", "w2"} {
		if l, _ := rg.sched.Pool().Load(w); l.ActiveRequests != 0 {
			t.Errorf("%s holds %d requests after cancelled decisions", w, l.ActiveRequests)
		}
	}
	// The same chat, not cancelled, checks the context once per message
	// chunk: the checks scale with messages, not with tokens.
	cc = &checkCtx{Context: context.Background()}
	cc.left.Store(1 << 40)
	d, err := rg.picker.Decide(cc, chatReq(body))
	if err != nil {
		t.Fatal(err)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if n := cc.checks.Load(); n < 100 || n > 3*2000 {
		t.Errorf("the context was checked %d times for 2000 messages; want between 100 and 6000", n)
	}
}

// With every decision slot taken, a decision waits DecisionWait and is
// shed with 429 router_overloaded; once a slot frees, decisions go on.
func TestPickerShedsWhenDecisionsAreSaturated(t *testing.T) {
	rg := newRig(t, func(_ *scoring.Options, c *Config) { c.MaxConcurrent, c.DecisionWait = 1, 10*time.Millisecond })
	rg.picker.slots <- struct{}{} // a decision in progress
	_, err := rg.picker.Decide(context.Background(), chatReq(longChat(5)))
	var he *extproc.HTTPError
	if !errors.As(err, &he) || he.Status != 429 || he.Code != codeOverloaded || !strings.Contains(string(he.Body()), "rate_limit_error") {
		t.Fatalf("err = %v, want 429 %s", err, codeOverloaded)
	}
	if rg.metrics.outcomes["overloaded"] != 1 {
		t.Errorf("outcomes %v, want overloaded once", rg.metrics.outcomes)
	}
	<-rg.picker.slots
	d, err := rg.picker.Decide(context.Background(), chatReq(longChat(5)))
	if err != nil {
		t.Fatalf("after the slot freed: %v", err)
	}
	d.Ticket.Free(extproc.OutcomeOK)
	if len(rg.picker.slots) != 0 {
		t.Errorf("%d slots held after the decisions ended", len(rg.picker.slots))
	}
}
