package sim

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvindex"
)

// TestRouterIndexAgreesWithTheEngine feeds kvsim's events to the router's
// own index (which re-hashes token ids and never trusts engine hashes) and
// checks that, through stores and evictions, the index predicts exactly
// the cached_tokens the worker then reports.
func TestRouterIndexAgreesWithTheEngine(t *testing.T) {
	ns := testenv.StartNATS(t)
	w := startTestWorker(t, WorkerConfig{
		Engine: EngineConfig{NumGPUBlocks: 16, BlockSize: 16}, Namespace: "ra", NATS: natsConn(t, ns.URL),
	})
	sub := natsConn(t, ns.URL)
	msgs, err := sub.SubscribeSync(kvindex.EventsSubject("ra", w.ID()))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	ix := kvindex.New(kvindex.Config{})
	ix.AddWorker(w.ID(), "test-model", 16)
	seed := kvindex.Seed("test-model", "", "")
	// apply drains the worker's batches into the index until it is quiet.
	apply := func() {
		for {
			m, err := msgs.NextMsg(100 * time.Millisecond)
			if err != nil {
				return
			}
			b, err := kvindex.DecodeBatch(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if st := ix.Apply(w.ID(), b); st.UnknownParent+st.Malformed+st.BlockSizeMismatch > 0 {
				t.Fatalf("index rejected events: %+v", st)
			}
		}
	}
	predicted := func(prompt []int32) int {
		hs := kvindex.HashBlocks(seed, toUint32(prompt), 16, nil)
		res := ix.Match(hs, []string{w.ID()}, nil)
		if res[0].Stale {
			t.Fatal("index marks the worker stale")
		}
		return res[0].Blocks * 16
	}
	run := func(prompt []int32) int {
		_, body := post(t, w.URL()+"/v1/completions", `{"prompt":`+string(mustJSON(prompt))+`,"max_tokens":1}`)
		var r completionResponse
		if err := json.Unmarshal(body, &r); err != nil || r.Usage == nil {
			t.Fatalf("response %s: %v", body, err)
		}
		apply()
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	a, b := seq(0, 100), seq(5000, 200)
	steps := []struct {
		name   string
		prompt []int32
		want   int // cached tokens reported and predicted
	}{
		{"cold A", a, 0},
		{"A again hits its 6 full blocks", a, 96},
		// B needs 13 of 16 blocks: 9 never used, then A's tail first
		// (its partial 7th block, then full blocks 6, 5 and 4).
		{"cold B evicts A's tail", b, 0},
		{"A keeps 3 blocks", a, 48},
	}
	for _, s := range steps {
		if got := predicted(s.prompt); got != s.want {
			t.Fatalf("%s: router index predicts %d cached tokens, want %d", s.name, got, s.want)
		}
		if got := run(s.prompt); got != s.want {
			t.Fatalf("%s: worker reports %d cached tokens, want %d", s.name, got, s.want)
		}
	}
	w.ResetCache()
	apply()
	if got := predicted(a); got != 0 {
		t.Fatalf("after reset the index predicts %d cached tokens", got)
	}
}
