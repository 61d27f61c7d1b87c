package bench

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// The hop benchmark runs end to end at a low rate: both paths answer every
// request, the routed path really goes through kvroute (the router counted
// the prompt's tokens), and the baseline's bootstrap has no ext_proc.
func TestHopMeasuresBothPaths(t *testing.T) {
	rep, err := RunHop(context.Background(), HopConfig{Workers: 2, TokenizerDir: "../../tokenizer/testdata/qwen3",
		Rates: []float64{50}, Duration: 400 * time.Millisecond, Rounds: 1, Prompts: []string{"short"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rep.Rows))
	}
	r := rep.Rows[0]
	for name, st := range map[string]HopStats{"baseline": r.Baseline, "routed": r.Routed} {
		if st.Sent < 10 || st.Errors != 0 || st.P50Ms <= 0 || st.P99Ms < st.P50Ms {
			t.Errorf("%s: %+v, want ≥ 10 sent, no errors, 0 < p50 ≤ p99", name, st)
		}
	}
	if rep.Decisions != r.Routed.Sent {
		t.Errorf("kvroute routed %d requests, the routed path sent %d and the baseline %d", rep.Decisions, r.Routed.Sent, r.Baseline.Sent)
	}
	if rep.PromptTokens["short"] < 5 {
		t.Errorf("the router counted %d prompt tokens for the short chat", rep.PromptTokens["short"])
	}
	if !bytes.Contains([]byte(rep.Markdown()), []byte("| short (")) {
		t.Errorf("markdown has no short row:\n%s", rep.Markdown())
	}
}

// Streamed answers are measured by first byte and chunk gap, and the cost
// table counts the exchanges and CPU time of each routed request.
func TestHopMeasuresStreamedAnswersAndCost(t *testing.T) {
	rep, err := RunHop(context.Background(), HopConfig{Workers: 2, TokenizerDir: "../../tokenizer/testdata/qwen3",
		Rates: []float64{20}, Duration: 500 * time.Millisecond, Rounds: 1, Prompts: []string{"stream"}})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rows[0]
	for name, st := range map[string]HopStats{"baseline": r.Baseline, "routed": r.Routed} {
		if st.Sent < 5 || st.Errors != 0 || st.FirstByteP50Ms <= 0 || st.GapP50Ms < float64(HopStreamInterval.Milliseconds())/2 {
			t.Errorf("%s: %+v, want ≥ 5 sent, no errors, a first byte and gaps near %v", name, st, HopStreamInterval)
		}
	}
	// The default bootstrap: Envoy waits on the answer to the request body
	// alone; the response headers are observed without waiting.
	if r.ExchangesPerRequest != 1 || r.ExchangesByPhase["request_body"] != 1 || r.ObservedPerRequest != 1 {
		t.Errorf("%.2f exchanges per request (%v), %.2f observed; want the request body's alone, and the response headers observed",
			r.ExchangesPerRequest, r.ExchangesByPhase, r.ObservedPerRequest)
	}
	if md := rep.Markdown(); !bytes.Contains([]byte(md), []byte("Streamed answers")) || !bytes.Contains([]byte(md), []byte("Cost per request")) {
		t.Errorf("markdown lacks the streamed or cost table:\n%s", md)
	}
}

func TestParseProcStatCPU(t *testing.T) {
	stat := "4242 (envoy (x) y) S 1 4242 4242 0 -1 4194560 123 0 0 0 250 50 0 0 20 0 9 0 100 1000 10 18446744073709551615\n"
	got, err := parseProcStatCPU([]byte(stat))
	if err != nil || got != 3*time.Second {
		t.Errorf("got %v, %v; want 3s (300 ticks)", got, err)
	}
	for _, bad := range []string{"", "1 (x) S 1", "1 (x) S 1 2 3 4 5 6 7 8 9 10 -5 0", "1 (x) S 1 2 3 4 5 6 7 8 9 10 99999999999999999 0"} {
		if _, err := parseProcStatCPU([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseProcStatCPU(f *testing.F) {
	f.Add([]byte("4242 (envoy) S 1 4242 4242 0 -1 4194560 123 0 0 0 250 50 0 0 20 0 9 0 100\n"))
	f.Add([]byte("1 ((()) R"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if d, err := parseProcStatCPU(b); err == nil && d < 0 {
			t.Errorf("negative CPU time %v", d)
		}
	})
}

// The original-dst bootstrap (request body FULL_DUPLEX_STREAMED) is measured
// the same way: the baseline's client names its worker, and kvroute's
// request path is one wait of two messages.
func TestHopMeasuresOriginalDst(t *testing.T) {
	rep, err := RunHop(context.Background(), HopConfig{Workers: 2, TokenizerDir: "../../tokenizer/testdata/qwen3", Style: "original-dst",
		ResponsePath: ResponsePathHeaders,
		Rates:        []float64{40}, Duration: 400 * time.Millisecond, Rounds: 1, Prompts: []string{"short"}})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Rows[0]
	for name, st := range map[string]HopStats{"baseline": r.Baseline, "routed": r.Routed} {
		if st.Sent < 10 || st.Errors != 0 {
			t.Errorf("%s: %+v, want ≥ 10 sent, no errors", name, st)
		}
	}
	if r.ExchangesByPhase["request_headers"] != 1 || r.ExchangesByPhase["response_body"] != 0 {
		t.Errorf("exchanges by phase %v, want one request_headers and no response_body per request", r.ExchangesByPhase)
	}
}

func TestParseExchangeLine(t *testing.T) {
	phase, blocking, v, ok := parseExchangeLine(`kvroute_extproc_exchanges_total{blocking="true",phase="request_body"} 42`)
	if !ok || phase != "request_body" || !blocking || v != 42 {
		t.Errorf("got %q %v %v %v", phase, blocking, v, ok)
	}
	for _, bad := range []string{"", "# HELP kvroute_extproc_exchanges_total x", `kvroute_extproc_exchanges_total{phase="x"} NaNx`, `kvroute_requests_total{} 1`} {
		if _, _, _, ok := parseExchangeLine(bad); ok {
			t.Errorf("%q read as a sample", bad)
		}
	}
}

func FuzzParseExchangeLine(f *testing.F) {
	f.Add(`kvroute_extproc_exchanges_total{blocking="false",phase="response_body"} 3`)
	f.Add(`kvroute_extproc_exchanges_total{phase="` + "\"" + `} 1`)
	f.Fuzz(func(t *testing.T, line string) {
		if _, _, v, ok := parseExchangeLine(line); ok && v < 0 {
			t.Errorf("negative count %v", v)
		}
	})
}
