package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Report is the outcome of an A/B run. Its JSON form is
//
//	{"workload": {...}, "ideal_hit_rate": x, "ideal_hit_rate_fleet": y,
//	 "modes": {"<mode>": {"requests": n, "errors": n, "hit_rate": x,
//	   "ttft_ms": {"p50":..,"p90":..,"p99":..,"mean":..}, "itl_ms": {...},
//	   "e2e_ms": {...}, "output_tok_s": x, "worker_share": {"w0": x, ...}}}}
//
// ideal_hit_rate is the infinite-cache reference; null when the workload's
// prompts are unknown (chat without a tokenizer).
type Report struct {
	Workload map[string]any `json:"workload"`
	// IdealHitRate is the infinite-cache reference, IdealFleet the LRU of
	// the fleet's capacity; nil when unknown.
	IdealHitRate *float64 `json:"ideal_hit_rate"`
	IdealFleet   *float64 `json:"ideal_hit_rate_fleet"`
	// Setup describes the system measured (workers, cache sizes, speedup).
	Setup map[string]any `json:"setup,omitempty"`
	// Note is free text printed under the table (e.g. how to read times).
	Note string `json:"note,omitempty"`
	// ClockLagWarning is set when, in some mode, a simulated worker fell
	// behind real time by more than 100 ms and 1 % of the run (see
	// ModeResult.ClockLag): that mode's times are stretched.
	ClockLagWarning bool `json:"clock_lag_warning"`
	// Order lists the modes in the order they ran.
	Order []string               `json:"order"`
	Modes map[string]*ModeResult `json:"modes"`
}

// NewReport starts a report for a workload and its reference rates.
func NewReport(w *Workload, ideal Ideal, haveIdeal bool, setup map[string]any) *Report {
	r := &Report{Workload: map[string]any{"name": w.Name, "requests": w.Requests()}, Setup: setup, Modes: map[string]*ModeResult{}}
	for k, v := range w.Params {
		r.Workload[k] = v
	}
	if haveIdeal {
		inf, fl := ideal.Infinite, ideal.Fleet
		r.IdealHitRate, r.IdealFleet = &inf, &fl
	}
	return r
}

// Add records a mode's result.
func (r *Report) Add(mode string, m *ModeResult) {
	if _, ok := r.Modes[mode]; !ok {
		r.Order = append(r.Order, mode)
	}
	r.Modes[mode] = m
	if m.LagWarning {
		r.ClockLagWarning = true
	}
}

// LagWarnings returns one line per mode whose workers fell behind real
// time, naming the worst worker; nil when none did.
func (r *Report) LagWarnings() []string {
	var out []string
	for _, name := range r.Order {
		m := r.Modes[name]
		if !m.LagWarning {
			continue
		}
		id, secs := m.WorstLag()
		out = append(out, fmt.Sprintf("warning: in mode %s, kvsim worker %s fell %.2f s behind real time in a %.1f s run (kvsim_clock_lag_seconds_total): its timings are stretched; lower --speedup or free CPU",
			name, id, secs, m.WallSeconds))
	}
	return out
}

// WriteJSON writes the report, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// WriteJSONFile writes the report to path.
func (r *Report) WriteJSONFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := r.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// ReadReport decodes a JSON report.
func ReadReport(rd io.Reader) (*Report, error) {
	var r Report
	dec := json.NewDecoder(rd)
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	if r.Modes == nil {
		return nil, fmt.Errorf("read report: no modes")
	}
	for _, m := range r.Order {
		if r.Modes[m] == nil {
			return nil, fmt.Errorf("read report: mode %q in order has no result", m)
		}
	}
	return &r, nil
}

// SetupLine says in one line what was measured: workers, KV blocks per
// worker and block size, speedup and load, the workload (trace file or
// bundled name) and the number of requests. Parts the report does not know
// are left out.
func (r *Report) SetupLine() string {
	var parts []string
	get := func(m map[string]any, keys ...string) (any, bool) {
		for _, k := range keys {
			if v, ok := m[k]; ok && v != nil && v != "" {
				return v, true
			}
		}
		return nil, false
	}
	workers, hasW := get(r.Setup, "workers")
	blocks, hasB := get(r.Setup, "kv_blocks_per_worker")
	bs, hasBS := get(r.Setup, "block_size")
	switch {
	case hasW && hasB && hasBS:
		parts = append(parts, fmt.Sprintf("%v workers × %v KV blocks of %v tokens", workers, blocks, bs))
	case hasW:
		parts = append(parts, fmt.Sprintf("%v workers", workers))
	case hasBS:
		parts = append(parts, fmt.Sprintf("block size %v", bs))
	}
	if v, ok := get(r.Setup, "worker_speedup", "speedup"); ok {
		parts = append(parts, fmt.Sprintf("speedup %v×", v))
	}
	if v, ok := get(r.Setup, "load"); ok {
		parts = append(parts, fmt.Sprintf("load %v×", v))
	}
	if v, ok := get(r.Setup, "timing"); ok && v != "Dynamo mocker polynomial" {
		parts = append(parts, fmt.Sprintf("timing %v", v))
	}
	if v, ok := get(r.Workload, "trace"); ok {
		parts = append(parts, fmt.Sprintf("trace %v", v))
	} else if v, ok := get(r.Workload, "name"); ok {
		parts = append(parts, fmt.Sprintf("workload %v", v))
	}
	if v, ok := get(r.Workload, "requests"); ok {
		parts = append(parts, fmt.Sprintf("%v requests", v))
	}
	if v, ok := get(r.Setup, "url"); ok {
		parts = append(parts, fmt.Sprintf("against %v", v))
	}
	return strings.Join(parts, " · ")
}

// reportLegend explains every column of the real-time table once
// (docs/routing.md, "What the reports measure", says more).
const reportLegend = "Columns: requests sent and errors among them (no 200 answer, or a broken stream); " +
	"hit rate: prompt tokens the workers reported cached ÷ prompt tokens; " +
	"stickiness: share of follow-up requests (next turn, same prefix) served by the worker that served the request they follow; " +
	"overlap exact: share of requests whose router-predicted cached tokens equal the worker's reported cached_tokens, among requests the router predicted for " +
	"(n/a: the mode made no prediction, as round robin never matches the prompt); " +
	"TTFT, ITL (per streamed event) and E2E percentiles in wall-clock ms; output tok/s over the run; worker share: requests each worker served."

// Markdown renders the comparison table, one row per mode in run order.
func (r *Report) Markdown() string {
	var b strings.Builder
	if s := r.SetupLine(); s != "" {
		fmt.Fprintf(&b, "**Setup:** %s\n\n", s)
	}
	b.WriteString("| mode | requests | errors | hit rate | stickiness | overlap exact | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) | E2E p50 / p90 / p99 (ms) | output tok/s | worker share |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, name := range r.Order {
		m := r.Modes[name]
		// A mode whose workers fell behind real time keeps its numbers,
		// marked: they are stretched, not measured latencies.
		mark := ""
		if m.LagWarning {
			mark = "⚠ "
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f %% | %s | %s | %s%.0f / %.0f / %.0f | %s%.1f / %.1f / %.1f | %s%.0f / %.0f / %.0f | %s%.0f | %s |\n",
			name, m.Requests, m.Errors, 100*m.HitRate, pct(m.Stickiness), pct(m.OverlapExact), mark, m.TTFT.P50, m.TTFT.P90, m.TTFT.P99,
			mark, m.ITL.P50, m.ITL.P90, m.ITL.P99, mark, m.E2E.P50, m.E2E.P90, m.E2E.P99, mark, m.OutputTokS, shareString(m.WorkerShare))
	}
	b.WriteString("\n" + reportLegend)
	if r.ClockLagWarning {
		b.WriteString(" ⚠: a kvsim worker fell behind real time in that mode (warning below); its times are stretched, not measured.")
	}
	b.WriteString("\n")
	for _, name := range r.Order {
		if m := r.Modes[name]; m.Errors > 0 && m.FirstError != "" {
			fmt.Fprintf(&b, "\nErrors in %s: %d of %d requests failed; the first: %s\n", name, m.Errors, m.Requests, m.FirstError)
		}
	}
	switch {
	case r.IdealHitRate != nil && r.IdealFleet != nil:
		fmt.Fprintf(&b, "\nReference hit rates for this workload: %.1f %% with an infinite cache, %.1f %% with one LRU cache the size of the whole fleet.\n",
			100**r.IdealHitRate, 100**r.IdealFleet)
	case r.IdealHitRate != nil:
		fmt.Fprintf(&b, "\nReference hit rate for this workload: %.1f %% with an infinite cache.\n", 100**r.IdealHitRate)
	}
	if peaks := r.peaksTable(); peaks != "" {
		fmt.Fprintf(&b, "\n%s\nPeaks, per worker from its load reports: the most requests running and waiting at once, and the highest share of its KV cache in use (near 100 %% the engine preempts and recomputes).\n", peaks)
	}
	for _, w := range r.LagWarnings() {
		fmt.Fprintf(&b, "\n**%s**\n", w)
	}
	if cmp := r.Comparison(); cmp != "" {
		fmt.Fprintf(&b, "\n%s", cmp)
	}
	if r.Note != "" {
		fmt.Fprintf(&b, "\n%s\n", r.Note)
	}
	return b.String()
}

// peaksTable lists each mode's worst worker states: requests running and
// waiting, and KV pool usage (near 100 % the engine preempts and recomputes).
func (r *Report) peaksTable() string {
	var b strings.Builder
	for _, name := range r.Order {
		m := r.Modes[name]
		if len(m.Peaks) == 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("| mode | peak running / waiting / KV use per worker |\n|---|---|\n")
		}
		parts := make([]string, 0, len(m.Peaks))
		for _, id := range sortedKeys(m.Peaks) {
			p := m.Peaks[id]
			parts = append(parts, fmt.Sprintf("%s %d / %d / %.0f%%", id, p.Running, p.Waiting, 100*p.KVUsage))
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(parts, ", "))
	}
	return b.String()
}

// Comparison states, for every mode after the first, how it did against
// the first (the baseline): hit rate, TTFT p50 and p90 as ratios, and the
// share of the fleet-capacity reference it reached. The words are computed,
// not chosen: "lower" and "higher" follow the numbers.
func (r *Report) Comparison() string {
	if len(r.Order) < 2 {
		return ""
	}
	base := r.Modes[r.Order[0]]
	var b strings.Builder
	for _, name := range r.Order[1:] {
		m := r.Modes[name]
		fmt.Fprintf(&b, "- %s vs %s: hit rate %.1f %% vs %.1f %%; stickiness %s vs %s; overlap exact %s vs %s; ",
			name, r.Order[0], 100*m.HitRate, 100*base.HitRate, pct(m.Stickiness), pct(base.Stickiness),
			pct(m.OverlapExact), pct(base.OverlapExact))
		// A worker that fell behind real time stretched its mode's times:
		// no latency claim then, whichever mode it favours.
		if lagged := laggedOf(r.Order[0], base, name, m); lagged != "" {
			fmt.Fprintf(&b, "TTFT not compared: kvsim fell behind real time in %s, so its times are unreliable", lagged)
		} else {
			fmt.Fprintf(&b, "TTFT p50 %s, p90 %s, p99 %s", ratio(m.TTFT.P50, base.TTFT.P50), ratio(m.TTFT.P90, base.TTFT.P90), ratio(m.TTFT.P99, base.TTFT.P99))
		}
		if r.IdealFleet != nil && *r.IdealFleet > 0 {
			fmt.Fprintf(&b, "; %.0f %% of the fleet-capacity reference", 100*m.HitRate / *r.IdealFleet)
		}
		b.WriteString(".\n")
	}
	return b.String()
}

// laggedOf names the modes, of two, whose workers fell behind real time.
func laggedOf(aName string, a *ModeResult, bName string, b *ModeResult) string {
	var out []string
	if a.LagWarning {
		out = append(out, aName)
	}
	if b.LagWarning {
		out = append(out, bName)
	}
	return strings.Join(out, " and ")
}

// ratio says how a latency compares with the baseline's.
func ratio(v, base float64) string {
	switch {
	case v <= 0 || base <= 0:
		return "n/a"
	case v < base:
		return fmt.Sprintf("%.2f× lower (%.0f vs %.0f ms)", base/v, v, base)
	case v > base:
		return fmt.Sprintf("%.2f× higher (%.0f vs %.0f ms)", v/base, v, base)
	}
	return fmt.Sprintf("equal (%.0f ms)", v)
}

// pct prints a share as a percentage, "n/a" when unknown.
func pct(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f %%", 100**v)
}

func shareString(s map[string]float64) string {
	parts := make([]string, 0, len(s))
	for _, k := range sortedKeys(s) {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", k, 100*s[k]))
	}
	return strings.Join(parts, " ")
}
