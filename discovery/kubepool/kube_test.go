//go:build kubeapiserver

package kubepool_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv/kubetest"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/scoring"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// recorder is a fleet.Sink that keeps the current worker set and
// signals every change.
type recorder struct {
	mu      sync.Mutex
	workers map[string]fleet.Worker
	removed map[string]time.Time
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{workers: map[string]fleet.Worker{}, removed: map[string]time.Time{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) Upsert(w fleet.Worker) {
	r.mu.Lock()
	r.workers[w.ID] = w
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) Remove(id string) {
	r.mu.Lock()
	delete(r.workers, id)
	r.removed[id] = time.Now()
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.workers))
	for id := range r.workers {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (r *recorder) get(id string) fleet.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers[id]
}

// waitFor waits until the worker set is exactly want.
func (r *recorder) waitFor(t testing.TB, want ...string) {
	t.Helper()
	sort.Strings(want)
	deadline := time.After(20 * time.Second)
	for {
		if got := r.ids(); fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("workers = %v, want %v", r.ids(), want)
		}
	}
}

func startWatcher(t testing.TB, c *kubetest.Cluster, pool string, sink *recorder) *kubepool.Watcher {
	t.Helper()
	w, err := kubepool.New(kubepool.Config{PoolName: pool, PoolNamespace: c.NS, REST: c.REST,
		Defaults: kubepool.Defaults{Model: "Qwen/Qwen3-8B", BlockSize: 16}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx, sink, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-w.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("watcher not synced after 30s")
	}
	return w
}

func TestKubeAPIServerPoolWorkers(t *testing.T) {
	c := kubetest.Start(t, "llm")
	vllm := map[string]string{"app": "vllm"}
	c.ApplyPool(t, "vllm", vllm, 8000)
	c.CreatePod(t, "vllm-a", vllm, map[string]string{kubepool.AnnotationModel: "other/model", kubepool.AnnotationKVBlocks: "4096"}, "10.0.0.1")
	c.CreatePod(t, "vllm-b", vllm, nil, "10.0.0.2")
	c.CreatePod(t, "vllm-pending", vllm, nil, "")                           // no IP, not Ready
	c.CreatePod(t, "web", map[string]string{"app": "web"}, nil, "10.0.0.9") // not selected

	rec := newRecorder()
	startWatcher(t, c, "vllm", rec)
	rec.waitFor(t, "vllm-a", "vllm-b")
	if a := rec.get("vllm-a"); a.Address != "10.0.0.1:8000" || a.Model != "other/model" || a.KVTotalBlocks != 4096 || a.BlockSize != 16 {
		t.Fatalf("vllm-a = %+v, want its IP, annotations and the default block size", a)
	}
	if b := rec.get("vllm-b"); b.Model != "Qwen/Qwen3-8B" || b.Address != "10.0.0.2:8000" {
		t.Fatalf("vllm-b = %+v, want the default model", b)
	}

	t.Run("pending pod becomes ready", func(t *testing.T) {
		c.SetReady(t, c.Pod(t, "vllm-pending"), "10.0.0.3", true)
		rec.waitFor(t, "vllm-a", "vllm-b", "vllm-pending")
	})
	t.Run("not ready is removed", func(t *testing.T) {
		c.SetReady(t, c.Pod(t, "vllm-pending"), "10.0.0.3", false)
		rec.waitFor(t, "vllm-a", "vllm-b")
	})
	t.Run("deleted is removed", func(t *testing.T) {
		start := time.Now()
		if err := c.Kube.CoreV1().Pods(c.NS).Delete(context.Background(), "vllm-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "vllm-a")
		rec.mu.Lock()
		took := rec.removed["vllm-b"].Sub(start)
		rec.mu.Unlock()
		t.Logf("pod deletion to worker removal: %v", took.Round(time.Millisecond))
	})
	t.Run("two target ports give one worker per rank", func(t *testing.T) {
		c.ApplyPool(t, "vllm", vllm, 8000, 8001)
		rec.waitFor(t, "vllm-a-dp0", "vllm-a-dp1")
		if w := rec.get("vllm-a-dp1"); w.Address != "10.0.0.1:8001" || w.DPRank != 1 {
			t.Fatalf("vllm-a-dp1 = %+v", w)
		}
	})
	t.Run("selector change moves the fleet", func(t *testing.T) {
		c.ApplyPool(t, "vllm", map[string]string{"app": "web"}, 8000)
		rec.waitFor(t, "web")
	})
	t.Run("pool deleted selects nothing", func(t *testing.T) {
		if err := c.Dyn.Resource(kubepool.PoolGVR).Namespace(c.NS).Delete(context.Background(), "vllm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t)
	})
}

// BenchmarkKubeAPIServerDiscover500 measures how long a fresh watcher takes
// from Run to holding a 500-pod pool (all Ready) in its Sink.
func BenchmarkKubeAPIServerDiscover500(b *testing.B) {
	const pods = 500
	c := kubetest.Start(b, "llm")
	vllm := map[string]string{"app": "vllm"}
	c.ApplyPool(b, "vllm", vllm, 8000)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.CreatePod(b, fmt.Sprintf("vllm-%03d", i), vllm, nil, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
		}()
	}
	wg.Wait()
	b.ResetTimer()
	for range b.N {
		rec := newRecorder()
		start := time.Now()
		w := startWatcher(b, c, "vllm", rec)
		took := time.Since(start)
		if n := w.Workers(); n != pods {
			b.Fatalf("synced with %d workers, want %d", n, pods)
		}
		b.ReportMetric(took.Seconds(), "s/discover500")
	}
}

// fleetSink mirrors the fleet into a real scheduler pool and KV index, as
// the router's fleet does.
type fleetSink struct {
	pool *scoring.Pool
	ix   *kvindex.Index
	*recorder
}

func (s fleetSink) Upsert(w fleet.Worker) {
	_ = s.pool.Upsert(w)
	s.ix.AddWorker(w.ID, w.Model, w.BlockSize)
	s.recorder.Upsert(w)
}

func (s fleetSink) Remove(id string) {
	s.pool.Remove(id)
	s.ix.RemoveWorker(id)
	s.recorder.Remove(id)
}

// BenchmarkKubeAPIServerPickUnderChurn measures a routing decision over a
// 500-pod pool discovered from the API server, quiet and while pods are
// replaced at 50 per second (one deleted, one created Ready, every 20 ms).
func BenchmarkKubeAPIServerPickUnderChurn(b *testing.B) {
	const pods = 500
	c := kubetest.Start(b, "llm")
	vllm := map[string]string{"app": "vllm"}
	c.ApplyPool(b, "vllm", vllm, 8000)
	create := func(i int) {
		c.CreatePod(b, fmt.Sprintf("vllm-%04d", i), vllm, nil, fmt.Sprintf("10.%d.%d.%d", 1+i/62500, i/250%250, i%250+1))
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); defer func() { <-sem }(); create(i) }()
	}
	wg.Wait()
	sched, err := scoring.NewScheduler(scoring.DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	sink := fleetSink{sched.Pool(), kvindex.New(kvindex.Config{}), newRecorder()}
	w, err := kubepool.New(kubepool.Config{PoolName: "vllm", PoolNamespace: c.NS, REST: c.REST,
		Defaults: kubepool.Defaults{Model: "m", BlockSize: 16, KVTotalBlocks: 4096}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx, sink, nil) }()
	<-w.Synced()
	req := &scoring.Request{ID: "r", Model: "m", PromptTokens: 2048}
	pick := func(b *testing.B) {
		var cs []scoring.Candidate
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			cs = sched.Pool().AppendCandidates(cs[:0], "m")
			if _, err := sched.Pick(req, cs, nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/pick")
	}
	b.Run("quiet", pick)
	b.Run("churn=50/s", func(b *testing.B) {
		cctx, stop := context.WithCancel(ctx)
		done := make(chan int)
		go func() {
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			next, oldest, n := pods, 0, 0
			for {
				select {
				case <-cctx.Done():
					done <- n
					return
				case <-t.C:
				}
				_ = c.Kube.CoreV1().Pods(c.NS).Delete(cctx, fmt.Sprintf("vllm-%04d", oldest), metav1.DeleteOptions{})
				if cctx.Err() == nil {
					create(next)
				}
				oldest, next, n = oldest+1, next+1, n+1
			}
		}()
		time.Sleep(200 * time.Millisecond) // churn under way
		pick(b)
		stop()
		b.ReportMetric(float64(<-done), "pods-replaced")
	})
}
