//go:build llmdsim

package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
)

// llmdWorkers is the fleet size of the third-party engine test.
const llmdWorkers = 4

// A third-party engine: four llm-d-inference-sim processes, two publishing
// vLLM's positional-array events and two the map layout, each connecting
// its PUB socket to kvroute's one listener (as llm-d deploys vLLM) and
// tokenizing through kvroute's render listener. Multi-turn chats go through
// the real Envoy; kvroute's predicted cached tokens must equal what the
// engine reports it had cached, follow-ups stay with their prefix, load
// comes from the engines' own /metrics, and killing one engine costs the
// clients nothing.
func TestLLMDInferenceSim(t *testing.T) {
	bin := os.Getenv("KVROUTE_LLMD_SIM")
	if bin == "" {
		t.Fatal("KVROUTE_LLMD_SIM is not set: run `make test-llmd`, which builds llm-d-inference-sim (scripts/llm-d-sim.sh)")
	}
	hf := startHFStub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()

	f := startLLMDFleet(t, ctx, bin, fleetOptions{hf: hf})
	r, cfg, workers, ew, px, sims, rctx := f.r, f.cfg, f.workers, f.ew, f.px, f.sims, f.ctx

	// Until each simulator's PUB connection carries the listener's
	// subscription its first events are lost (ZMQ's slow joiner); a warm-up
	// chat per worker makes sure every stream is live before measuring.
	waitFor(t, ctx, "every simulator's KV events to reach the index", func() bool {
		for i := range workers {
			_, _ = chatTurn(ctx, "http://"+ew[i].Address, []map[string]string{{"role": "user", "content": fmt.Sprintf("warm-up %d %d", i, time.Now().UnixNano())}})
		}
		for _, w := range r.Index().Stats().PerWorker {
			if w.Blocks == 0 {
				return false
			}
		}
		return len(r.Index().Stats().PerWorker) == llmdWorkers
	})

	turns := runChats(ctx, px.URL(), 12, 4, "a")
	exact, predicted, followups, stayed := 0, 0, 0, 0
	byLayout := map[bool][2]int{} // map layout? -> {exact, predicted}
	prev := map[int]string{}
	addrLayout := map[string]bool{}
	for i, w := range workers {
		addrLayout[ew[i].Address] = w.mapFmt
	}
	for _, tr := range turns {
		if tr.err != nil {
			t.Fatalf("session %d turn %d: %v", tr.session, tr.index, tr.err)
		}
		if tr.predicted >= 0 {
			predicted++
			l := byLayout[addrLayout[tr.servedBy]]
			l[1]++
			if tr.predicted == tr.cached {
				exact++
				l[0]++
			}
			byLayout[addrLayout[tr.servedBy]] = l
		}
		if tr.index > 0 {
			followups++
			if tr.servedBy == prev[tr.session] && tr.cached > 0 {
				stayed++
			} else {
				t.Logf("session %d turn %d (%d prompt tokens): served by %s after %s, predicted %d cached, engine cached %d",
					tr.session, tr.index, tr.prompt, tr.servedBy, prev[tr.session], tr.predicted, tr.cached)
			}
		}
		prev[tr.session] = tr.servedBy
	}
	t.Logf("overlap_exact %d/%d (array layout %d/%d, map layout %d/%d); follow-ups on their prefix's worker with a cache hit %d/%d",
		exact, predicted, byLayout[false][0], byLayout[false][1], byLayout[true][0], byLayout[true][1], stayed, followups)
	if predicted < len(turns)*9/10 || float64(exact) < 0.95*float64(predicted) {
		t.Errorf("overlap_exact %d/%d of %d requests, want ≥ 95%%", exact, predicted, len(turns))
	}
	for _, mapFmt := range []bool{false, true} {
		if byLayout[mapFmt][1] == 0 {
			t.Errorf("no request served by a worker with map layout %v", mapFmt)
		}
	}
	// A follow-up stays with its prefix unless its holder is busier: the
	// latency cost charges every request running there for the slowdown
	// the newcomer brings, and when the chats happen to pile onto one
	// engine, a cold prefill on a quieter one can be cheaper. Every move
	// must be such a trade, and most follow-ups must stay.
	if stayed < followups {
		t.Logf("router metrics:\n%s", routerMetrics(t, r, "kvroute_forecast_evicted_hit_tokens_total", "kvroute_predicted_hit_tokens_lost_total", "kvroute_scoring_routed_total"))
	}
	for _, m := range movedDecisions(t, r) {
		h, c := m.Workers[0], m.Workers[1]
		t.Logf("moved %s (%d prompt tokens) from %s (%d blocks matched, %d running, cost %.1f ms) to %s (%d matched, %d running, cost %.1f ms)",
			m.RequestID, m.PromptTokens, h.Worker, h.MatchedBlocks+h.PendingBlocks, h.ActiveRequests, h.Logit*1e3,
			c.Worker, c.MatchedBlocks+c.PendingBlocks, c.ActiveRequests, c.Logit*1e3)
		if h.ActiveRequests <= c.ActiveRequests {
			t.Errorf("request %s left its prefix's worker %s for %s, which was no less busy (%d running against %d)", m.RequestID, h.Worker, c.Worker, c.ActiveRequests, h.ActiveRequests)
		}
	}
	if float64(stayed) < 0.85*float64(followups) {
		t.Errorf("only %d of %d follow-ups landed on their prefix's worker with a cache hit", stayed, followups)
	}
	if st := r.EngineFeeds().Stats(); st.LoadReports.Load() == 0 || st.UnknownPublisher.Load() != 0 {
		t.Errorf("load reports scraped %d (want > 0), batches from unknown publishers %d (want 0)", st.LoadReports.Load(), st.UnknownPublisher.Load())
	}

	// Load the engines report on /metrics steers fresh prompts: requests
	// sent to one simulator behind the router's back show up only in its
	// own gauges (vllm:kv_cache_usage_perc, vllm:num_requests_running).
	// The default latency cost counts the router's own in-flight requests
	// and reads the report's KV use for its memory term only, so a second
	// router with the block cost (--cost-model default: decode = KV blocks
	// in use, from the fresh report) shows the scrape deciding.
	cfg2 := cfg
	cfg2.GRPCAddr, cfg2.HTTPAddr, cfg2.AdminAddr, cfg2.RenderAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", ""
	cfg2.EngineEventsListen = "tcp://127.0.0.1:0"
	cfg2.Scoring.CostModel = scoring.CostDefault
	r2, err := server.Start(rctx, cfg2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Shutdown() })
	px2, err := bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: ew, ExtProcAddr: r2.GRPCAddr(), Edit: echoRouting})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px2.Close() })
	busy := 1
	var hold sync.WaitGroup
	for i := range 8 {
		hold.Add(1)
		go func() {
			defer hold.Done()
			// Long prompts: the simulator counts prompt blocks as KV in use.
			prompt := fmt.Sprintf("document %d: %s", i, strings.Repeat("the router reads the engine's gauges and weighs them. ", 60))
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":1500,"ignore_eos":true}`, model, prompt)
			resp, err := http.Post("http://"+ew[busy].Address+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	waitFor(t, ctx, "the busy engine's /metrics to reach the router", func() bool {
		running, used := reportedLoad(t, r2, workers[busy].id)
		return running >= 8 && used >= 100
	})
	fresh := runChats(ctx, px2.URL(), 12, 1, "fresh")
	onBusy := 0
	for _, tr := range fresh {
		if tr.err != nil {
			t.Fatal(tr.err)
		}
		if tr.servedBy == ew[busy].Address {
			onBusy++
		}
	}
	running, used := reportedLoad(t, r2, workers[busy].id)
	t.Logf("while %s reported %d running and %d KV blocks in use on /metrics, %d of %d fresh prompts went to it", workers[busy].id, running, used, onBusy, len(fresh))
	if onBusy > 0 {
		t.Errorf("%d of %d fresh prompts went to the worker whose /metrics shows it busy", onBusy, len(fresh))
	}
	hold.Wait()

	// Kill the busiest worker: its events stop, requests move elsewhere,
	// and Envoy's one retry to kvroute's fallback hides the dead endpoint.
	count := map[string]int{}
	for _, tr := range turns {
		count[tr.servedBy]++
	}
	victim := 0
	for i := range ew {
		if count[ew[i].Address] > count[ew[victim].Address] {
			victim = i
		}
	}
	scrapeErrs := r.EngineFeeds().Stats().ScrapeErrors.Load()
	sims[victim].kill()
	after := runChats(ctx, px.URL(), 8, 3, "b")
	for _, tr := range after {
		if tr.err != nil {
			t.Fatalf("after killing %s: session %d turn %d: %v", workers[victim].id, tr.session, tr.index, tr.err)
		}
		if tr.servedBy == ew[victim].Address {
			t.Fatalf("a request was served by the killed worker %s", workers[victim].id)
		}
	}
	waitFor(t, ctx, "the killed engine's /metrics to fail", func() bool {
		return r.EngineFeeds().Stats().ScrapeErrors.Load() > scrapeErrs
	})
	t.Logf("killed %s (served %d of %d); %d requests after it all succeeded elsewhere", workers[victim].id, count[ew[victim].Address], len(turns), len(after))
}

// movedDecisions returns, from the router's request log, every decision
// that sent a request away from the worker holding most of its prompt:
// Workers holds that worker's terms, then the chosen one's.
func movedDecisions(t *testing.T, r *server.Server) []scoring.Explanation {
	t.Helper()
	var out struct {
		Requests []struct {
			Explanation *struct {
				Decision *scoring.Explanation `json:"decision"`
			} `json:"explanation"`
		} `json:"requests"`
	}
	if err := getJSON("http://"+r.AdminAddr()+"/debug/requests?limit=200", &out); err != nil {
		t.Fatal(err)
	}
	held := func(w scoring.Terms) int { return w.MatchedBlocks + w.PendingBlocks }
	var moved []scoring.Explanation
	decisions := 0
	for _, rec := range out.Requests {
		if rec.Explanation == nil || rec.Explanation.Decision == nil {
			continue
		}
		e := *rec.Explanation.Decision
		decisions++
		holder, chosen := -1, -1
		for i, w := range e.Workers {
			if holder < 0 || held(w) > held(e.Workers[holder]) {
				holder = i
			}
			if w.Worker == e.Chosen {
				chosen = i
			}
		}
		if holder >= 0 && chosen >= 0 && held(e.Workers[chosen]) < held(e.Workers[holder]) {
			e.Workers = []scoring.Terms{e.Workers[holder], e.Workers[chosen]}
			moved = append(moved, e)
		}
	}
	if decisions == 0 {
		t.Fatal("the router's request log holds no decision with its terms")
	}
	return moved
}

// routerMetrics is the lines of the router's /metrics that start with any
// of the prefixes.
func routerMetrics(t *testing.T, r *server.Server, prefixes ...string) string {
	t.Helper()
	resp, err := http.Get("http://" + r.HTTPAddr() + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// reportedLoad is a worker's running requests and KV blocks in use in the
// load report the router holds (from the engine's /metrics).
func reportedLoad(t *testing.T, r *server.Server, id string) (running, used int) {
	t.Helper()
	var out struct {
		Workers []struct {
			Record struct {
				ID string `json:"id"`
			} `json:"record"`
			Load *struct {
				Report struct {
					Running int `json:"running"`
					Used    int `json:"kv_used_blocks"`
				} `json:"report"`
			} `json:"load"`
		} `json:"workers"`
	}
	if err := getJSON("http://"+r.AdminAddr()+"/debug/workers?verbose=1", &out); err != nil {
		t.Fatal(err)
	}
	for _, w := range out.Workers {
		if w.Record.ID == id && w.Load != nil {
			return w.Load.Report.Running, w.Load.Report.Used
		}
	}
	return 0, 0
}

// llmdWorker is one simulator's place in the fleet.
type llmdWorker struct {
	id, ip string
	port   int
	mapFmt bool
}

// fleetOptions shape a fleet of simulators behind kvroute and Envoy.
type fleetOptions struct {
	// hf stands in for huggingface.co so the simulators tokenize text
	// through kvroute's render listener; nil for token-id workloads.
	hf *hfStub
	// simArgs replace the simulators' timing and capacity flags.
	simArgs []string
	// mode is kvroute's router mode (default kv).
	mode string
}

// llmdFleet is kvroute (listen mode, render listener, scraped load) in
// front of llmdWorkers simulators, half publishing vLLM's positional-array
// events and half the map layout, and the real Envoy in front of kvroute.
type llmdFleet struct {
	r       *server.Server
	cfg     server.Config
	ctx     context.Context // the router's; ends when the test does
	workers []llmdWorker
	sims    []*llmdSim
	ew      []envoy.Worker
	px      *proxy.Proxy
	stop    func() // the router's
}

// close stops Envoy, the simulators and the router; it may be called again.
func (f *llmdFleet) close() {
	if f.px != nil {
		_ = f.px.Close()
	}
	for _, s := range f.sims {
		if s != nil {
			s.kill()
		}
	}
	f.stop()
}

func startLLMDFleet(t testing.TB, ctx context.Context, bin string, o fleetOptions) *llmdFleet {
	t.Helper()
	// Workers: each simulator names itself by a loopback address of its own
	// (POD_IP), which is how its topic kv@<ip>@<model> is told apart.
	f := &llmdFleet{workers: make([]llmdWorker, llmdWorkers)}
	var file strings.Builder
	file.WriteString("workers:\n")
	for i := range f.workers {
		f.workers[i] = llmdWorker{id: fmt.Sprintf("llmd%d", i), ip: fmt.Sprintf("127.0.0.%d", 21+i), port: freeTCPPort(t), mapFmt: i >= llmdWorkers/2}
		fmt.Fprintf(&file, "- {id: %s, model: %q, address: '%s:%d', block_size: 16, kv_total_blocks: 1024, max_num_seqs: 16}\n",
			f.workers[i].id, model, f.workers[i].ip, f.workers[i].port)
	}
	wf := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(wf, []byte(file.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr, cfg.RenderAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	cfg.WorkersFile = wf
	cfg.EngineEvents, cfg.EngineEventsListen, cfg.EngineReplayPort = server.EngineEventsZMQ, "tcp://127.0.0.1:0", -1
	cfg.EngineLoad = server.EngineLoadScrape
	if o.mode != "" {
		cfg.Scoring.Mode = o.mode
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.ShutdownGrace = time.Second
	rctx, rcancel := context.WithCancel(context.Background())
	r, err := server.Start(rctx, cfg)
	if err != nil {
		rcancel()
		t.Fatal(err)
	}
	f.stop = func() { rcancel(); _ = r.Wait() }
	t.Cleanup(f.close)
	f.r, f.cfg, f.ctx = r, cfg, rctx

	simArgs := o.simArgs
	if simArgs == nil {
		simArgs = []string{"--kv-cache-size", "1024", "--max-num-seqs", "16", "--max-model-len", "8192",
			"--prefill-overhead", "5ms", "--prefill-time-per-token", "200us", "--inter-token-latency", "2ms"}
	}
	f.sims = make([]*llmdSim, len(f.workers))
	for i, w := range f.workers {
		args := append([]string{"--model", model, "--enable-kvcache", "--block-size", "16",
			"--zmq-endpoint", r.EngineFeeds().ListenEndpoint(), "--event-batch-size", "1", "--render-url", "http://" + r.RenderAddr(), "--v", "0"},
			simArgs...)
		if w.mapFmt {
			args = append(args, "--use-vllm-map-event-format")
		}
		f.sims[i] = startLLMDSim(t, bin, o.hf, w.id, w.ip, w.port, args...)
		f.ew = append(f.ew, envoy.Worker{Cluster: w.id, Address: fmt.Sprintf("%s:%d", w.ip, w.port)})
	}
	for _, s := range f.sims {
		if err := s.waitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.px, err = bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: f.ew, ExtProcAddr: r.GRPCAddr(), Edit: echoRouting}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "kvroute ready", func() bool { return r.NotReadyReason() == "" })
	return f
}
