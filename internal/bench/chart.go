package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
)

// palette colours modes in run order.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"}

// Chart geometry: a TTFT CDF panel on the left, hit-rate bars on the right.
const (
	chartW, chartH         = 960, 420
	cdfX0, cdfX1           = 70, 600
	barX0, barX1           = 680, 930
	plotY0, plotY1         = 50, 360
	chartTitleY, axisLabel = 28, 400
)

// WriteSVG draws the report as a self-contained SVG: the TTFT CDF of every
// mode on a log time axis, and each mode's hit rate as a bar with the
// reference rates as dashed lines.
func (r *Report) WriteSVG(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", chartW, chartH, chartW, chartH)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="15" font-weight="bold">Time to first token (CDF)</text>`+"\n", cdfX0, chartTitleY)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="15" font-weight="bold">Prefix-cache hit rate</text>`+"\n", barX0, chartTitleY)
	r.cdfPanel(&b)
	r.barPanel(&b)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return nil
}

// WriteSVGFile writes the chart to path.
func (r *Report) WriteSVGFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	if err := r.WriteSVG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (r *Report) cdfPanel(b *strings.Builder) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, name := range r.Order {
		for _, v := range r.Modes[name].TTFTSamples {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		fmt.Fprintf(b, `<text x="%d" y="%d">no successful requests</text>`+"\n", cdfX0+20, (plotY0+plotY1)/2)
		return
	}
	// Decade-aligned log axis.
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 0.1))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	x := func(v float64) float64 {
		v = math.Max(v, lo)
		return cdfX0 + (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(cdfX1-cdfX0)
	}
	y := func(q float64) float64 { return plotY1 - q*(plotY1-plotY0) }
	axes(b, cdfX0, cdfX1)
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(d), plotY0, x(d), plotY1, x(d), plotY1+16, fmtMillis(d))
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n",
			cdfX0, y(q), cdfX1, y(q), cdfX0-6, y(q)+4, q*100)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">TTFT (log scale)</text>`+"\n", (cdfX0+cdfX1)/2, axisLabel)
	for i, name := range r.Order {
		s := r.Modes[name].TTFTSamples
		if len(s) == 0 {
			continue
		}
		var pts strings.Builder
		fmt.Fprintf(&pts, "%.1f,%.1f", x(s[0]), y(0))
		step := max(1, len(s)/400)
		for j := 0; j < len(s); j += step {
			fmt.Fprintf(&pts, " %.1f,%.1f", x(s[j]), y(float64(j+1)/float64(len(s))))
		}
		fmt.Fprintf(&pts, " %.1f,%.1f", x(s[len(s)-1]), y(1))
		c := palette[i%len(palette)]
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, pts.String())
		ly := plotY0 + 10 + 18*i
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d">%s (p90 %s)</text>`+"\n",
			cdfX0+10, ly-4, c, cdfX0+30, ly+1, html.EscapeString(name), fmtMillis(r.Modes[name].TTFT.P90))
	}
}

func (r *Report) barPanel(b *strings.Builder) {
	axes(b, barX0, barX1)
	top := 0.0
	for _, name := range r.Order {
		top = math.Max(top, r.Modes[name].HitRate)
	}
	if r.IdealHitRate != nil {
		top = math.Max(top, *r.IdealHitRate)
	}
	top = math.Min(1, math.Ceil((top+0.05)*10)/10)
	y := func(v float64) float64 { return plotY1 - v/top*(plotY1-plotY0) }
	for v := 0.0; v <= top+1e-9; v += 0.1 {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n",
			barX0, y(v), barX1, y(v), barX0-6, y(v)+4, v*100)
	}
	n := len(r.Order)
	if n == 0 {
		return
	}
	slot := float64(barX1-barX0) / float64(n)
	for i, name := range r.Order {
		m := r.Modes[name]
		bx := float64(barX0) + slot*float64(i) + slot*0.15
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n",
			bx, y(m.HitRate), slot*0.7, float64(plotY1)-y(m.HitRate), palette[i%len(palette)])
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.1f%%</text>`+"\n", bx+slot*0.35, y(m.HitRate)-4, 100*m.HitRate)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", bx+slot*0.35, plotY1+16, html.EscapeString(name))
	}
	refs := []struct {
		v     *float64
		label string
	}{{r.IdealHitRate, "infinite cache"}, {r.IdealFleet, "fleet-size LRU"}}
	for _, ref := range refs {
		if ref.v == nil {
			continue
		}
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-dasharray="5,4"/><text x="%d" y="%.1f" text-anchor="end" fill="#555">%s %.1f%%</text>`+"\n",
			barX0, y(*ref.v), barX1, y(*ref.v), barX1, y(*ref.v)-4, ref.label, 100**ref.v)
	}
}

func axes(b *strings.Builder, x0, x1 int) {
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n",
		x0, plotY1, x1, plotY1, x0, plotY0, x0, plotY1)
}

// fmtMillis prints a duration given in ms compactly (0.5ms, 20ms, 3s).
func fmtMillis(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", math.Round(v/100)/10)
	case v >= 1:
		return fmt.Sprintf("%gms", math.Round(v))
	default:
		return fmt.Sprintf("%gms", math.Round(v*100)/100)
	}
}
