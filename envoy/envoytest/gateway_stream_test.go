package envoytest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvroute/kvroute/envoy"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// startSSEWorker writes one event at a time and only writes the next after
// the client has read the previous one, so any buffering on the way
// deadlocks into a test failure instead of passing slowly.
func startSSEWorker(t *testing.T, events int) (*httptest.Server, chan<- struct{}) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Second):
				t.Errorf("event %d never reached the client: the path buffers", i)
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, next
}

func readEvents(t *testing.T, url string, next chan<- struct{}) []string {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		events = append(events, line)
		if line != "data: [DONE]" {
			next <- struct{}{}
		}
	}
	return events
}

func TestSSEStreamsChunkByChunk(t *testing.T) {
	const n = 4
	for _, style := range []string{envoy.StyleClusterHeader, envoy.StyleOriginalDst} {
		t.Run(style, func(t *testing.T) {
			sse, next := startSSEWorker(t, n)
			proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
				return setHeaders(envoy.TargetHeader, "w0", envoy.DestinationHeader, hostOf(sse))
			}, clear: true}.script)
			eps := map[string][]string{envoy.ExtProcClusterName: {proc.addr}}
			if style == envoy.StyleClusterHeader {
				eps = startFleet(t).endpoints(proc.addr)
				eps["w0"] = []string{hostOf(sse)}
			}
			g := startGateway(t, style, nil, eps)
			events := readEvents(t, g.URL(), next)
			if len(events) != n+1 || events[n] != "data: [DONE]" {
				t.Fatalf("events %q", events)
			}
			// kvroute sees every chunk: the first marks prefill done, the end frees the load.
			k := proc.lastSession(t).kinds()
			chunks := 0
			for _, kind := range k {
				if strings.HasPrefix(kind, "response_body") {
					chunks++
				}
			}
			if chunks < n+1 || k[len(k)-1] != "response_body_eos" {
				t.Fatalf("processor saw %d response chunks, ending %q; want at least %d ending response_body_eos", chunks, k[len(k)-1], n+1)
			}
		})
	}
}

func TestClientGoneCancelsProcessorStream(t *testing.T) {
	sse, _ := startSSEWorker(t, 2)
	proc := startProcServer(t, router{decide: func(*corev3.HeaderMap, []byte) *extprocsvc.HeaderMutation {
		return setHeaders(envoy.DestinationHeader, hostOf(sse))
	}}.script)
	g := startGateway(t, envoy.StyleOriginalDst, nil, map[string][]string{envoy.ExtProcClusterName: {proc.addr}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL()+"/v1/completions", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
	cancel()
	resp.Body.Close()
	s := proc.lastSession(t)
	if s.endErr == nil || strings.Contains(s.endErr.Error(), "EOF") {
		t.Fatalf("a client that leaves mid-stream must cancel the ext_proc stream, got %v", s.endErr)
	}
}

func TestH2CClient(t *testing.T) {
	f := startFleet(t)
	proc := startProcServer(t, router{decide: pickFromBody, clear: true}.script)
	g := startGateway(t, envoy.StyleClusterHeader, nil, f.endpoints(proc.addr))
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: p}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Post(g.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"user":"w3"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got seen
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 2 || got.Worker != "w3" {
		t.Fatalf("proto %s worker %q", resp.Proto, got.Worker)
	}
}
