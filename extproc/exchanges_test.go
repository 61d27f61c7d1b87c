package extproc

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
)

// exchangeCounter is a Metrics that also counts exchanges.
type exchangeCounter struct {
	nopMetrics
	mu      sync.Mutex
	byPhase map[string]int // phase, "/nb" appended when not blocking
	streams []int
}

func (c *exchangeCounter) Exchange(phase string, blocking bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !blocking {
		phase += "/nb"
	}
	c.byPhase[phase]++
}

func (c *exchangeCounter) StreamExchanges(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.streams = append(c.streams, n)
}

func (c *exchangeCounter) StreamEnded(codes.Code) {}

// Every message Envoy sends counts once under its phase, observability-mode
// messages as not blocking, and each stream reports how many it was held for.
func TestServerCountsExchangesByPhase(t *testing.T) {
	m := &exchangeCounter{byPhase: map[string]int{}}
	srv, cc := startServer(t, ServerConfig{Decider: newFleet(), Metrics: m})
	srv.SetReady(true)
	observed := respBody("data: x\n\n", true)
	observed.ObservabilityMode = true
	msgs := []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true), respHeaders("200", false), observed}
	exchange(t, context.Background(), cc, msgs, 3)
	want := map[string]int{ExchangeRequestHeaders: 1, ExchangeRequestBody: 1, ExchangeResponseHeaders: 1, ExchangeResponseBody + "/nb": 1}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		got, streams := maps.Clone(m.byPhase), append([]int(nil), m.streams...)
		m.mu.Unlock()
		if maps.Equal(got, want) && len(streams) == 1 && streams[0] == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("exchanges %v, per stream %v; want %v and [3]", got, streams, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
