package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/sim"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// fixedReport is a two-mode report with known numbers.
func fixedReport() *Report {
	w := &Workload{Name: "trace", Params: map[string]any{"time_scale": 5.0, "trace": "conversation.jsonl"}}
	w.Flows = []Flow{{Items: []Item{{}, {}}}}
	rep := NewReport(w, Ideal{Infinite: 0.25, Fleet: 0.2}, true, map[string]any{
		"workers": 2, "kv_blocks_per_worker": 64, "block_size": 16, "worker_speedup": 5.0, "load": 1.5})
	// The second request follows the first; predictions, when given, are
	// right for the first request only.
	mk := func(worker string, ttft []time.Duration, cached int, predict bool) *ModeResult {
		var rs []Result
		for i, d := range ttft {
			rs = append(rs, Result{TTFT: d, E2E: 2 * d, ITL: []float32{1, 3}, Worker: worker, PromptTokens: 100, CachedTokens: cached, OutputTokens: 3,
				Ref: ItemRef{Item: i}})
			if i == 0 {
				rs[0].Worker = "w0"
			} else {
				rs[i].Follows = &ItemRef{Item: i - 1}
			}
			if predict {
				p := cached - 16*i
				rs[i].PredictedCached = &p
			}
		}
		rs = append(rs, Result{Err: io.ErrUnexpectedEOF})
		m := Measure(rs, 2*time.Second)
		return &m
	}
	rep.Add("round_robin", mk("w1", []time.Duration{100 * time.Millisecond, 300 * time.Millisecond}, 0, false))
	rep.Add("kv", mk("w0", []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}, 20, true))
	return rep
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n%s", name, got)
	}
}

func TestReportJSONHasTheIssuesShape(t *testing.T) {
	var buf bytes.Buffer
	if err := fixedReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	golden(t, "report.golden.json", buf.Bytes())
	var generic struct {
		Workload     map[string]any `json:"workload"`
		IdealHitRate float64        `json:"ideal_hit_rate"`
		Modes        map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(buf.Bytes(), &generic); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"requests", "errors", "hit_rate", "ttft_ms", "itl_ms", "e2e_ms", "output_tok_s", "worker_share", "stickiness", "overlap_exact"} {
		if _, ok := generic.Modes["kv"][key]; !ok {
			t.Errorf("mode result lacks %q", key)
		}
	}
	back, err := ReadReport(&buf)
	if err != nil || back.Modes["kv"].HitRate != 0.2 || back.Order[0] != "round_robin" {
		t.Errorf("round trip: %v %+v", err, back)
	}
}

func TestReportMarkdownTable(t *testing.T) {
	golden(t, "report.golden.md", []byte(fixedReport().Markdown()))
}

func TestReportSVGIsWellFormedWithOneCurvePerMode(t *testing.T) {
	var buf bytes.Buffer
	if err := fixedReport().WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	curves, bars := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "polyline":
				curves++
			case "rect":
				bars++
			}
		}
	}
	if curves != 2 {
		t.Errorf("%d TTFT curves, want 2", curves)
	}
	// Background, two legend swatches, two bars.
	if bars != 5 {
		t.Errorf("%d rects, want 5", bars)
	}
	for _, want := range []string{"infinite cache 25.0%", "2 workers × 64 KV blocks of 16 tokens · speedup 5× · load 1.5× · trace conversation.jsonl · 2 requests"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

// svgText is a text element's estimated bounding box.
type svgText struct {
	s                      string
	x0, y0, x1, y1, fontSz float64
}

// textBoxes parses every <text> of an SVG and estimates its box: width
// 0.6 × font size per character, from 0.8 × font size above the baseline
// to 0.2 × below.
func textBoxes(t *testing.T, svg []byte) (boxes []svgText, w, h float64) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	rootSize := 0.0
	attrs := func(se xml.StartElement) map[string]string {
		m := map[string]string{}
		for _, a := range se.Attr {
			m[a.Name.Local] = a.Value
		}
		return m
	}
	num := func(s string) float64 {
		var v float64
		if _, err := fmt.Sscan(s, &v); err != nil {
			t.Fatalf("number %q: %v", s, err)
		}
		return v
	}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		a := attrs(se)
		switch se.Name.Local {
		case "svg":
			rootSize, w, h = num(a["font-size"]), num(a["width"]), num(a["height"])
		case "text":
			var content string
			if err := dec.DecodeElement(&content, &se); err != nil {
				t.Fatal(err)
			}
			fs := rootSize
			if v, ok := a["font-size"]; ok {
				fs = num(v)
			}
			x, y := num(a["x"]), num(a["y"])
			width := textWidth(content, fs)
			switch a["text-anchor"] {
			case "middle":
				x -= width / 2
			case "end":
				x -= width
			}
			box := svgText{s: content, x0: x, y0: y - 0.8*fs, x1: x + width, y1: y + 0.2*fs, fontSz: fs}
			if tr := a["transform"]; tr != "" {
				// Only a quarter turn about the anchor, as axis titles use.
				if !strings.HasPrefix(tr, "rotate(-90 ") {
					t.Fatalf("text %q: transform %q not understood", content, tr)
				}
				ax, ay := num(a["x"]), num(a["y"])
				// (dx, dy) turns to (dy, -dx) about the anchor.
				box = svgText{s: content, x0: ax + (box.y0 - ay), x1: ax + (box.y1 - ay), y0: ay - (box.x1 - ax), y1: ay - (box.x0 - ax), fontSz: fs}
			}
			boxes = append(boxes, box)
		}
	}
	return boxes, w, h
}

func TestChartLabelsDoNotOverlap(t *testing.T) {
	long := func(i int) string { return fmt.Sprintf("kv_without_events_and_a_rather_long_experimental_name_%d", i) }
	for _, tc := range []struct {
		name  string
		modes int
		names func(int) string
		ttft  []time.Duration
	}{
		{"two short modes", 2, func(i int) string { return []string{"round_robin", "kv"}[i] }, []time.Duration{3 * time.Millisecond, 2 * time.Second}},
		{"nine long modes", 9, long, []time.Duration{time.Millisecond, 40 * time.Second}},
		{"sixteen long modes over ten decades", 16, long, []time.Duration{100 * time.Microsecond, 1000 * time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Workload{Name: "trace", Params: map[string]any{"trace": strings.Repeat("a-very-long-trace-file-name/", 12) + "trace.jsonl"}}
			w.Flows = []Flow{{Items: []Item{{}}}}
			rep := NewReport(w, Ideal{Infinite: 0.81, Fleet: 0.8}, true, map[string]any{
				"workers": 16, "kv_blocks_per_worker": 5632, "block_size": 64, "worker_speedup": 5, "load": 2})
			for i := range tc.modes {
				var rs []Result
				for _, d := range tc.ttft {
					rs = append(rs, Result{TTFT: d, Worker: "w", PromptTokens: 100, CachedTokens: 80 - i})
				}
				m := Measure(rs, time.Second)
				rep.Add(tc.names(i), &m)
			}
			var buf bytes.Buffer
			if err := rep.WriteSVG(&buf); err != nil {
				t.Fatal(err)
			}
			boxes, cw, ch := textBoxes(t, buf.Bytes())
			if len(boxes) < 10 {
				t.Fatalf("only %d labels", len(boxes))
			}
			for i, a := range boxes {
				if a.x0 < 0 || a.y0 < 0 || a.x1 > cw || a.y1 > ch {
					t.Errorf("%q (%.0f,%.0f)-(%.0f,%.0f) leaves the %.0f×%.0f canvas", a.s, a.x0, a.y0, a.x1, a.y1, cw, ch)
				}
				for _, b := range boxes[i+1:] {
					if a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1 {
						t.Errorf("%q overlaps %q", a.s, b.s)
					}
				}
			}
		})
	}
}

func TestChatTurnsExtendTheConversationsPrompt(t *testing.T) {
	enc, err := sim.LoadChatEncoder("../../tokenizer/testdata/qwen3", "")
	if err != nil {
		t.Fatal(err)
	}
	w, err := ChatWorkload(ChatOptions{Model: DefaultModel, Sessions: 2, Turns: 3, SystemPrompts: 1, SystemWords: 100,
		UserWords: 20, ReplyWords: 30, OutputTokens: 8, Encode: enc.EncodeChat, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	for s, fl := range w.Flows {
		for i := 1; i < len(fl.Items); i++ {
			prev, cur := fl.Items[i-1].Prompt, fl.Items[i].Prompt
			n := 0
			for n < len(prev) && n < len(cur) && prev[n] == cur[n] {
				n++
			}
			if f := fl.Items[i].Follows; f == nil || *f != (ItemRef{Flow: s, Item: i - 1}) {
				t.Errorf("session %d turn %d follows %v, want the previous turn", s, i, f)
			}
			if len(cur) <= len(prev) || n < len(prev)*9/10 {
				t.Errorf("session %d turn %d: %d tokens share %d with the previous turn's %d", s, i, len(cur), n, len(prev))
			}
		}
	}
	// Both sessions share the system prompt, so the second session's first
	// turn hits in an infinite cache.
	ideal, ok := IdealHitRates(w, 16, 1<<20)
	if !ok || ideal.Infinite <= 0.3 {
		t.Errorf("infinite-cache reference %.2f (ok %v), want the shared history to count", ideal.Infinite, ok)
	}
}

func FuzzReadReport(f *testing.F) {
	var buf bytes.Buffer
	if err := fixedReport().WriteJSON(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"modes":{},"order":["kv"]}`))
	f.Add([]byte(`{"modes":{"kv":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ReadReport(bytes.NewReader(data))
		if err != nil {
			return
		}
		_ = r.Markdown()
		if err := r.WriteSVG(io.Discard); err != nil {
			t.Fatal(err)
		}
	})
}

func TestClockLagIsFlaggedAboveTheThreshold(t *testing.T) {
	for _, tc := range []struct {
		name string
		lag  time.Duration
		wall time.Duration
		want bool
	}{
		{"none", 0, 10 * time.Second, false},
		{"under 100 ms", 90 * time.Millisecond, time.Second, false},
		{"over 100 ms in a short run", 150 * time.Millisecond, time.Second, true},
		{"under 1 % of a long run", 500 * time.Millisecond, 80 * time.Second, false},
		{"over 1 % of a long run", 900 * time.Millisecond, 80 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := fixedReport()
			m := rep.Modes["kv"]
			m.SetClockLag(map[string]time.Duration{"w0": 0, "w1": tc.lag}, tc.wall)
			rep.Add("kv", m)
			var buf bytes.Buffer
			if err := rep.WriteJSON(&buf); err != nil {
				t.Fatal(err)
			}
			back, err := ReadReport(&buf)
			if err != nil {
				t.Fatal(err)
			}
			md := rep.Markdown()
			if back.ClockLagWarning != tc.want || back.Modes["kv"].LagWarning != tc.want ||
				strings.Contains(md, "fell") != tc.want {
				t.Errorf("warning in JSON %v (mode %v), in Markdown %v; want %v\n%s", back.ClockLagWarning, back.Modes["kv"].LagWarning, strings.Contains(md, "fell"), tc.want, md)
			}
			if got := back.Modes["kv"].ClockLag["w1"]; got != tc.lag.Seconds() {
				t.Errorf("clock_lag_s w1 = %v, want %v", got, tc.lag.Seconds())
			}
		})
	}
}

func TestStickinessAndOverlapExact(t *testing.T) {
	ref := func(f, i int) *ItemRef { return &ItemRef{Flow: f, Item: i} }
	n := func(v int) *int { return &v }
	results := []Result{
		// Flow 0: three turns, the third moved to another worker.
		{Ref: ItemRef{0, 0}, Worker: "a", CachedTokens: 0, PredictedCached: n(0)},
		{Ref: ItemRef{0, 1}, Follows: ref(0, 0), Worker: "a", CachedTokens: 64, PredictedCached: n(64)},
		{Ref: ItemRef{0, 2}, Follows: ref(0, 1), Worker: "b", CachedTokens: 0, PredictedCached: n(128)},
		// Flow 1 follows flow 0's first request (a trace follow-up) and
		// stays; its second request follows a failure and is not counted.
		{Ref: ItemRef{1, 0}, Follows: ref(0, 0), Worker: "a", CachedTokens: 32},
		{Ref: ItemRef{2, 0}, Worker: "c", Err: io.EOF},
		{Ref: ItemRef{3, 0}, Follows: ref(2, 0), Worker: "c"},
	}
	m := Measure(results, time.Second)
	if m.Stickiness == nil || m.FollowUps != 3 || *m.Stickiness != 2.0/3 {
		t.Errorf("stickiness %v over %d follow-ups, want 2/3 over 3", m.Stickiness, m.FollowUps)
	}
	if m.OverlapExact == nil || m.Predicted != 3 || *m.OverlapExact != 2.0/3 {
		t.Errorf("overlap exact %v over %d predictions, want 2/3 over 3", m.OverlapExact, m.Predicted)
	}
	none := Measure(results[4:5], time.Second)
	if none.Stickiness != nil || none.OverlapExact != nil {
		t.Errorf("no follow-ups and no predictions must be null, got %v %v", none.Stickiness, none.OverlapExact)
	}
}

func TestFollowUpsOfEachWorkload(t *testing.T) {
	recs := []TraceRecord{
		{HashIDs: []int64{0, 1, 2}},    // 0: new
		{HashIDs: []int64{0, 1, 2, 3}}, // 1: continues 0
		{HashIDs: []int64{0, 5}},       // 2: shares only the root block
		{HashIDs: []int64{0, 1, 9}},    // 3: shares two with 0 and 1, latest is 1
		{HashIDs: []int64{0, 1, 2, 3}}, // 4: longest with 1
		{HashIDs: []int64{7}},          // 5: new
	}
	got := traceFollowUps(recs)
	if want := []int{-1, 0, -1, 1, 1, -1}; !slices.Equal(got, want) {
		t.Errorf("trace follow-ups %v, want %v", got, want)
	}
	wl := TraceWorkload(recs, TraceOptions{Model: DefaultModel})
	if f := wl.Flows[3].Items[0].Follows; f == nil || *f != (ItemRef{Flow: 1}) {
		t.Errorf("trace item 3 follows %v, want flow 1", f)
	}
	sp, err := SharedPrefixWorkload(SharedPrefixOptions{Model: DefaultModel, Groups: 2, PerGroup: 3, SystemTokens: 16, QuestionTokens: 4, OutputTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Flows interleave the groups: g0 g1 g0 g1 g0 g1.
	for i, fl := range sp.Flows {
		f := fl.Items[0].Follows
		switch {
		case i < 2 && f != nil:
			t.Errorf("shared-prefix flow %d follows %v, want nothing", i, f)
		case i >= 2 && (f == nil || *f != ItemRef{Flow: i - 2}):
			t.Errorf("shared-prefix flow %d follows %v, want flow %d", i, f, i-2)
		}
	}
}

// Equal reference rates are one line with one label; different ones two.
func TestChartMergesEqualReferenceLines(t *testing.T) {
	for _, tc := range []struct {
		inf, fleet float64
		lines      int
		label      string
	}{
		{0.887, 0.887, 1, "infinite cache = fleet-size LRU 88.7%"},
		{0.8871, 0.8869, 1, "infinite cache = fleet-size LRU 88.7%"},
		{0.887, 0.80, 2, "fleet-size LRU 80.0%"},
	} {
		r := fixedReport()
		r.IdealHitRate, r.IdealFleet = &tc.inf, &tc.fleet
		var buf bytes.Buffer
		if err := r.WriteSVG(&buf); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(buf.String(), `stroke="#555" stroke-dasharray`); n != 2*tc.lines {
			t.Errorf("%v/%v: %d dashed lines (plot and legend), want %d", tc.inf, tc.fleet, n, 2*tc.lines)
		}
		if !strings.Contains(buf.String(), tc.label) {
			t.Errorf("%v/%v: no %q", tc.inf, tc.fleet, tc.label)
		}
	}
}

// Both panels name their axes, bars carry their mode's name, and a mode
// keeps its colour whatever the run order.
func TestChartLabelsAxesAndColoursModesByName(t *testing.T) {
	r := fixedReport()
	var buf bytes.Buffer
	if err := r.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	for _, want := range []string{"TTFT (log scale)", "requests answered (cumulative)", "prompt tokens served from cache"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks the axis title %q", want)
		}
	}
	colors := ModeColors(r.Order)
	for _, m := range r.Order {
		if !strings.Contains(svg, `>`+m+`</text>`) {
			t.Errorf("no label %q under its bar", m)
		}
		if !strings.Contains(svg, `fill="`+colors[m]+`"`) {
			t.Errorf("%s's bar is not %s", m, colors[m])
		}
	}
	if c := ModeColors([]string{"round-robin", "kv", "gie-epp", "sglang"}); c["kv"] != "#1f77b4" || c["round-robin"] != ModeColors([]string{"round_robin"})["round_robin"] || c["gie-epp"] == c["sglang"] {
		t.Errorf("ModeColors = %v", c)
	}
}

// When kvsim fell behind real time in either mode, the summary compares
// hit rates but makes no latency claim, whichever mode the times favour.
func TestComparisonMakesNoLatencyClaimWhenWorkersLagged(t *testing.T) {
	r := fixedReport()
	if c := r.Comparison(); !strings.Contains(c, "p99 10.00× lower (30 vs 300 ms)") {
		t.Fatalf("without lag the summary compares p50, p90 and p99: %s", c)
	}
	for _, lagged := range r.Order {
		r := fixedReport()
		r.Modes[lagged].LagWarning = true
		c := r.Comparison()
		if strings.Contains(c, "× lower") || strings.Contains(c, "× higher") || !strings.Contains(c, "TTFT not compared: kvsim fell behind real time in "+lagged) {
			t.Errorf("lag in %s: %s", lagged, c)
		}
		if !strings.Contains(c, "hit rate 20.0 % vs 0.0 %") {
			t.Errorf("lag in %s: hit rates no longer compared: %s", lagged, c)
		}
	}
}

// A mode whose workers fell behind real time keeps its numbers in the
// table, marked, and its TTFT curve is left out of the chart with a note.
func TestReportMarksAModeWhoseWorkersFellBehind(t *testing.T) {
	rep := fixedReport()
	var svg strings.Builder
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(svg.String(), "<polyline"); n != 2 {
		t.Fatalf("%d TTFT curves without lag, want 2", n)
	}
	kv := rep.Modes["kv"]
	kv.LagWarning, kv.ClockLag = true, map[string]float64{"w0": 1.25}
	rep.ClockLagWarning = true
	md := rep.Markdown()
	if !strings.Contains(md, "| ⚠ 10 / 30 / 30 |") || strings.Contains(md, "| ⚠ 100 / 300 / 300 |") {
		t.Errorf("kv's times not marked, or round robin's marked too:\n%s", md)
	}
	if !strings.Contains(md, "⚠: a kvsim worker fell behind real time") {
		t.Errorf("the mark is not explained:\n%s", md)
	}
	svg.Reset()
	if err := rep.WriteSVG(&svg); err != nil {
		t.Fatal(err)
	}
	out := svg.String()
	if n := strings.Count(out, "<polyline"); n != 1 {
		t.Errorf("%d TTFT curves with kv lagging, want round robin's alone", n)
	}
	for _, want := range []string{"kv&#39;s TTFT is not drawn: kvsim worker w0 fell 1.25 s behind real time", "TTFT unreliable (not drawn)"} {
		if !strings.Contains(out, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
}

func TestProgressCountsRunsWhenTold(t *testing.T) {
	var b strings.Builder
	p := NewProgressLines(&b, "sweep", 4, time.Nanosecond).Counting("runs")
	p.Update(4, 0)
	if got := b.String(); !strings.Contains(got, "4/4 runs") || strings.Contains(got, "requests") || strings.Contains(got, "errors") {
		t.Errorf("progress line %q, want runs without requests or errors", got)
	}
}
