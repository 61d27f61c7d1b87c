package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kvroute/kvroute/envoy/proxy"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/server"
)

// ReplicaOptions shapes a two-replica run: an Env whose router is replica
// A, a second router (replica B) on the same NATS and etcd with its own
// Envoy, and the same workload through one replica, then through both.
type ReplicaOptions struct {
	// Env configures the system; replica sync is turned on for A.
	Env EnvConfig
	// Sessions of Turns turns each, over SystemPrompts shared prompts of
	// SystemTokens tokens; each turn adds UserTokens and asks for
	// OutputTokens. Sessions start Stagger apart and think Think.
	Sessions, Turns                         int
	SystemPrompts, SystemTokens, UserTokens int
	OutputTokens                            int
	Stagger, Think                          time.Duration
	// Probes is the number of sync-lag probes after the runs.
	Probes int
	Seed   uint64
}

// ReplicaReport is what a two-replica run measured.
type ReplicaReport struct {
	// One is the workload through replica A alone; Two through A and B,
	// sessions alternating between them. HitRate is Σ cached ÷ Σ prompt
	// tokens as the workers reported them.
	One, Two ReplicaRun
	// Prompts is how many of the workload's prompts were matched against
	// both indexes after the two-replica run settled; Agree how many got
	// the same blocks on every worker from both, and EntriesA, EntriesB
	// the indexes' sizes.
	Prompts, Agree     int
	EntriesA, EntriesB int
	// SyncLag is, per probe, the time from replica A counting a request it
	// routed to replica B counting it (replica sync over NATS), over
	// SyncProbes probes B saw.
	SyncLag    Summary
	SyncProbes int
}

// ReplicaRun is one pass of the workload.
type ReplicaRun struct {
	Requests, Errors int
	HitRate          float64
	TTFT             Summary
	// ActiveGap is the mean, over samples every 5 ms during the run, of
	// |A's active requests − B's| (0 with one replica): requests one
	// replica counts and the other does not yet.
	ActiveGap float64
}

// RunReplicas brings up the system, runs the workload through one replica
// then two, and measures index agreement and sync lag.
func RunReplicas(ctx context.Context, o ReplicaOptions) (*ReplicaReport, error) {
	envCfg := o.Env
	routerEdit := envCfg.Router
	envCfg.Router = func(c *server.Config) {
		if routerEdit != nil {
			routerEdit(c)
		}
		c.ReplicaSync, c.RouterID = true, "replica-a"
	}
	env, err := StartEnv(ctx, envCfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	b, envoyB, err := startReplicaB(ctx, env)
	if err != nil {
		return nil, err
	}
	defer func() {
		_ = envoyB.Close()
		_ = b.Shutdown()
	}()
	w := o.workload(env.cfg.Model)
	rep := &ReplicaReport{}

	clients := []*Client{NewClient(env.URL()), NewClient(envoyB.URL())}
	defer clients[0].Close()
	defer clients[1].Close()
	for pass, n := range []int{1, 2} {
		if err := env.ResetCaches(ctx); err != nil {
			return nil, err
		}
		run, err := runSplit(ctx, env.Router, b, clients[:n], w)
		if err != nil {
			return nil, err
		}
		if pass == 0 {
			rep.One = run
		} else {
			rep.Two = run
		}
	}
	if err := rep.compareIndexes(ctx, env.Router, b, w); err != nil {
		return nil, err
	}
	lags, err := syncLag(ctx, env.Router, b, clients[0], env.cfg.Model, o.Probes, o.Seed)
	rep.SyncLag, rep.SyncProbes = Summarize(lags), len(lags)
	return rep, err
}

// startReplicaB starts a second router on env's NATS and etcd, with replica
// sync, and its own Envoy, and waits until it sees every worker.
func startReplicaB(ctx context.Context, env *Env) (*server.Server, *proxy.Proxy, error) {
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.NATSURL, cfg.EtcdEndpoints = env.NATSURL, env.EtcdEndpoints
	cfg.KVEvents = !env.cfg.NoEvents
	cfg.Scoring.Mode = env.cfg.Mode
	cfg.ShutdownGrace = 2 * time.Second
	cfg.Logger = env.cfg.Logger.With("component", "kvroute-b")
	cfg.ReplicaSync, cfg.RouterID = true, "replica-b"
	b, err := server.Start(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start replica b: %w", err)
	}
	n := len(env.Fleet.Workers())
	if err := poll(ctx, 30*time.Second, func() (bool, error) {
		return b.Ready() && b.Picker().Scheduler().Pool().Len() == n, nil
	}, fmt.Sprintf("replica b to discover %d workers", n)); err != nil {
		_ = b.Shutdown()
		return nil, nil, err
	}
	p, err := StartEnvoy(ctx, EnvoyConfig{Style: env.cfg.Style, Workers: env.EnvoyWorkers(), ExtProcAddr: b.GRPCAddr()})
	if err != nil {
		_ = b.Shutdown()
		return nil, nil, err
	}
	return b, p, nil
}

// workload builds the sessions as token prompts, so the indexes can be
// asked about them afterwards.
func (o ReplicaOptions) workload(model string) *Workload {
	r := rand.New(rand.NewPCG(o.Seed, 0x7e91))
	w := &Workload{Name: "replicas"}
	for s := 0; s < o.Sessions; s++ {
		fl := Flow{At: time.Duration(s) * o.Stagger, Think: o.Think}
		prompt := BlockTokens(nil, -1-int64(r.IntN(o.SystemPrompts)), o.SystemTokens)
		for t := 0; t < o.Turns; t++ {
			prompt = BlockTokens(prompt, int64(r.Uint32())<<8|int64(t), o.UserTokens)
			it := CompletionItem(model, append([]int32(nil), prompt...), o.OutputTokens)
			if t > 0 {
				it.Follows = &ItemRef{Flow: s, Item: t - 1}
			}
			fl.Items = append(fl.Items, it)
		}
		w.Flows = append(w.Flows, fl)
	}
	return w
}

// runSplit runs w with the flows dealt round-robin over clients (one per
// replica), while sampling the replicas' active-request counts.
func runSplit(ctx context.Context, a, b *server.Server, clients []*Client, w *Workload) (ReplicaRun, error) {
	parts := make([]*Workload, len(clients))
	for i := range parts {
		parts[i] = &Workload{Name: w.Name}
	}
	for f := range w.Flows {
		p := parts[f%len(parts)]
		fl := w.Flows[f]
		fl.Items = append([]Item(nil), fl.Items...)
		for k := range fl.Items {
			if ref := fl.Items[k].Follows; ref != nil {
				fl.Items[k].Follows = &ItemRef{Flow: len(p.Flows), Item: ref.Item}
			}
		}
		p.Flows = append(p.Flows, fl)
	}
	sctx, stop := context.WithCancel(ctx)
	gap := make(chan float64, 1)
	go func() { gap <- sampleGap(sctx, a, b, len(clients) > 1) }()

	var wg sync.WaitGroup
	results := make([][]Result, len(clients))
	errs := make([]error, len(clients))
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = Run(ctx, c, parts[i], RunOptions{Arrival: Arrival{Kind: ArrivalTrace}})
		}()
	}
	wg.Wait()
	stop()
	run := ReplicaRun{ActiveGap: <-gap}
	if err := errors.Join(errs...); err != nil {
		return run, err
	}
	var prompt, cached int
	var ttft []float64
	for _, rs := range results {
		for _, r := range rs {
			run.Requests++
			if r.Err != nil {
				run.Errors++
				continue
			}
			prompt += r.PromptTokens
			cached += r.CachedTokens
			ttft = append(ttft, ms(r.TTFT))
		}
	}
	if prompt > 0 {
		run.HitRate = float64(cached) / float64(prompt)
	}
	run.TTFT = Summarize(ttft)
	return run, nil
}

// activeRequests is the requests a replica's pool counts, its own and its
// peers'.
func activeRequests(s *server.Server) int {
	n := 0
	for _, l := range s.Picker().Scheduler().Pool().Snapshot() {
		n += l.ActiveRequests
	}
	return n
}

// sampleGap averages |active(a) − active(b)| every 5 ms until ctx ends.
func sampleGap(ctx context.Context, a, b *server.Server, both bool) float64 {
	if !both {
		<-ctx.Done()
		return 0
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	var sum, n float64
	for {
		select {
		case <-ctx.Done():
			if n == 0 {
				return 0
			}
			return sum / n
		case <-t.C:
			d := activeRequests(a) - activeRequests(b)
			sum += float64(max(d, -d))
			n++
		}
	}
}

// compareIndexes waits for the indexes to settle (equal entry counts, or
// 5 s), then matches every prompt of w against both.
func (rep *ReplicaReport) compareIndexes(ctx context.Context, a, b *server.Server, w *Workload) error {
	_ = poll(ctx, 5*time.Second, func() (bool, error) {
		return a.Index().Stats().Entries == b.Index().Stats().Entries, nil
	}, "indexes to agree")
	rep.EntriesA, rep.EntriesB = a.Index().Stats().Entries, b.Index().Stats().Entries
	pool := a.Picker().Scheduler().Pool()
	cands := pool.AppendCandidates(nil, a.Picker().Scheduler().Pool().Models()[0])
	if len(cands) == 0 {
		return errors.New("compare indexes: no workers")
	}
	ids := make([]string, len(cands))
	for i, c := range cands {
		ids[i] = c.Worker
	}
	spec, _ := pool.Spec(ids[0])
	seed := kvindex.Seed(spec.Model, "", "")
	var toks []uint32
	var ma, mb []kvindex.MatchResult
	for f := range w.Flows {
		for _, it := range w.Flows[f].Items {
			toks = toks[:0]
			for _, t := range it.Prompt {
				toks = append(toks, uint32(t))
			}
			h := kvindex.HashBlocks(seed, toks, spec.BlockSize, nil)
			ma = a.Index().Match(h, ids, ma)
			mb = b.Index().Match(h, ids, mb)
			rep.Prompts++
			same := true
			for i := range ma {
				same = same && ma[i].Blocks == mb[i].Blocks
			}
			if same {
				rep.Agree++
			}
		}
	}
	return nil
}

// syncLag sends probes requests through replica A (client c), one at a
// time, and times each from A's pool counting it to B's.
func syncLag(ctx context.Context, a, b *server.Server, c *Client, model string, probes int, seed uint64) ([]float64, error) {
	var lags []float64
	// The runs' last requests may still be counted (a response's end is
	// learned up to a few hundred milliseconds after it): a probe added
	// while one of them is freed would not raise the count.
	if err := poll(ctx, 10*time.Second, func() (bool, error) {
		return activeRequests(a) == 0 && activeRequests(b) == 0, nil
	}, "both replicas idle before the sync probes"); err != nil {
		return nil, err
	}
	for p := 0; p < probes; p++ {
		baseA, baseB := activeRequests(a), activeRequests(b)
		it := CompletionItem(model, BlockTokens(nil, int64(seed)<<20|int64(p)+1<<40, 64), 32)
		done := make(chan Result, 1)
		go func() { done <- c.Do(ctx, &it) }()
		var seenA time.Time
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if seenA.IsZero() && activeRequests(a) > baseA {
				seenA = time.Now()
			}
			if !seenA.IsZero() && activeRequests(b) > baseB {
				lags = append(lags, ms(time.Since(seenA)))
				break
			}
			time.Sleep(50 * time.Microsecond)
		}
		if r := <-done; r.Err != nil {
			return lags, fmt.Errorf("sync probe %d: %w", p, r.Err)
		}
		// Let both pools drop the probe before the next one.
		_ = poll(ctx, 5*time.Second, func() (bool, error) {
			return activeRequests(a) == baseA && activeRequests(b) == baseB, nil
		}, "probe to be freed")
	}
	return lags, nil
}
