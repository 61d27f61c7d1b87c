package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
	"unicode/utf8"
)

// Chart geometry: a TTFT CDF panel on the left, hit-rate bars on the right,
// and under both a legend band (modes on the left, reference rates on the
// right) that grows with the number of modes. Nothing but value labels is
// written inside the plots, so labels cannot cover each other or the data:
// text is placed by estimating its width as 0.6 × font size per character
// and dropped or shortened when it does not fit.
const (
	chartW                 = 960
	cdfX0, cdfX1           = 70, 600
	barX0, barX1           = 680, 930
	plotY0, plotY1         = 64, 360
	titleY, subtitleY      = 24, 46
	xTickY, axisLabelY     = plotY1 + 18, plotY1 + 38
	legendY0, legendRow    = plotY1 + 66, 18
	fontSize, subtitleSize = 12, 11
	titleSize              = 15
)

// textWidth estimates the rendered width of s at font size fs.
func textWidth(s string, fs float64) float64 { return 0.6 * fs * float64(utf8.RuneCountInString(s)) }

// fit shortens s with an ellipsis so that it is at most w wide at size fs.
func fit(s string, w, fs float64) string {
	if textWidth(s, fs) <= w {
		return s
	}
	n := int(w/(0.6*fs)) - 1
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	return string(r[:min(n, len(r))]) + "…"
}

// WriteSVG draws the report as a self-contained SVG: the TTFT CDF of every
// mode on a log time axis, each mode's hit rate as a bar with the reference
// rates as dashed lines, the setup as a subtitle and a legend underneath.
//
// A mode whose simulated workers fell behind real time (ModeResult.
// LagWarning) has unreliable times: its TTFT curve is not drawn, its legend
// row says so, and a note under the legend names the worker and the lag, so
// the chart never shows a latency its run cannot support.
func (r *Report) WriteSVG(w io.Writer) error {
	rows := max(len(r.Order), 2)
	notes := r.lagNotes()
	h := legendY0 + legendRow*(rows+len(notes))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n", chartW, h, chartW, h, fontSize)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="%d" font-weight="bold">Time to first token (CDF)</text>`+"\n", cdfX0, titleY, titleSize)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="%d" font-weight="bold">Prefix-cache hit rate</text>`+"\n", barX0, titleY, titleSize)
	if s := fit(r.SetupLine(), chartW-2*cdfX0, subtitleSize); s != "" {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="%d" fill="#444">%s</text>`+"\n", cdfX0, subtitleY, subtitleSize, html.EscapeString(s))
	}
	r.cdfPanel(&b)
	r.barPanel(&b)
	r.legend(&b)
	for i, n := range notes {
		ly := legendY0 + legendRow*(rows+i) + 4
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#b00000">%s</text>`+"\n", cdfX0, ly, html.EscapeString(fit(n, chartW-cdfX0-10, fontSize)))
	}
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
		_ = f.Close()
		return err
	}
	return f.Close()
}

// lagNotes are the chart's lines on modes whose times are unreliable.
func (r *Report) lagNotes() []string {
	var out []string
	for _, name := range r.Order {
		m := r.Modes[name]
		if !m.LagWarning {
			continue
		}
		id, secs := m.WorstLag()
		out = append(out, fmt.Sprintf("%s's TTFT is not drawn: kvsim worker %s fell %.2f s behind real time in that run, so its times are unreliable.", name, id, secs))
	}
	return out
}

func (r *Report) cdfPanel(b *strings.Builder) {
	lo, hi := math.Inf(1), math.Inf(-1)
	lagged := 0
	for _, name := range r.Order {
		if r.Modes[name].LagWarning {
			lagged++
			continue
		}
		for _, v := range r.Modes[name].TTFTSamples {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		msg := "no successful requests"
		if lagged > 0 {
			msg = "no reliable times: every mode with answers fell behind real time"
		}
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", cdfX0+20, (plotY0+plotY1)/2, msg)
		return
	}
	// Decade-aligned log axis.
	lo = math.Pow(10, math.Floor(math.Log10(math.Max(lo, 0.1))))
	hi = math.Pow(10, math.Ceil(math.Log10(math.Max(hi, lo*10))))
	decades := math.Round(math.Log10(hi) - math.Log10(lo))
	x := func(v float64) float64 {
		v = math.Max(v, lo)
		return cdfX0 + (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*(cdfX1-cdfX0)
	}
	y := func(q float64) float64 { return plotY1 - q*(plotY1-plotY0) }
	axes(b, cdfX0, cdfX1)
	// Label every k-th decade so that neighbouring labels keep 8 px apart.
	widest := 0.0
	for i := 0; i <= int(decades); i++ {
		widest = math.Max(widest, textWidth(fmtMillis(lo*math.Pow(10, float64(i))), fontSize))
	}
	k := max(1, int(math.Ceil((widest+8)/((cdfX1-cdfX0)/decades))))
	for i := 0; i <= int(decades); i++ {
		d := lo * math.Pow(10, float64(i))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(d), plotY0, x(d), plotY1)
		if i%k == 0 {
			fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(d), xTickY, fmtMillis(d))
		}
	}
	for _, q := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n",
			cdfX0, y(q), cdfX1, y(q), cdfX0-6, y(q)+4, q*100)
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">TTFT (log scale)</text>`+"\n", (cdfX0+cdfX1)/2, axisLabelY)
	yLabel(b, cdfX0-44, "requests answered (cumulative)")
	colors := ModeColors(r.Order)
	for _, name := range r.Order {
		s := r.Modes[name].TTFTSamples
		if len(s) == 0 || r.Modes[name].LagWarning {
			continue
		}
		var pts strings.Builder
		fmt.Fprintf(&pts, "%.1f,%.1f", x(s[0]), y(0))
		step := max(1, len(s)/400)
		for j := 0; j < len(s); j += step {
			fmt.Fprintf(&pts, " %.1f,%.1f", x(s[j]), y(float64(j+1)/float64(len(s))))
		}
		fmt.Fprintf(&pts, " %.1f,%.1f", x(s[len(s)-1]), y(1))
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[name], pts.String())
	}
}

// barTop is the hit rate at the top of the bar panel.
func (r *Report) barTop() float64 {
	top := 0.0
	for _, name := range r.Order {
		top = math.Max(top, r.Modes[name].HitRate)
	}
	for _, ref := range []*float64{r.IdealHitRate, r.IdealFleet} {
		if ref != nil {
			top = math.Max(top, *ref)
		}
	}
	return math.Max(0.1, math.Min(1, math.Ceil((top+0.05)*10)/10))
}

// refStyles are the dash patterns of the reference lines, in legend order.
var refStyles = []string{"6,4", "2,3"}

// refRate is a reference hit rate drawn as a line.
type refRate struct {
	v     float64
	label string
}

// refs are the reference hit rates that are known. Two that round to the
// same tenth of a percent are one line with one label ("infinite cache =
// fleet-size LRU"), since two lines drawn on top of each other read as one.
func (r *Report) refs() []refRate {
	var out []refRate
	if r.IdealHitRate != nil {
		out = append(out, refRate{*r.IdealHitRate, "infinite cache"})
	}
	if r.IdealFleet != nil {
		if len(out) == 1 && math.Round(out[0].v*1000) == math.Round(*r.IdealFleet*1000) {
			out[0].label += " = fleet-size LRU"
		} else {
			out = append(out, refRate{*r.IdealFleet, "fleet-size LRU"})
		}
	}
	return out
}

func (r *Report) barPanel(b *strings.Builder) {
	axes(b, barX0, barX1)
	top := r.barTop()
	y := func(v float64) float64 { return plotY1 - math.Min(v, top)/top*(plotY1-plotY0) }
	for i := 0; i <= int(math.Round(top*10)); i++ {
		v := float64(i) / 10
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n",
			barX0, y(v), barX1, y(v), barX0-6, y(v)+4, v*100)
	}
	n := len(r.Order)
	if n == 0 {
		return
	}
	yLabel(b, barX0-44, "prompt tokens served from cache")
	colors := ModeColors(r.Order)
	slot := float64(barX1-barX0) / float64(n)
	for i, name := range r.Order {
		m := r.Modes[name]
		bx := float64(barX0) + slot*float64(i) + slot*0.15
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n",
			bx, y(m.HitRate), slot*0.7, float64(plotY1)-y(m.HitRate), colors[name])
		// The mode's name under its bar, shortened to its slot.
		if l := fit(name, slot-4, fontSize); l != "" {
			fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", bx+slot*0.35, xTickY, html.EscapeString(l))
		}
		// The value goes above its bar when it fits in the bar's slot;
		// otherwise the legend carries it.
		if v := fmt.Sprintf("%.1f%%", 100*m.HitRate); textWidth(v, fontSize) <= slot-4 {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", bx+slot*0.35, y(m.HitRate)-4, v)
		}
	}
	for i, ref := range r.refs() {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-dasharray="%s"/>`+"\n",
			barX0, y(ref.v), barX1, y(ref.v), refStyles[i%len(refStyles)])
	}
}

// legend lists, under the plots, each mode (colour, name, TTFT p90, hit
// rate) on the left and the reference lines on the right, one per row.
func (r *Report) legend(b *strings.Builder) {
	colors := ModeColors(r.Order)
	for i, name := range r.Order {
		m := r.Modes[name]
		ly := legendY0 + legendRow*i
		c := colors[name]
		stats := fmt.Sprintf(" — TTFT p90 %s, hit rate %.1f%%", fmtMillis(m.TTFT.P90), 100*m.HitRate)
		if m.LagWarning {
			stats = fmt.Sprintf(" — TTFT unreliable (not drawn), hit rate %.1f%%", 100*m.HitRate)
		}
		label := fit(name, cdfX1-cdfX0-20-textWidth(stats, fontSize), fontSize) + stats
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			cdfX0, ly-4, c, cdfX0+20, ly+1, html.EscapeString(label))
	}
	for i, ref := range r.refs() {
		ly := legendY0 + legendRow*i
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#555" stroke-dasharray="%s"/><text x="%d" y="%d" fill="#555">%s %.1f%%</text>`+"\n",
			barX0, ly-2, barX0+24, ly-2, refStyles[i%len(refStyles)], barX0+30, ly+1, ref.label, 100*ref.v)
	}
}

// yLabel writes a vertical axis title centred on the plot, at x.
func yLabel(b *strings.Builder, x int, text string) {
	cy := (plotY0 + plotY1) / 2
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)">%s</text>`+"\n", x, cy, x, cy, html.EscapeString(text))
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
