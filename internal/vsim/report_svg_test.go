package vsim

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/bench"
)

// sweepReport is a two-mode sweep whose TTFT p90s run from 60 ms to 3 s,
// so the axis spans the decades 10 ms to 10 s and its lowest tick lies
// below every point.
func sweepReport() *Report {
	r := &Report{Workload: map[string]any{"name": "agent"}, Order: []string{"round_robin", "kv"}, Loads: []float64{0.5, 1, 2},
		Sweep: map[string][]Point{}, Goodput: map[string]float64{"kv": 2, "round_robin": 1}}
	r.SLO.TTFTP90Ms = 500
	for i, m := range r.Order {
		for j, l := range r.Loads {
			p := Point{Load: l}
			p.TTFT.P90 = 60 * math.Pow(7, float64(j)) / float64(i+1)
			r.Sweep[m] = append(r.Sweep[m], p)
		}
	}
	return r
}

type svgLabel struct {
	text string
	x, y float64
}

func svgLabels(t *testing.T, svg string) []svgLabel {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(svg))
	var out []svgLabel
	var cur *svgLabel
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if e.Name.Local == "text" {
				cur = &svgLabel{}
				for _, a := range e.Attr {
					v, _ := strconv.ParseFloat(a.Value, 64)
					switch a.Name.Local {
					case "x":
						cur.x = v
					case "y":
						cur.y = v
					}
				}
			}
		case xml.CharData:
			if cur != nil {
				cur.text += string(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" && cur != nil {
				out = append(out, *cur)
				cur = nil
			}
		}
	}
}

// The decade ticks of the TTFT axis are evenly spaced and where the scale
// puts their values: the lowest tick sits at 10 ms, not at the data's
// minimum (60 ms).
func TestSweepSVGLogTicksMatchTheScale(t *testing.T) {
	const top, plotH = 64, 320 // SVG's plot geometry
	ticks := map[string]float64{}
	for _, l := range svgLabels(t, sweepReport().SVG()) {
		if l.x == 70-6 {
			ticks[l.text] = l.y - 4 // labels sit 4 px below their grid line
		}
	}
	want := []string{"10 ms", "100 ms", "1.0 s", "10 s"}
	if len(ticks) != len(want) {
		t.Fatalf("ticks %v, want %v", ticks, want)
	}
	step := float64(plotH) / float64(len(want)-1)
	for i, label := range want {
		y, ok := ticks[label]
		if !ok {
			t.Fatalf("no %q tick in %v", label, ticks)
		}
		if wantY := top + plotH - float64(i)*step; math.Abs(y-wantY) > 0.11 {
			t.Errorf("tick %q at y=%.1f, want %.1f (decades %.1f px apart)", label, y, wantY, step)
		}
	}
	a := logAxis{lo: 1, hi: 4, px0: 384, px1: 64}
	for v, want := range map[float64]float64{10: 384, 100: 384 - 320.0/3, 1000: 384 - 640.0/3, 10000: 64, 5: 384, 0: 384} {
		if got := a.pos(v); math.Abs(got-want) > 1e-9 {
			t.Errorf("pos(%v) = %v, want %v", v, got, want)
		}
	}
}

// A mode has one colour in both charts: the sweep's and the A/B chart's.
func TestSweepSVGColoursModesAsTheABChart(t *testing.T) {
	svg := sweepReport().SVG()
	colors := bench.ModeColors([]string{"kv", "round_robin"})
	for _, m := range []string{"kv", "round_robin"} {
		if !strings.Contains(svg, `stroke="`+colors[m]+`" stroke-width="2" points=`) {
			t.Errorf("the %s curve is not %s", m, colors[m])
		}
	}
	if colors["kv"] == colors["round_robin"] {
		t.Fatal("two modes share a colour")
	}
	if again := bench.ModeColors([]string{"round_robin", "kv"}); again["kv"] != colors["kv"] {
		t.Errorf("kv's colour depends on the run order: %s, then %s", colors["kv"], again["kv"])
	}
}
