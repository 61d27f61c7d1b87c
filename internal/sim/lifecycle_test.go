package sim

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
)

// ours reports the goroutines that belong to workers: the engine loop,
// publishers, HTTP servers and their connections, NATS clients, ZMQ.
func ours() []string {
	buf := make([]byte, 1<<20)
	var found []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		// zmq4 (v0.17.0) never stops a PUB socket's writer goroutine on
		// Close: an upstream leak of one parked goroutine per ZMQ worker.
		if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "zmq4.(*pubMWriter).run") {
			continue
		}
		for _, mark := range []string{"kvroute/internal/sim.", "net/http.(*conn).serve", "net/http.(*Server).Serve",
			"nats-io/nats.go.", "go-zeromq/zmq4", "etcd/client"} {
			if strings.Contains(g, mark) {
				found = append(found, g)
				break
			}
		}
	}
	return found
}

// settleGoroutines waits until no worker goroutine is left.
func settleGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := ours()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d worker goroutines left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStoppedWorkersLeaveNoGoroutines(t *testing.T) {
	ns := testenv.StartNATS(t)
	for _, stop := range []string{"close", "kill"} {
		t.Run(stop, func(t *testing.T) {
			f, err := StartFleet(context.Background(), FleetConfig{Workers: 3, NATSURL: ns.URL, AdminAddr: "127.0.0.1:0",
				Worker: WorkerConfig{Model: "m", Speedup: 1000, Engine: EngineConfig{NumGPUBlocks: 64, BlockSize: 16}, Logger: quietLogger()}})
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range f.Workers() {
				post(t, w.URL()+"/v1/completions", `{"prompt":`+idsJSON(0, 40)+`,"max_tokens":4,"stream":true}`)
			}
			if len(ours()) < 3 {
				t.Fatalf("the goroutine finder sees %d worker goroutines while 3 workers run", len(ours()))
			}
			if stop == "kill" {
				for _, w := range f.Workers() {
					w.Kill()
				}
			}
			if err := f.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			http.DefaultClient.CloseIdleConnections()
			settleGoroutines(t)
		})
	}
}

func TestKillFailsInFlightRequests(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{Speedup: 1})
	done := make(chan error, 1)
	go func() {
		_, err := w.Generate(context.Background(), seq(0, 100), 3000)
		done <- err
	}()
	waitUntil(t, "the request to run", func() bool { return w.Stats().Running == 1 })
	w.Kill()
	select {
	case err := <-done:
		if !errors.Is(err, errWorkerStopped) {
			t.Fatalf("err = %v, want errWorkerStopped", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request not failed by Kill")
	}
	if _, err := http.Get(w.URL() + "/health"); err == nil {
		t.Fatal("killed worker still serves HTTP")
	}
	if !w.Stats().Killed {
		t.Fatal("stats do not show the kill")
	}
}

func TestGenerateReportsCachedPrefix(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{})
	if _, err := w.Generate(context.Background(), seq(0, 64), 2); err != nil {
		t.Fatal(err)
	}
	res, err := w.Generate(context.Background(), seq(0, 80), 3)
	if err != nil {
		t.Fatal(err)
	}
	if res.PromptTokens != 80 || res.CachedTokens != 64 || len(res.Tokens) != 3 || res.TTFT <= 0 || res.Latency < res.TTFT {
		t.Fatalf("result %+v", res)
	}
	if _, err := w.Generate(context.Background(), nil, 1); !errors.Is(err, ErrRequest) {
		t.Fatalf("empty prompt: %v", err)
	}
}

// The worker must not answer faster than the timing model allows: a lower
// bound, which load on the machine can only make slower, never flaky.
func TestWorkerTakesAtLeastTheSimulatedStepTime(t *testing.T) {
	w := startTestWorker(t, WorkerConfig{Speedup: 10, Engine: EngineConfig{NumGPUBlocks: 1024, BlockSize: 16}})
	res, err := w.Generate(context.Background(), seq(0, 4096), 3)
	if err != nil {
		t.Fatal(err)
	}
	// The 4,096-token prompt fits one step (budget 8,192): prefill alone
	// (no request decodes in it), then two decode steps, each charged with
	// the request's KV (the last one too: the request holds its blocks
	// until that step ends).
	total := 1024 * 16
	first := PrefillMillis(4096) / 10
	decode := DecodeMillis(4097.0/float64(total)) / 10
	if min := time.Duration(first * float64(time.Millisecond)); res.TTFT < min-maxLagSlack {
		t.Fatalf("TTFT %v, want at least %v", res.TTFT, min)
	}
	if min := time.Duration((first + 2*decode) * float64(time.Millisecond)); res.Latency < min-maxLagSlack {
		t.Fatalf("latency %v, want at least %v", res.Latency, min)
	}
}

// maxLagSlack allows for the sub-millisecond debts the loop does not sleep.
const maxLagSlack = time.Millisecond
