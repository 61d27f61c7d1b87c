package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A NATS outage is a degraded mode, not a readiness failure: /readyz and
// the gRPC health service "" stay SERVING, /debug/workers and
// kvroute_degraded show it, and requests keep being routed. Failing
// readiness here would take every replica out of a fail-closed Envoy.
func TestNATSOutageKeepsReadiness(t *testing.T) {
	s := start(t, options{workers: 2})
	cc, err := grpc.NewClient(s.Router.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		defer cancel()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health %q: %v", service, err)
		}
		return resp.GetStatus()
	}
	eventually(t, "health \"\" SERVING before the outage", func() bool {
		return health("") == healthpb.HealthCheckResponse_SERVING
	})

	s.NATS.Stop()
	eventually(t, "the router to notice the NATS outage", func() bool {
		return slices.Contains(s.Router.Degraded(), "nats")
	})
	if !s.Router.Ready() {
		t.Errorf("not ready during the NATS outage: %s", s.Router.NotReadyReason())
	}
	for _, svc := range []string{"", "readiness", "liveness"} {
		if st := health(svc); st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q during the NATS outage: %v, want SERVING", svc, st)
		}
	}
	resp, err := http.Get(s.RouterURL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var rz struct {
		Ready    bool     `json:"ready"`
		Degraded []string `json:"degraded"`
	}
	err = json.NewDecoder(resp.Body).Decode(&rz)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !rz.Ready || !slices.Contains(rz.Degraded, "nats") {
		t.Errorf("/readyz during the NATS outage: %d %+v %v; want 200, ready, degraded [nats]", resp.StatusCode, rz, err)
	}
	if g := s.metric(t, "kvroute_degraded", `component="nats"`); g != 1 {
		t.Errorf("kvroute_degraded{component=\"nats\"} = %v during the outage, want 1", g)
	}
	if got := s.debugDegraded(t); !slices.Contains(got, "nats") {
		t.Errorf("/debug/workers degraded = %v during the outage, want nats", got)
	}
	for i := range 4 {
		if r := s.send(t, chat(longText("outage", 5), "q")); r.Worker == "" {
			t.Errorf("request %d during the outage was not routed: %+v", i, r)
		}
	}

	s.NATS.Resume(t)
	eventually(t, "the degraded mode to end after NATS is back", func() bool {
		return len(s.Router.Degraded()) == 0
	})
	if g := s.metric(t, "kvroute_degraded", `component="nats"`); g != 0 {
		t.Errorf("kvroute_degraded{component=\"nats\"} = %v after the outage, want 0", g)
	}
}

// debugDegraded reads "degraded" from /debug/workers.
func (s *system) debugDegraded(t *testing.T) []string {
	t.Helper()
	resp, err := http.Get(s.AdminURL() + "/debug/workers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var dw struct {
		Degraded []string `json:"degraded"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&dw); err != nil {
		t.Fatal(err)
	}
	return dw.Degraded
}
