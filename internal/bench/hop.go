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
	// Prompts are the request kinds, by name: "short" (a one-line chat)
	// and "8k" (a chat of about 8,000 tokens whose start is unique per
	// request, so the router tokenizes it whole).
	Prompts []string
	// RequestPathOnly takes kvroute off the response path of the routed
	// Envoy (no response headers or body sent to it), to see what the
	// response-path bookkeeping costs.
	RequestPathOnly bool
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
	// Progress, when set, gets one line per measured round.
	Progress io.Writer
}

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
}

// HopStats is one path's latency at one rate.
type HopStats struct {
	Sent     int     `json:"sent"`
	Errors   int     `json:"errors"`
	Achieved float64 `json:"achieved_rate"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
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
	b.WriteString("| prompt | offered req/s | Envoy alone p50 / p99 ms | Envoy + kvroute p50 / p99 ms | added p50 / p99 ms | achieved req/s (alone / kvroute) | errors |\n|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		fmt.Fprintf(&b, "| %s (%d tokens) | %g | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.0f / %.0f | %d / %d |\n",
			row.Prompt, r.PromptTokens[row.Prompt], row.Rate, row.Baseline.P50Ms, row.Baseline.P99Ms, row.Routed.P50Ms, row.Routed.P99Ms,
			row.AddedP50Ms, row.AddedP99Ms, row.Baseline.Achieved, row.Routed.Achieved, row.Baseline.Errors, row.Routed.Errors)
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
	routed, err := StartEnvoy(ctx, EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: workers, ExtProcAddr: router.GRPCAddr(), Edit: edit})
	if err != nil {
		return nil, err
	}
	defer func() { _ = routed.Close() }()
	plain, err := StartEnvoy(ctx, EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: workers, ExtProcAddr: router.GRPCAddr(),
		Edit: withoutExtProc})
	if err != nil {
		return nil, err
	}
	defer func() { _ = plain.Close() }()
	bin, _ := proxy.Find()
	rep := &HopReport{PromptTokens: map[string]int{}, Envoy: bin}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0, IdleConnTimeout: time.Minute}}
	defer client.CloseIdleConnections()
	for _, kind := range cfg.Prompts {
		body, err := hopBody(kind, cfg.Model)
		if err != nil {
			return nil, err
		}
		if n, err := promptTokens(ctx, "http://"+router.AdminAddr(), body(0)); err == nil {
			rep.PromptTokens[kind] = n
		}
		for _, rate := range cfg.Rates {
			var base, via []time.Duration
			row := HopRow{Prompt: kind, Rate: rate}
			for round := range cfg.Rounds {
				for _, leg := range []struct {
					p   *proxy.Proxy
					out *[]time.Duration
					st  *HopStats
				}{{plain, &base, &row.Baseline}, {routed, &via, &row.Routed}} {
					lat, sent, errs, took := offer(ctx, client, leg.p.URL()+PathChat, body, rate, cfg.Duration)
					*leg.out = append(*leg.out, lat...)
					leg.st.Sent += sent
					leg.st.Errors += errs
					leg.st.Achieved += float64(len(lat)) / took.Seconds() / float64(cfg.Rounds)
				}
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "hop %s %g req/s round %d/%d\n", kind, rate, round+1, cfg.Rounds)
				}
			}
			row.Baseline.P50Ms, row.Baseline.P99Ms = hopPct(base, 0.50), hopPct(base, 0.99)
			row.Routed.P50Ms, row.Routed.P99Ms = hopPct(via, 0.50), hopPct(via, 0.99)
			row.AddedP50Ms, row.AddedP99Ms = row.Routed.P50Ms-row.Baseline.P50Ms, row.Routed.P99Ms-row.Baseline.P99Ms
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Decisions, err = routerDecisions(ctx, "http://"+router.HTTPAddr())
	return rep, err
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

// withoutExtProc drops the ext_proc filter from a bootstrap: the same Envoy
// path, round robin over the workers (the cluster-header style's fallback
// route), kvroute out of it.
var withoutExtProc = EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
	hcm.HttpFilters = slices.DeleteFunc(hcm.HttpFilters, func(h *hcmv3.HttpFilter) bool {
		return h.GetName() == extProcFilter
	})
	return nil
})

// requestPathOnly keeps kvroute on the request path and takes it off the
// response path (no response headers or body sent to it): what the
// response-path bookkeeping costs in latency.
var requestPathOnly = EditHCM(func(hcm *hcmv3.HttpConnectionManager) error {
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
	case "short":
		system = ""
	case "8k":
		var sb strings.Builder
		for i := 0; sb.Len() < 36000; i++ {
			fmt.Fprintf(&sb, "Clause %d: the operator keeps the fleet's caches warm and routes each request with care. ", i)
		}
		system = sb.String()
	default:
		return nil, fmt.Errorf("hop: unknown prompt kind %q (want short or 8k)", kind)
	}
	return func(i int) []byte {
		msgs := []map[string]string{}
		if system != "" {
			// The request number first: no two prompts share a prefix, so
			// every request is tokenized in full.
			msgs = append(msgs, map[string]string{"role": "system", "content": fmt.Sprintf("Request %d. %s", i, system)})
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Hello, request %d! What is the capital of France?", i)})
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1, "messages": msgs})
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
func offer(ctx context.Context, c *http.Client, url string, body func(int) []byte, rate float64, d time.Duration) (lat []time.Duration, sent, errs int, took time.Duration) {
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
		b := body(i)
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := c.Post(url, "application/json", bytes.NewReader(b))
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

// startInstantUpstream serves a fixed, non-streaming chat completion at once:
// an upstream that costs nothing, so that only the path to it is measured.
func startInstantUpstream(model string) (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	answer := fmt.Appendf(nil, `{"id":"chatcmpl-hop-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, model)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}
