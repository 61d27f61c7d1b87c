package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/engine/vllmzmq"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func host(name string) func() (string, error) { return func() (string, error) { return name, nil } }

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(*options) string
		wantErr string
	}{
		{"defaults from the pod", nil, map[string]string{"POD_NAME": "vllm-0", "POD_IP": "10.1.2.3", "KVROUTE_ETCD_ENDPOINTS": "http://etcd:2379"},
			func(o *options) string {
				if o.workerID != "vllm-0" || o.advertiseAddress != "10.1.2.3:8000" || o.engine != "vllm" ||
					o.eventsEndpoint != "tcp://127.0.0.1:5557" || o.scrapeInterval != 250*time.Millisecond {
					return "pod defaults not applied"
				}
				return ""
			}, ""},
		{"env sets, command line wins", []string{"--namespace", "prod", "--engine-url", "http://127.0.0.1:30000"},
			map[string]string{"KVROUTE_NAMESPACE": "staging", "KVROUTE_ENGINE": "sglang", "KVROUTE_WORKER_ID": "sg-1", "KVROUTE_DATA_PARALLEL_SIZE": "4"},
			func(o *options) string {
				if o.namespace != "prod" || o.engine != "sglang" || o.workerID != "sg-1" || o.dpSize != 4 || o.engineURL != "http://127.0.0.1:30000" {
					return "precedence wrong"
				}
				return ""
			}, ""},
		{"host name when no POD_NAME", nil, nil, func(o *options) string {
			if o.workerID != "node-7" || o.advertiseAddress != "" {
				return "host name not used or address set without etcd"
			}
			return ""
		}, ""},
		{"registration needs an address", []string{"--etcd-endpoints", "http://e:2379"}, nil, nil, "POD_IP is not set"},
		{"unknown engine", []string{"--engine", "tgi"}, nil, nil, "unknown engine"},
		{"bad env value", nil, map[string]string{"KVROUTE_SCRAPE_INTERVAL": "fast"}, nil, "KVROUTE_SCRAPE_INTERVAL"},
		{"stray argument", []string{"serve"}, nil, nil, "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, env(tt.env), host("node-7"), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.check(o); msg != "" {
				t.Errorf("%s: %+v", msg, *o)
			}
		})
	}
}

func TestHelpNamesEveryFlagsVariable(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags([]string{"--help"}, env(nil), host("h"), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: %v", err)
	}
	help := out.String()
	newFlagSet(&options{}).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help, "--"+f.Name) || !strings.Contains(help, envName(f.Name)) {
			t.Errorf("--help does not document --%s and %s", f.Name, envName(f.Name))
		}
	})
	for _, s := range []string{"--kv-events-config", "replay_endpoint", "AllBlocksCleared"} {
		if !strings.Contains(help, s) {
			t.Errorf("--help does not mention %q", s)
		}
	}
}

// TestRunForwardsRegistersAndDeregistersOnShutdown runs the command as main
// does, beside an engine made of a vllmzmq.Publisher and an HTTP server
// with vLLM's endpoints.
func TestRunForwardsRegistersAndDeregistersOnShutdown(t *testing.T) {
	testenv.Quiet()
	ns := testenv.StartNATS(t)
	etcd := testenv.StartEtcd(t)
	pub, err := vllmzmq.NewPublisher(context.Background(), vllmzmq.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events", Mode: vllmzmq.Bind,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	metrics, err := os.ReadFile("../../engine/testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	models, err := os.ReadFile("../../engine/testdata/vllm_models.json")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(models) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(metrics) })
	engine := httptest.NewServer(mux)
	defer engine.Close()

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(bus.EventsSubject("demo", "vllm-0"), events); err != nil {
		t.Fatal(err)
	}
	loads := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(bus.LoadSubject("demo", "vllm-0"), loads); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	statusAddr := freeAddr(t)
	vars := map[string]string{
		"KVROUTE_NAMESPACE":       "demo",
		"KVROUTE_ENGINE_URL":      engine.URL,
		"KVROUTE_EVENTS_ENDPOINT": pub.Endpoint(),
		"KVROUTE_REPLAY_ENDPOINT": pub.ReplayEndpoint(),
		"KVROUTE_TOPIC":           "kv-events",
		"KVROUTE_NATS_URL":        ns.URL,
		"KVROUTE_ETCD_ENDPOINTS":  strings.Join(etcd.Endpoints, ","),
		"KVROUTE_SCRAPE_INTERVAL": "50ms",
		"KVROUTE_LEASE_TTL":       "2s",
		"KVROUTE_LOG_LEVEL":       "error",
		"KVROUTE_HTTP_ADDR":       statusAddr,
		"POD_NAME":                "vllm-0",
		"POD_IP":                  "10.9.8.7",
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, env(vars), host("unused"), io.Discard) }()

	key := bus.WorkerKey("demo", "vllm-0")
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := cli.Get(context.Background(), key)
		if err == nil && len(resp.Kvs) == 1 {
			rec, err := discovery.ParseRecord(resp.Kvs[0].Value)
			if err != nil || rec.Address != "10.9.8.7:"+engine.URL[strings.LastIndexByte(engine.URL, ':')+1:] {
				t.Fatalf("record %+v (err %v): address should be POD_IP and the engine's port", rec, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kvbridge never registered")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Events: publish until one arrives (the SUB joins asynchronously).
	payload := []byte{0x93, 0xcb, 0x41, 0xda, 0, 0, 0, 0, 0, 0, 0x90, 0x00}
	got := false
	for i := 0; i < 100 && !got; i++ {
		if _, err := pub.Publish(payload); err != nil {
			t.Fatal(err)
		}
		timeout := time.After(100 * time.Millisecond)
	wait:
		for {
			select {
			case m := <-events:
				if bytes.Equal(m.Data, payload) {
					got = true
					break wait
				}
			case <-timeout:
				break wait
			}
		}
	}
	if !got {
		t.Fatal("no event reached NATS")
	}
	select {
	case <-loads:
	case <-time.After(5 * time.Second):
		t.Fatal("no load report")
	}

	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/metrics": "kvbridge_batches_forwarded_total"} {
		resp, err := http.Get("http://" + statusAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d %q, want 200 containing %q", path, resp.StatusCode, b, want)
		}
	}

	cancel() // SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("kvbridge did not stop")
	}
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Error("worker still registered after shutdown")
	}
}

// kvbridge takes the same NATS and etcd credential and TLS flags as
// kvroute (package connflag), from the command line or the environment.
func TestCredentialFlags(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--nats-user", "bridge", "--nats-password-file", pw, "--etcd-username", "root", "--etcd-ca", "/ca.pem"},
		env(map[string]string{"KVROUTE_ETCD_PASSWORD": "x", "KVROUTE_NATS_TLS_CA": "/nats-ca.pem"}), host("h"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.nats.User != "bridge" || o.nats.CA != "/nats-ca.pem" || o.etcd.Username != "root" || o.etcd.CA != "/ca.pem" || o.etcd.Password != "x" {
		t.Errorf("nats %+v etcd %+v", o.nats, o.etcd)
	}
	if s, err := o.nats.Secret(); err != nil || s != "s3cret" {
		t.Errorf("nats password %q, %v", s, err)
	}
	if _, err := o.nats.Options(); err == nil || !strings.Contains(err.Error(), "nats CA") {
		t.Errorf("options with a missing CA file: %v, want an error naming it", err)
	}
}
