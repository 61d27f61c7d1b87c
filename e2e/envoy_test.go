package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/extproc"
	"github.com/kvroute/kvroute/internal/bench"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/server"
)

// styleCluster is the Envoy cluster through which a style reaches worker
// id: its own cluster (cluster-header), or the style's one shared cluster.
func styleCluster(style, id string) string {
	switch style {
	case envoy.StyleXDS:
		return envoy.WorkersClusterName
	case envoy.StyleOriginalDst:
		return envoy.OriginalDstClusterName
	}
	return id
}

// envoyCounts is Envoy's own count of requests per worker id, read from
// its admin API: where Envoy says the requests went.
func (s *system) envoyCounts(t *testing.T, style string) map[string]uint64 {
	t.Helper()
	hosts, err := s.Envoy.HostRequests(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, w := range s.Fleet.Workers() {
		out[w.ID()] = hosts[styleCluster(style, w.ID())][w.Addr()]
	}
	return out
}

// Every shipped style, run by Envoy itself: the second turn of a
// conversation goes where kvroute sent the first, with its prefix cached,
// and Envoy's own per-host counters agree with the workers on where each
// request went. For xds, the worker cluster Envoy routes through is the one
// kvroute serves over ADS, one endpoint per worker.
func TestEveryStyleRoutesThroughEnvoy(t *testing.T) {
	for _, style := range envoy.Styles {
		t.Run(style, func(t *testing.T) {
			s := start(t, options{workers: 3, style: style})
			if style == envoy.StyleXDS {
				hosts, err := s.Envoy.HostRequests(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := len(hosts[envoy.WorkersClusterName]); got != 3 {
					t.Fatalf("Envoy's %s cluster from kvroute's ADS has %d hosts, want 3: %v", envoy.WorkersClusterName, got, hosts)
				}
			}
			system := longText("styles "+style, 30)
			first := s.send(t, chat(system, "first"))
			eventually(t, "the router to index the first turn", func() bool {
				blocks, _, _ := s.indexed(first.Worker)
				return blocks > 0
			})
			second := s.send(t, chat(system, "first", "reply", "second"))
			if second.Worker != first.Worker || second.CachedTokens == 0 {
				t.Errorf("second turn on %s with %d cached tokens, want %s with its prefix cached", second.Worker, second.CachedTokens, first.Worker)
			}
			counts := s.envoyCounts(t, style)
			var total uint64
			for _, n := range counts {
				total += n
			}
			if counts[first.Worker] != 2 || total != 2 {
				t.Errorf("Envoy counts %v requests per worker, want both on %s", counts, first.Worker)
			}
		})
	}
}

// The response path reaches kvroute through Envoy's real messages: every
// request's end of stream frees its load (no request left active), and the
// worker that served learns a prefill rate (from its KV events' first
// tokens, with the default response path).
func TestEnvoyResponsePathFeedsLoadAndRates(t *testing.T) {
	for _, style := range []string{envoy.StyleClusterHeader, envoy.StyleOriginalDst} {
		t.Run(style, func(t *testing.T) {
			s := start(t, options{workers: 2, style: style})
			served := map[string]bool{}
			const n = 12
			for i := range n {
				r := s.send(t, chat(longText(fmt.Sprintf("response path %d", i), 8), "q"))
				served[r.Worker] = true
			}
			// A client that has read the last event may close before Envoy
			// tells kvroute the stream ended (outcome reset); either way the
			// load is freed, and no response counts as a failure.
			eventually(t, "every request to be freed", func() bool {
				return s.metric(t, "kvroute_requests_finished_total") == n
			})
			if bad := s.metric(t, "kvroute_requests_finished_total", `outcome="upstream_error"`) +
				s.metric(t, "kvroute_requests_finished_total", `outcome="local_reply"`); bad != 0 {
				t.Errorf("%v requests ended as failures", bad)
			}
			// Envoy resets each ext_proc stream once its exchange is over;
			// that is a normal end, not a stream error.
			if errs := s.metric(t, "kvroute_extproc_stream_errors_total"); errs != 0 {
				t.Errorf("%v ext_proc stream errors after %d completed requests", errs, n)
			}
			for _, w := range s.ids() {
				if a := s.metric(t, "kvroute_worker_active_requests", `worker="`+w+`"`); a != 0 {
					t.Errorf("worker %s still has %v active requests after every response ended", w, a)
				}
			}
			for w := range served {
				if rate := s.metric(t, "kvroute_worker_prefill_rate_tokens_per_second", `worker="`+w+`"`); rate <= 0 {
					t.Errorf("worker %s served requests but has no learned prefill rate", w)
				}
			}
		})
	}
}

// kvroute down: the styles that fail open (cluster-header, xds) still serve
// every request, spread over the workers, and a client's own routing
// headers cannot pick the worker; original-dst fails closed, as
// docs/operating.md says.
func TestRouterDownFailsOpenOrClosedByStyle(t *testing.T) {
	for _, tc := range []struct {
		style string
		open  bool
	}{{envoy.StyleClusterHeader, true}, {envoy.StyleXDS, true}, {envoy.StyleOriginalDst, false}} {
		t.Run(tc.style, func(t *testing.T) {
			s := start(t, options{workers: 3, style: tc.style})
			steer := s.Fleet.Workers()[0]
			// Routed by kvroute, a client's headers are overwritten too.
			r := s.sendWithHeaders(t, chat(longText("steer up", 4), "q"), http.Header{
				envoy.TargetHeader: {steer.ID()}, envoy.DestinationHeader: {steer.Addr()},
			})
			if r.status != http.StatusOK || r.predicted == "" {
				t.Fatalf("with kvroute up: status %d, predicted cached tokens %q; want 200 routed by kvroute", r.status, r.predicted)
			}
			if err := s.Router.Shutdown(); err != nil {
				t.Fatal(err)
			}
			workers, ok := map[string]int{}, 0
			for i := range 9 {
				r := s.sendWithHeaders(t, chat(longText(fmt.Sprintf("down %d", i), 4), "q"), http.Header{
					envoy.TargetHeader: {steer.ID()}, envoy.DestinationHeader: {steer.Addr()},
				})
				if r.status == http.StatusOK {
					ok++
					workers[r.worker]++
					if r.predicted != "" {
						t.Errorf("request %d carries a prediction with kvroute down", i)
					}
				}
			}
			if !tc.open {
				if ok != 0 {
					t.Errorf("%d of 9 requests served with kvroute down; %s must fail closed", ok, tc.style)
				}
				return
			}
			if ok != 9 {
				t.Errorf("%d of 9 requests served with kvroute down, want all (fail open)", ok)
			}
			if len(workers) < 2 {
				t.Errorf("fail-open requests all went to %v: the client's %s picked the worker", workers, envoy.TargetHeader)
			}
		})
	}
}

// Envoy dials kvroute over mutual TLS (kvroute --tls-cert, --tls-key,
// --tls-client-ca; envoy-config --ext-proc-tls-*): requests are routed by
// kvroute, not let through by fail-open.
func TestEnvoyReachesKvrouteOverMutualTLS(t *testing.T) {
	ca, cert, key := testenv.WritePKI(t, t.TempDir())
	s := start(t, options{workers: 2,
		router: func(c *server.Config) {
			tlsCfg, err := extproc.LoadTLS(cert, key, ca)
			if err != nil {
				t.Fatal(err)
			}
			c.TLS = tlsCfg
		},
		envoyTLS: &envoy.TLSFiles{CAFile: ca, CertFile: cert, KeyFile: key},
	})
	for i := range 3 {
		r := s.send(t, chat(longText(fmt.Sprintf("mtls %d", i), 4), "q"))
		if r.PredictedCached == nil {
			t.Fatalf("request %d was not routed by kvroute (no prediction): Envoy failed open", i)
		}
	}
	if n := s.metric(t, "kvroute_requests_total"); n < 3 {
		t.Errorf("kvroute counted %v requests over mTLS, want 3", n)
	}
}

// rawResult is what sendWithHeaders reads of a response.
type rawResult struct {
	status            int
	worker, predicted string
}

// sendWithHeaders posts a non-streaming chat with extra request headers
// through Envoy.
func (s *system) sendWithHeaders(t *testing.T, body []byte, h http.Header) rawResult {
	t.Helper()
	body = bytes.Replace(body, []byte(`"stream":true`), []byte(`"stream":false`), 1)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+bench.PathChat, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		req.Header = h.Clone()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := rawResult{status: resp.StatusCode, predicted: resp.Header.Get("x-kvroute-predicted-cached-tokens")}
	if resp.StatusCode == http.StatusOK {
		out.worker = bench.WorkerFromID(b)
	}
	return out
}

// Envoy's ORIGINAL_DST cluster reads x-gateway-destination-endpoint as one
// ip:port: with kvroute's default fallback list in it, Envoy answers 503,
// which is why the original-dst style runs with --fallbacks 0.
func TestOriginalDstAnswersAnEndpointList503(t *testing.T) {
	s := start(t, options{workers: 3, style: envoy.StyleOriginalDst, router: func(c *server.Config) { c.Fallbacks = 2 }})
	if r := s.sendWithHeaders(t, chat(longText("list", 4), "q"), nil); r.status != http.StatusServiceUnavailable {
		t.Errorf("status %d with an endpoint list, want 503 (Envoy's ORIGINAL_DST takes one ip:port)", r.status)
	}
}

// A streamed answer through Envoy keeps its load on the worker until its
// last event, whatever Envoy shows kvroute of the response: with the
// default (the response headers to the observing filter) and with
// --response-path headers no body chunk reaches kvroute, and the routing
// ext_proc stream's end, when the request ends, frees the load as a normal
// end; with --response-path streamed every chunk does and the last one frees it.
func TestEnvoyHoldsLoadUntilTheStreamedAnswerEnds(t *testing.T) {
	for _, tc := range []struct{ style, path string }{
		{envoy.StyleClusterHeader, envoy.ResponsePathObserved},
		{envoy.StyleOriginalDst, envoy.ResponsePathObserved},
		{envoy.StyleXDS, envoy.ResponsePathObserved},
		{envoy.StyleClusterHeader, envoy.ResponsePathHeaders},
		{envoy.StyleOriginalDst, envoy.ResponsePathHeaders},
		{envoy.StyleXDS, envoy.ResponsePathHeaders},
		{envoy.StyleClusterHeader, envoy.ResponsePathStreamed},
		{envoy.StyleOriginalDst, envoy.ResponsePathStreamed},
	} {
		t.Run(tc.style+"/"+tc.path, func(t *testing.T) {
			s := start(t, options{workers: 2, style: tc.style, speedup: 2, responsePath: tc.path})
			body := bytes.Replace(chat(longText("held "+tc.style, 8), "q"), []byte(`"max_tokens":8`), []byte(`"max_tokens":200`), 1)
			resp, err := http.Post(s.URL()+bench.PathChat, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			events := 0
			for sc.Scan() {
				if len(sc.Bytes()) == 0 {
					continue
				}
				if events++; events == 100 {
					var active float64
					for _, w := range s.ids() {
						active += s.metric(t, "kvroute_worker_active_requests", `worker="`+w+`"`)
					}
					if active != 1 || s.metric(t, "kvroute_requests_finished_total") != 0 {
						t.Errorf("mid-answer (event %d): %v active requests, %v finished; want the request active", events, active, s.metric(t, "kvroute_requests_finished_total"))
					}
				}
			}
			if events < 150 {
				t.Fatalf("answer had %d events, want about 200", events)
			}
			eventually(t, "the answer's load to be freed", func() bool {
				return s.metric(t, "kvroute_requests_finished_total") == 1
			})
			if ok := s.metric(t, "kvroute_requests_finished_total", `outcome="ok"`); ok != 1 {
				t.Errorf("the answer did not end as ok")
			}
			chunks := s.metric(t, "kvroute_extproc_exchanges_total", `phase="response_body"`)
			if tc.path == envoy.ResponsePathHeaders && chunks != 0 {
				t.Errorf("%v response body messages reached kvroute, want none", chunks)
			}
			if tc.path == envoy.ResponsePathStreamed && chunks == 0 {
				t.Errorf("no response body message reached kvroute with --response-path streamed")
			}
		})
	}
}

// With the default response path Envoy waits on kvroute once per request:
// for the answer to the request body (cluster-header, xds), or to the
// request's messages answered together after the whole body
// (FULL_DUPLEX_STREAMED, original-dst). The response headers still reach
// kvroute, without Envoy waiting, through the observing filter, and each
// report finds the request it is about.
func TestEnvoyWaitsOnKvrouteOncePerRequest(t *testing.T) {
	for _, tc := range []struct {
		style string
		// waited lists the phases Envoy holds the request for.
		waited []string
	}{
		{envoy.StyleClusterHeader, []string{extproc.ExchangeRequestBody}},
		{envoy.StyleXDS, []string{extproc.ExchangeRequestBody}},
		{envoy.StyleOriginalDst, []string{extproc.ExchangeRequestHeaders, extproc.ExchangeRequestBody}},
	} {
		t.Run(tc.style, func(t *testing.T) {
			s := start(t, options{workers: 2, style: tc.style})
			const n = 6
			for i := range n {
				s.send(t, chat(longText(fmt.Sprintf("one wait %d", i), 4), "q"))
			}
			eventually(t, "every request to be freed", func() bool {
				return s.metric(t, "kvroute_requests_finished_total") == n
			})
			for _, ph := range []string{extproc.ExchangeRequestHeaders, extproc.ExchangeRequestBody, extproc.ExchangeResponseHeaders, extproc.ExchangeResponseBody} {
				got := s.metric(t, "kvroute_extproc_exchanges_total", `phase="`+ph+`"`, `blocking="true"`)
				switch want := slices.Contains(tc.waited, ph); {
				case want && got < n:
					t.Errorf("%s: %v messages Envoy waited on for %d requests, want at least one per request", ph, got, n)
				case !want && got != 0:
					t.Errorf("%s: Envoy waited on %v messages, want none", ph, got)
				}
			}
			if got := s.metric(t, "kvroute_extproc_exchanges_total", `phase="response_headers"`, `blocking="false"`); got != n {
				t.Errorf("%v response headers observed without waiting, want %d", got, n)
			}
			if got := s.metric(t, "kvroute_extproc_observations_total", `matched="true"`); got != n {
				t.Errorf("%v observations matched to their request, want %d", got, n)
			}
			if bad := s.metric(t, "kvroute_requests_finished_total", `outcome="ok"`); bad != n {
				t.Errorf("%v requests ended ok, want %d", bad, n)
			}
		})
	}
}
