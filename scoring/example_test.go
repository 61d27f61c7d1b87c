package scoring_test

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/scoring"
)

// The per-request flow of the ext_proc layer: candidates, overlap from the
// KV index, Route, then the lifecycle as the response streams.
func Example() {
	opts := scoring.DefaultOptions()
	opts.Rand = rand.New(rand.NewPCG(1, 2)) // reproducible ties
	router, err := scoring.NewScheduler(opts)
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"w0", "w1"} {
		err := router.Pool().Upsert(fleet.Worker{ID: id, Model: "qwen", Address: id + ":8000",
			BlockSize: 16, KVTotalBlocks: 4096, MaxNumBatchedTokens: 8192})
		if err != nil {
			panic(err)
		}
	}

	req := &scoring.Request{ID: "req-1", Model: "qwen", PromptTokens: 1000, Hashes: make([]uint64, 62)}
	cands := router.Pool().AppendCandidates(nil, req.Model)
	// From kvindex's Match: w1 holds the first 40 blocks of the prompt.
	cands[1].MatchedBlocks, cands[1].CachedBlocks = 40, 900

	var why scoring.Explanation
	d, err := router.Route(context.Background(), req, cands, &why)
	if err != nil {
		panic(err) // a *ShedError becomes 429, ErrNoWorkers 503
	}
	fmt.Println("x-target-worker:", d.Cluster)
	fmt.Println(why.String())

	router.Pool().PrefillDone(req.ID)  // first response chunk
	router.Pool().Progress(req.ID, 48) // output tokens so far
	router.Pool().Free(req.ID)         // end of stream, reset or cancel
	// Output:
	// x-target-worker: w1
	// worker=w0 logit=0.100s = ttft 0.076 (context 0.001, decode kv 0.000) + slowdown 0.000 + memory 0.000 + duplicate 0.024 + churn 0.000 (rate=20000 tok/s overhead=0.025s backlog=0) (cached_blocks=0)
	// worker=w1 logit=0.044s = ttft 0.044 (context 0.001, decode kv 0.000) + slowdown 0.000 + memory 0.000 + duplicate 0.000 + churn 0.000 (rate=20000 tok/s overhead=0.025s backlog=0) (cached_blocks=900)
	// chosen=w1 mode=kv cost_model=latency temperature=0
}
