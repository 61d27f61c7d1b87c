package vsim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/kvroute/kvroute/internal/bench"
)

// WriteJSON writes the report, indented. Maps are written with sorted keys,
// so equal reports give equal bytes.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteFile writes the report as JSON to path, and the Markdown and SVG
// beside it (path with .md and .svg in place of .json).
func (r *Report) WriteFile(path string) error {
	stem := strings.TrimSuffix(path, ".json")
	var b strings.Builder
	if err := r.WriteJSON(&b); err != nil {
		return err
	}
	for _, f := range []struct{ name, body string }{
		{path, b.String()}, {stem + ".md", r.Markdown()}, {stem + ".svg", r.SVG()},
	} {
		if err := os.WriteFile(f.name, []byte(f.body), 0o644); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	return nil
}

// SetupLine describes the simulated system in one line. It names the
// timing when it is not the default polynomial.
func (r *Report) SetupLine() string {
	s := r.Setup
	line := fmt.Sprintf("%v: %v requests · %v workers × %v blocks of %v tokens · events %v ms late · virtual time, seed %v",
		r.Workload["name"], r.Workload["requests"], s["workers"], s["kv_blocks"], s["block_size"], s["event_lag_ms"], s["seed"])
	if t, ok := s["timing"]; ok && t != polynomialLabel {
		line += fmt.Sprintf(" · timing %v", t)
	}
	return line
}

// Markdown renders the sweep: one table per mode (load rows), the goodput
// line and the reference hit rates.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", r.SetupLine())
	fmt.Fprintf(&b, "Reference hit rates: infinite cache %.1f %%, fleet-capacity LRU %.1f %%. SLO: TTFT p90 ≤ %s.\n\n",
		100*r.IdealHitRate, 100*r.IdealFleet, fmtMs(r.SLO.TTFTP90Ms))
	b.WriteString("| load | mode | hit rate | first turns / later | TTFT p50 / p90 / p99 | ITL p50 | E2E p90 | stickiness | same worker | overlap exact | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for li, l := range r.Loads {
		for _, m := range r.Order {
			p := r.Sweep[m][li]
			later, same := "–", "–"
			if p.FollowUpHitRate > 0 || p.SameWorker > 0 {
				later, same = fmt.Sprintf("%.1f %%", 100*p.FollowUpHitRate), fmt.Sprintf("%.0f %%", 100*p.SameWorker)
			}
			fmt.Fprintf(&b, "| %g | %s | %.1f %% | %.1f %% / %s | %s / %s / %s | %s | %s | %.0f %% | %s | %.0f %% | %d |\n", l, m, 100*p.HitRate,
				100*p.FirstTurnHitRate, later, fmtMs(p.TTFT.P50), fmtMs(p.TTFT.P90), fmtMs(p.TTFT.P99), fmtMs(p.ITL.P50), fmtMs(p.E2E.P90),
				100*p.Stickiness, same, 100*p.OverlapExact, p.Errors)
		}
	}
	r.legendMarkdown(&b)
	b.WriteString("\nGoodput (highest load meeting the SLO): ")
	for i, m := range r.Order {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %g", m, r.Goodput[m])
	}
	b.WriteString("\n")
	r.routerCostMarkdown(&b)
	return b.String()
}

// sweepLegend explains every column of the sweep table once
// (docs/routing.md, "What the reports measure", says more).
const sweepLegend = "Columns: **hit rate**, prompt tokens the engines found cached ÷ prompt tokens, and split into " +
	"sessions' **first turns / later** turns (–: no later turns). **TTFT**, **ITL** and **E2E** are in simulated time; " +
	"a shed request counts in TTFT with the time it waited. **stickiness**: share of follow-ups (a session's next turn, " +
	"or a request sharing leading blocks with an earlier one) sent to a worker that held the earlier request's prefix, " +
	"among follow-ups whose prefix the chosen or the earlier worker still held; any holder counts. " +
	"**same worker**: share of sessions' later turns sent to the very worker that served the turn before (–: no later turns); " +
	"the two agree when each prefix lives on one worker and part when a prefix is on several or was evicted. " +
	"**overlap exact**: share of requests whose cached tokens kvroute's index predicts on the chosen worker equal what " +
	"its engine then found; the simulator asks the index in every mode, so round robin has a figure here where a " +
	"real-time report says n/a. **errors**: requests that got no answer, shed by the admission queue (a 429 from the " +
	"real router) or refused by the engine. **events N ms late** (setup line): each KV event reaches the router's index " +
	"N ms after the engine stored or evicted the block."

// legendMarkdown writes the column legend and names every cell with errors.
func (r *Report) legendMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "\n%s\n", sweepLegend)
	var cells []string
	for li, l := range r.Loads {
		for _, m := range r.Order {
			if p := r.Sweep[m][li]; p.Errors > 0 {
				cells = append(cells, fmt.Sprintf("%s at load %g, %d of %d requests", m, l, p.Errors, p.Requests))
			}
		}
	}
	if len(cells) > 0 {
		fmt.Fprintf(b, "\nErrors (shed or refused): %s.\n", strings.Join(cells, "; "))
	}
}

func fmtMs(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.1f s", v/1000)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// SVG draws TTFT p90 against load, log-log, one line per mode, with the
// SLO as a dashed line. Labels sit in fixed rows (title, setup line,
// legend column right of the plot), so none can overlap.
func (r *Report) SVG() string {
	const (
		width, height = 860, 440
		left, top     = 70, 64
		plotW, plotH  = 560, 320
		legendX       = left + plotW + 24
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">TTFT p90 against load (%v)</text>`+"\n", left, r.Workload["name"])
	fmt.Fprintf(&b, `<text x="%d" y="42" font-size="11" fill="#555">%s</text>`+"\n", left, escape(r.SetupLine()))

	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range r.Order {
		for _, p := range r.Sweep[m] {
			if p.TTFT.P90 > 0 {
				lo, hi = math.Min(lo, p.TTFT.P90), math.Max(hi, p.TTFT.P90)
			}
		}
	}
	if r.SLO.TTFTP90Ms > 0 {
		lo, hi = math.Min(lo, r.SLO.TTFTP90Ms), math.Max(hi, r.SLO.TTFTP90Ms)
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	xlo, xhi := math.Log2(r.Loads[0]), math.Log2(r.Loads[len(r.Loads)-1])
	if xhi <= xlo {
		xhi = xlo + 1
	}
	x := func(load float64) float64 { return left + (math.Log2(load)-xlo)/(xhi-xlo)*plotW }
	y := logAxis{lo: ylo, hi: yhi, px0: top + plotH, px1: top}.pos
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, plotW, plotH)
	for e := ylo; e <= yhi; e++ {
		v := math.Pow(10, e)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+plotW, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, fmtMs(v))
	}
	for _, l := range r.Loads {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g×</text>`+"\n", x(l), top+plotH+18, l)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">load (× the workload's arrival rate)</text>`+"\n", left+plotW/2, top+plotH+38)
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">TTFT p90 (log scale)</text>`+"\n", top+plotH/2, top+plotH/2)
	if r.SLO.TTFTP90Ms > 0 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#000" stroke-dasharray="6,4"/>`+"\n",
			left, left+plotW, y(r.SLO.TTFTP90Ms), y(r.SLO.TTFTP90Ms))
	}
	colors := bench.ModeColors(r.Order)
	for i, m := range r.Order {
		c := colors[m]
		var pts []string
		for _, p := range r.Sweep[m] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.Load), y(p.TTFT.P90)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		for _, p := range r.Sweep[m] {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.Load), y(p.TTFT.P90), c)
		}
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", legendX, legendX+20, ly, ly, c)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (goodput %g×)</text>`+"\n", legendX+26, ly+4, escape(m), r.Goodput[m])
	}
	ly := top + 10 + 20*len(r.Order)
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#000" stroke-dasharray="6,4"/>`+"\n", legendX, legendX+20, ly, ly)
	fmt.Fprintf(&b, `<text x="%d" y="%d">SLO %s</text>`+"\n", legendX+26, ly+4, fmtMs(r.SLO.TTFTP90Ms))
	b.WriteString("</svg>\n")
	return b.String()
}

// logAxis maps a value to a pixel on a log10 axis whose ends are the
// decades 10^lo and 10^hi at pixels px0 and px1; values below the axis sit
// on its low end.
type logAxis struct {
	lo, hi   float64 // decade exponents
	px0, px1 float64
}

func (a logAxis) pos(v float64) float64 {
	e := a.lo
	if v > 0 {
		e = math.Max(math.Log10(v), a.lo)
	}
	return a.px0 + (e-a.lo)/(a.hi-a.lo)*(a.px1-a.px0)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
