package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	bufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/buffer/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
)

// HopConfig measures what kvroute adds to a request's path through Envoy:
// the same Envoy bootstrap with and without the ext_proc filter, in front
// of upstreams that answer at once, at fixed request rates.
type HopConfig struct {
	// Workers is the number of upstreams (default 4).
	Workers int
	// TokenizerDir is the router's tokenizer for Model.
	TokenizerDir string
	// Model is the model name requests carry (default DefaultModel).
	Model string
	// Rates are the offered request rates per second.
	Rates []float64
	// Duration is how long each rate is offered per round (default 5 s).
	Duration time.Duration
	// Rounds alternates the two paths this many times per rate (default 3).
	Rounds int
	// Prompts are the request kinds, by name: "short" (a one-line chat),
	// "8k" (a chat of about 8,000 tokens whose start is unique per
	// request, so the router tokenizes it whole) and "stream" (the short
	// chat answered as a stream of HopStreamTokens events
	// HopStreamInterval apart: time to first byte and the gap between
	// chunks are measured instead of the whole answer).
	Prompts []string
	// RequestPathOnly takes kvroute off the response path of the routed
	// Envoy (no response headers or body sent to it), to see what the
	// response-path bookkeeping costs.
	RequestPathOnly bool
	// ResponsePath is what of each response the routed Envoy shows kvroute
	// (envoy.Options.ResponsePath; default ResponsePathObserved).
	ResponsePath string
	// Style is the bootstrap both Envoys run: envoy.StyleClusterHeader (the
	// default; request body BUFFERED) or envoy.StyleOriginalDst (request
	// body FULL_DUPLEX_STREAMED; kvroute names one endpoint, and without
	// ext_proc the client names the worker in
	// x-gateway-destination-endpoint, round robin, which the baseline
	// bootstrap lets through).
	Style string
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// Progress, when set, gets one line per measured round.
	Progress io.Writer

	// destinations are the worker addresses the baseline's client names
	// itself (style original-dst), round robin.
	destinations []string
}

// What of each response the routed Envoy shows kvroute (HopConfig.ResponsePath):
// envoy.ResponsePathObserved, the default, envoy.ResponsePathHeaders or
// envoy.ResponsePathStreamed.
const (
	ResponsePathObserved = envoy.ResponsePathObserved
	ResponsePathHeaders  = envoy.ResponsePathHeaders
	ResponsePathStreamed = envoy.ResponsePathStreamed
)

// ResponsePaths lists the values HopConfig.ResponsePath takes.
var ResponsePaths = envoy.ResponsePaths

// HopRow is one prompt kind at one offered rate: both paths' latency
// percentiles over all rounds, and what the router added.
type HopRow struct {
	Prompt string  `json:"prompt"`
	Rate   float64 `json:"rate"`
	// Baseline is Envoy round robin without ext_proc; Routed is Envoy with
	// kvroute as its ext_proc filter.
	Baseline HopStats `json:"baseline"`
	Routed   HopStats `json:"routed"`
	// AddedP50Ms and AddedP99Ms are Routed minus Baseline.
	AddedP50Ms float64 `json:"added_p50_ms"`
	AddedP99Ms float64 `json:"added_p99_ms"`
	// Streamed answers ("stream"): time to first byte and the gap between
	// chunks, Routed minus Baseline.
	AddedFirstByteP50Ms float64 `json:"added_first_byte_p50_ms,omitempty"`
	AddedFirstByteP99Ms float64 `json:"added_first_byte_p99_ms,omitempty"`
	AddedGapP50Ms       float64 `json:"added_gap_p50_ms,omitempty"`
	AddedGapP99Ms       float64 `json:"added_gap_p99_ms,omitempty"`
	// ExchangesPerRequest is how many ext_proc messages per routed request
	// Envoy held the request for (kvroute_extproc_exchanges_total with
	// blocking="true"), by phase in ExchangesByPhase; ObservedPerRequest
	// counts those it did not wait on.
	ExchangesPerRequest float64            `json:"exchanges_per_request"`
	ExchangesByPhase    map[string]float64 `json:"exchanges_by_phase"`
	ObservedPerRequest  float64            `json:"observed_per_request"`
	// KvrouteCPUUs is kvroute's CPU time per request, in µs: kvbench's own
	// process (the client, the upstreams and the in-process kvroute) on
	// the routed path minus on the baseline, per answered request; the
	// client and upstreams do the same work on both.
	KvrouteCPUUs float64 `json:"kvroute_cpu_us_per_request"`
}

// HopStats is one path's latency at one rate.
type HopStats struct {
	Sent     int     `json:"sent"`
	Errors   int     `json:"errors"`
	Achieved float64 `json:"achieved_rate"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	// Streamed answers: time to first byte, and the gap between the reads
	// that brought data (the upstream sends every HopStreamInterval).
	FirstByteP50Ms float64 `json:"first_byte_p50_ms,omitempty"`
	FirstByteP99Ms float64 `json:"first_byte_p99_ms,omitempty"`
	GapP50Ms       float64 `json:"gap_p50_ms,omitempty"`
	GapP99Ms       float64 `json:"gap_p99_ms,omitempty"`
	// EnvoyCPUUs is this path's Envoy process CPU time per answered
	// request, in µs (/proc/<pid>/stat: 10 ms ticks over the whole leg).
	EnvoyCPUUs float64 `json:"envoy_cpu_us_per_request"`
	// selfCPU is kvbench's own CPU time over this path's legs.
	selfCPU time.Duration
}

// HopReport is RunHop's result.
type HopReport struct {
	Rows []HopRow `json:"rows"`
	// PromptTokens is how many tokens the router counted in each prompt kind.
	PromptTokens map[string]int `json:"prompt_tokens"`
	// Envoy is the binary that ran.
	Envoy string `json:"envoy"`
	// Decisions is how many requests kvroute routed (its
	// kvroute_requests_total): every routed-path request, none of the
	// baseline's.
	Decisions int `json:"decisions"`
}

// Markdown renders the report as a table.
func (r *HopReport) Markdown() string {
	var b strings.Builder
	var whole, streamed []HopRow
	for _, row := range r.Rows {
		if row.Prompt == "stream" {
			streamed = append(streamed, row)
		} else {
			whole = append(whole, row)
		}
	}
	if len(whole) > 0 {
		b.WriteString("| prompt | offered req/s | Envoy alone p50 / p99 ms | Envoy + kvroute p50 / p99 ms | added p50 / p99 ms | achieved req/s (alone / kvroute) | errors |\n|---|---|---|---|---|---|---|\n")
	}
	for _, row := range whole {
		fmt.Fprintf(&b, "| %s (%d tokens) | %g | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.0f / %.0f | %d / %d |\n",
			row.Prompt, r.PromptTokens[row.Prompt], row.Rate, row.Baseline.P50Ms, row.Baseline.P99Ms, row.Routed.P50Ms, row.Routed.P99Ms,
			row.AddedP50Ms, row.AddedP99Ms, row.Baseline.Achieved, row.Routed.Achieved, row.Baseline.Errors, row.Routed.Errors)
	}
	if len(streamed) > 0 {
		if len(whole) > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "Streamed answers (%d chunks, %v apart):\n\n", HopStreamTokens, HopStreamInterval)
		b.WriteString("| offered req/s | first byte alone p50 / p99 ms | first byte + kvroute p50 / p99 ms | added first byte p50 / p99 ms | chunk gap alone p50 / p99 ms | chunk gap + kvroute p50 / p99 ms | added gap p50 / p99 ms | errors |\n|---|---|---|---|---|---|---|---|\n")
	}
	for _, row := range streamed {
		fmt.Fprintf(&b, "| %g | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %d / %d |\n",
			row.Rate, row.Baseline.FirstByteP50Ms, row.Baseline.FirstByteP99Ms, row.Routed.FirstByteP50Ms, row.Routed.FirstByteP99Ms,
			row.AddedFirstByteP50Ms, row.AddedFirstByteP99Ms, row.Baseline.GapP50Ms, row.Baseline.GapP99Ms, row.Routed.GapP50Ms, row.Routed.GapP99Ms,
			row.AddedGapP50Ms, row.AddedGapP99Ms, row.Baseline.Errors, row.Routed.Errors)
	}
	b.WriteString("\nCost per request:\n\n| prompt | offered req/s | ext_proc messages Envoy waits on (by phase) | messages not waited on | kvroute CPU µs | Envoy CPU µs (alone / + kvroute) |\n|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s | %g | %.2f (%s) | %.2f | %.0f | %.0f / %.0f |\n", row.Prompt, row.Rate, row.ExchangesPerRequest, phaseList(row.ExchangesByPhase),
			row.ObservedPerRequest, row.KvrouteCPUUs, row.Baseline.EnvoyCPUUs, row.Routed.EnvoyCPUUs)
	}
	return b.String()
}

// RunHop starts the upstreams, kvroute and two Envoys (with and without
// ext_proc) and offers each rate to both, interleaved round by round.
func RunHop(ctx context.Context, cfg HopConfig) (*HopReport, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 5 * time.Second
	}
	if cfg.Rounds <= 0 {
		cfg.Rounds = 3
	}
	if len(cfg.Prompts) == 0 {
		cfg.Prompts = []string{"short", "8k"}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Style == "" {
		cfg.Style = envoy.StyleClusterHeader
	}
	if cfg.Style != envoy.StyleClusterHeader && cfg.Style != envoy.StyleOriginalDst {
		return nil, fmt.Errorf("hop: style %q: want %s or %s", cfg.Style, envoy.StyleClusterHeader, envoy.StyleOriginalDst)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var workers []envoy.Worker
	var recs []map[string]any
	for i := range cfg.Workers {
		addr, stop, err := startInstantUpstream(cfg.Model)
		if err != nil {
			return nil, err
		}
		defer stop()
		id := fmt.Sprintf("w%d", i)
		workers = append(workers, envoy.Worker{Cluster: id, Address: addr})
		recs = append(recs, map[string]any{"id": id, "model": cfg.Model, "address": addr, "block_size": 16,
			"kv_total_blocks": 16384, "max_num_batched_tokens": 8192})
	}
	dir, err := os.MkdirTemp("", "kvbench-hop-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	wf := filepath.Join(dir, "workers.json")
	b, _ := json.Marshal(map[string]any{"workers": recs})
	if err := os.WriteFile(wf, b, 0o600); err != nil {
		return nil, err
	}
	rcfg := server.DefaultConfig()
	// Free ports throughout, the embedded NATS server's too: a fixed 4222
	// collides with any other kvroute or NATS on the machine.
	rcfg.GRPCAddr, rcfg.HTTPAddr, rcfg.AdminAddr, rcfg.EmbeddedNATSAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	rcfg.WorkersFile = wf
	rcfg.Logger = cfg.Logger.With("component", "kvroute")
	if cfg.Style == envoy.StyleOriginalDst {
		rcfg.Fallbacks = 0 // ORIGINAL_DST reads one ip:port
	}
	if cfg.TokenizerDir != "" {
		rcfg.Tokenizers = map[string]tokenizer.ModelSource{cfg.Model: {Dir: cfg.TokenizerDir}}
	}
	router, err := server.Start(ctx, rcfg)
	if err != nil {
		return nil, fmt.Errorf("start kvroute: %w", err)
	}
	defer func() { _ = router.Shutdown() }()
	if err := poll(ctx, 30*time.Second, func() (bool, error) { return router.Ready(), nil }, "kvroute to be ready"); err != nil {
		return nil, err
	}
	var edit func([]byte) ([]byte, error)
	if cfg.RequestPathOnly {
		edit = requestPathOnly
	}
	routed, err := StartEnvoy(ctx, EnvoyConfig{Style: cfg.Style, Workers: workers, ExtProcAddr: router.GRPCAddr(), Edit: edit,
		ResponsePath: cfg.ResponsePath})
	if err != nil {
		return nil, err
	}
	defer func() { _ = routed.Close() }()
	plainEdit := withoutExtProc
	if cfg.Style == envoy.StyleOriginalDst {
		plainEdit = withoutExtProcClientPicks
	}
	plain, err := StartEnvoy(ctx, EnvoyConfig{Style: cfg.Style, Workers: workers, ExtProcAddr: router.GRPCAddr(),
		Edit: plainEdit})
	if err != nil {
		return nil, err
	}
	defer func() { _ = plain.Close() }()
	bin, _ := proxy.Find()
	rep := &HopReport{PromptTokens: map[string]int{}, Envoy: bin}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	metricsURL := "http://" + router.HTTPAddr()
	if cfg.Style == envoy.StyleOriginalDst {
		for _, w := range workers {
			cfg.destinations = append(cfg.destinations, w.Address)
		}
	}
	for _, kind := range cfg.Prompts {
		body, err := hopBody(kind, cfg.Model)
		if err != nil {
			return nil, err
		}
		if n, err := promptTokens(ctx, "http://"+router.AdminAddr(), body(0)); err == nil {
			rep.PromptTokens[kind] = n
		}
		for _, rate := range cfg.Rates {
			row, err := hopRow(ctx, client, kind, rate, body, cfg, [2]*proxy.Proxy{plain, routed}, metricsURL)
			if err != nil {
				return nil, err
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Decisions, err = routerDecisions(ctx, "http://"+router.HTTPAddr())
	return rep, err
}

// hopRow offers one rate of one prompt kind to both paths, round by round,
// and measures latency, exchanges and CPU time per request.
func hopRow(ctx context.Context, client *http.Client, kind string, rate float64, body func(int) []byte, cfg HopConfig,
	paths [2]*proxy.Proxy, metricsURL string) (HopRow, error) {
	row := HopRow{Prompt: kind, Rate: rate}
	x0, o0, err := exchangeCounts(ctx, metricsURL)
	if err != nil {
		return row, err
	}
	var lat [2][]time.Duration
	var first, gaps [2][]time.Duration
	stats := [2]*HopStats{&row.Baseline, &row.Routed}
	var envoyCPU [2]time.Duration
	var answered [2]int
	for round := range cfg.Rounds {
		for i, p := range paths {
			envoyMeter := procCPU(p.PID())
			e0, err := envoyMeter()
			if err != nil {
				return row, err
			}
			s0, err := selfCPU()
			if err != nil {
				return row, err
			}
			var sent, errs, n int
			var took time.Duration
			if kind == "stream" {
				var ts []streamTiming
				ts, sent, errs, took = offerStreamed(ctx, client, p.URL()+PathChat, body, pathDest(cfg, i), rate, cfg.Duration)
				for _, t := range ts {
					first[i] = append(first[i], t.firstByte)
					gaps[i] = append(gaps[i], t.gaps...)
				}
				n = len(ts)
			} else {
				var l []time.Duration
				l, sent, errs, took = offer(ctx, client, p.URL()+PathChat, body, pathDest(cfg, i), rate, cfg.Duration)
				lat[i] = append(lat[i], l...)
				n = len(l)
			}
			s1, err := selfCPU()
			if err != nil {
				return row, err
			}
			e1, err := envoyMeter()
			if err != nil {
				return row, err
			}
			stats[i].selfCPU += s1 - s0
			envoyCPU[i] += e1 - e0
			answered[i] += n
			stats[i].Sent += sent
			stats[i].Errors += errs
			stats[i].Achieved += float64(n) / took.Seconds() / float64(cfg.Rounds)
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "hop %s %g req/s round %d/%d\n", kind, rate, round+1, cfg.Rounds)
		}
	}
	// Envoy tells kvroute of a stream's end after the client has its last
	// byte; let those messages land before counting.
	time.Sleep(200 * time.Millisecond)
	x1, o1, err := exchangeCounts(ctx, metricsURL)
	if err != nil {
		return row, err
	}
	perReq := func(d time.Duration, n int) float64 {
		if n == 0 {
			return 0
		}
		return float64(d.Microseconds()) / float64(n)
	}
	for i, st := range stats {
		st.P50Ms, st.P99Ms = hopPct(lat[i], 0.50), hopPct(lat[i], 0.99)
		st.FirstByteP50Ms, st.FirstByteP99Ms = hopPct(first[i], 0.50), hopPct(first[i], 0.99)
		st.GapP50Ms, st.GapP99Ms = hopPct(gaps[i], 0.50), hopPct(gaps[i], 0.99)
		st.EnvoyCPUUs = perReq(envoyCPU[i], answered[i])
	}
	row.AddedP50Ms, row.AddedP99Ms = row.Routed.P50Ms-row.Baseline.P50Ms, row.Routed.P99Ms-row.Baseline.P99Ms
	row.AddedFirstByteP50Ms, row.AddedFirstByteP99Ms = row.Routed.FirstByteP50Ms-row.Baseline.FirstByteP50Ms, row.Routed.FirstByteP99Ms-row.Baseline.FirstByteP99Ms
	row.AddedGapP50Ms, row.AddedGapP99Ms = row.Routed.GapP50Ms-row.Baseline.GapP50Ms, row.Routed.GapP99Ms-row.Baseline.GapP99Ms
	row.KvrouteCPUUs = perReq(row.Routed.selfCPU, answered[1]) - perReq(row.Baseline.selfCPU, answered[0])
	row.ExchangesByPhase = map[string]float64{}
	if n := float64(row.Routed.Sent); n > 0 {
		for ph, v := range x1 {
			if d := v - x0[ph]; d > 0 {
				row.ExchangesByPhase[ph] = d / n
				row.ExchangesPerRequest += d / n
			}
		}
		for ph, v := range o1 {
			row.ObservedPerRequest += (v - o0[ph]) / n
		}
	}
	return row, nil
}

// pathDest is the destination the client names itself on path i (0: the
// baseline) for request n: the original-dst baseline's round robin, else none.
func pathDest(cfg HopConfig, i int) func(n int) string {
	if i != 0 || len(cfg.destinations) == 0 {
		return nil
	}
	return func(n int) string { return cfg.destinations[n%len(cfg.destinations)] }
}

// phaseList writes exchanges per request by phase, in request order.
func phaseList(m map[string]float64) string {
	var parts []string
	for _, ph := range []string{"request_headers", "request_body", "request_trailers", "response_headers", "response_body", "response_trailers", "other"} {
		if v := m[ph]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", ph, v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// routerDecisions sums kvroute_requests_total from the router's /metrics.
func routerDecisions(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	n := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "kvroute_requests_total{") {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				n += v
			}
		}
	}
	return int(n), nil
}

// hopRequest is request n of a run: a chat POST, naming its worker in
// x-gateway-destination-endpoint when dest is set.
func hopRequest(ctx context.Context, url string, b []byte, dest func(int) string, n int) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if dest != nil {
		req.Header.Set(envoy.DestinationHeader, dest(n))
	}
	return req, nil
}

// withoutExtProcClientPicks is withoutExtProc for the original-dst style,
// whose ORIGINAL_DST cluster needs a destination: the client's own
// x-gateway-destination-endpoint is let through (the early header mutation
// that strips it goes too).
var withoutExtProcClientPicks = EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
	if err := withoutExtProcHCM(hcm); err != nil {
		return err
	}
	hcm.EarlyHeaderMutationExtensions = nil
	return nil
})

// withoutExtProc drops the ext_proc filters from a bootstrap (the routing
// one and the observing one), and the buffer filter that holds a request
// for the routing one's answer: the same Envoy path, round robin over the
// workers (the cluster-header style's fallback route), kvroute out of it.
var withoutExtProc = EditHCM(withoutExtProcHCM)

func withoutExtProcHCM(hcm *hcmv3.HttpConnectionManager) error {
	hcm.HttpFilters = slices.DeleteFunc(hcm.HttpFilters, func(h *hcmv3.HttpFilter) bool {
		tc := h.GetTypedConfig()
		return tc.MessageIs(&extprocv3.ExternalProcessor{}) || tc.MessageIs(&bufferv3.Buffer{})
	})
	return nil
}

// requestPathOnly keeps kvroute on the request path and takes it off the
// response path (no response headers or body sent to it): what the
// response-path bookkeeping costs in latency.
var requestPathOnly = EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
	hcm.HttpFilters = slices.DeleteFunc(hcm.HttpFilters, func(h *hcmv3.HttpFilter) bool {
		var ep extprocv3.ExternalProcessor
		return h.GetTypedConfig().MessageIs(&ep) && h.GetTypedConfig().UnmarshalTo(&ep) == nil && ep.GetObservabilityMode()
	})
	for _, h := range hcm.HttpFilters {
		if h.GetName() != extProcFilter {
			continue
		}
		var ep extprocv3.ExternalProcessor
		if err := h.GetTypedConfig().UnmarshalTo(&ep); err != nil {
			return err
		}
		ep.ProcessingMode.ResponseHeaderMode = extprocv3.ProcessingMode_SKIP
		ep.ProcessingMode.ResponseBodyMode = extprocv3.ProcessingMode_NONE
		if err := h.GetTypedConfig().MarshalFrom(&ep); err != nil {
			return err
		}
	}
	return nil
})

const extProcFilter = "envoy.filters.http.ext_proc"

// EditHCM returns an EnvoyConfig.Edit that applies edit to every HTTP
// connection manager of the bootstrap's static listeners.
func EditHCM(edit func(*hcmv3.HttpConnectionManager) error) func([]byte) ([]byte, error) {
	return func(data []byte) ([]byte, error) {
		b, err := envoy.ParseBootstrap(data)
		if err != nil {
			return nil, err
		}
		for _, l := range b.GetStaticResources().GetListeners() {
			for _, fc := range l.GetFilterChains() {
				for _, f := range fc.GetFilters() {
					var hcm hcmv3.HttpConnectionManager
					if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
						continue
					}
					if err := edit(&hcm); err != nil {
						return nil, err
					}
					if err := f.GetTypedConfig().MarshalFrom(&hcm); err != nil {
						return nil, err
					}
				}
			}
		}
		return protojson.Marshal(b)
	}
}

// hopBody returns the request body for the i-th request of a prompt kind.
func hopBody(kind, model string) (func(i int) []byte, error) {
	var system string
	switch kind {
	case "short", "stream":
		system = ""
	case "8k":
		var sb strings.Builder
		for i := 0; sb.Len() < 36000; i++ {
			fmt.Fprintf(&sb, "Clause %d: the operator keeps the fleet's caches warm and routes each request with care. ", i)
		}
		system = sb.String()
	default:
		return nil, fmt.Errorf("hop: unknown prompt kind %q (want short, 8k or stream)", kind)
	}
	return func(i int) []byte {
		msgs := []map[string]string{}
		if system != "" {
			// The request number first: no two prompts share a prefix, so
			// every request is tokenized in full.
			msgs = append(msgs, map[string]string{"role": "system", "content": fmt.Sprintf("Request %d. %s", i, system)})
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Hello, request %d! What is the capital of France?", i)})
		req := map[string]any{"model": model, "max_tokens": 1, "messages": msgs}
		if kind == "stream" {
			req["max_tokens"], req["stream"] = HopStreamTokens, true
		}
		b, _ := json.Marshal(req)
		return b
	}, nil
}

// promptTokens asks the router's /debug/explain how many tokens body has.
func promptTokens(ctx context.Context, adminURL string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, adminURL+"/debug/explain?path="+PathChat, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	var x struct {
		PromptTokens int `json:"prompt_tokens"`
	}
	err = json.NewDecoder(resp.Body).Decode(&x)
	return x.PromptTokens, err
}

// offer sends requests at a fixed rate (open loop) for d and returns the
// latency of each answered one.
func offer(ctx context.Context, c *http.Client, url string, body func(int) []byte, dest func(int) string, rate float64, d time.Duration) (lat []time.Duration, sent, errs int, took time.Duration) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if at.Sub(start) >= d || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Until(at))
		req, err := hopRequest(ctx, url, body(i), dest, i)
		if err != nil {
			return nil, sent, errs, time.Since(start)
		}
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := c.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			el := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs++
				return
			}
			lat = append(lat, el)
		}()
	}
	wg.Wait()
	return lat, sent, errs, time.Since(start)
}

func hopPct(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}

// startInstantUpstream serves a fixed chat completion at once: an upstream
// that costs nothing, so that only the path to it is measured. A request
// with "stream":true gets a stream of HopStreamTokens events instead,
// HopStreamInterval apart (the first at once).
func startInstantUpstream(model string) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	answer := fmt.Appendf(nil, `{"id":"chatcmpl-hop-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, model)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if bytes.Contains(b, []byte(`"stream":true`)) {
			streamAnswer(w, model)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
