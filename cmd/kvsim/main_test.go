package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/file"
	"github.com/kvroute/kvroute/fleet"
)

func TestFlagsComeFromEnvironmentAndCommandLine(t *testing.T) {
	env := map[string]string{
		"KVROUTE_WORKERS":        "8",
		"KVROUTE_NATS_URL":       "nats://127.0.0.1:4222",
		"KVROUTE_SPEEDUP":        "50",
		"KVROUTE_LEASE_TTL":      "3s",
		"KVROUTE_ETCD_ENDPOINTS": "http://a:2379, http://b:2379",
	}
	o, err := parseFlags([]string{"--speedup", "100", "--block-size", "16"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 8 || o.natsURL != "nats://127.0.0.1:4222" || o.leaseTTL != 3*time.Second {
		t.Fatalf("environment not applied: %+v", o)
	}
	if o.speedup != 100 || o.blockSize != 16 {
		t.Fatalf("command line must win over the environment: speedup %g block %d", o.speedup, o.blockSize)
	}
	cfg, err := fleetConfig(o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workers != 8 || len(cfg.EtcdEndpoints) != 2 || cfg.EtcdEndpoints[1] != "http://b:2379" ||
		cfg.Worker.Engine.BlockSize != 16 || cfg.Worker.Engine.NumGPUBlocks != 16384 {
		t.Fatalf("fleet config %+v", cfg)
	}
}

func TestBadSettingsAreRejected(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad environment value", nil, map[string]string{"KVROUTE_WORKERS": "many"}, "KVROUTE_WORKERS"},
		{"unknown flag", []string{"--nope"}, nil, "nope"},
		{"stray argument", []string{"extra"}, nil, "unexpected"},
		{"zero workers", []string{"--workers", "0"}, nil, "--workers"},
		{"negative block size", []string{"--block-size", "-1"}, nil, "block_size"},
		{"negative speedup", []string{"--speedup", "-1"}, nil, "--speedup"},
		{"EOS probability above 1", []string{"--eos-probability", "2"}, nil, "--eos-probability"},
		{"missing tokenizer folder", []string{"--tokenizer", "/nonexistent"}, nil, "tokenizer"},
		{"unknown timing", []string{"--timing", "a100-nothing"}, nil, "--timing: timing \"a100-nothing\": neither a known name"},
		{"bad timing file", []string{"--timing", "main_test.go"}, nil, "main_test.go: timing profile: invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseFlags(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if err == nil {
				_, err = fleetConfig(o, slog.New(slog.DiscardHandler))
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want mention of %q", err, tt.want)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "workers.json")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--workers", "2", "--base-port", "0", "--speedup", "1000",
			"--num-gpu-blocks", "64", "--block-size", "16", "--workers-file", path, "--log-level", "error"})
	}()
	var recs []fleet.Worker
	deadline := time.Now().Add(30 * time.Second)
	for {
		if data, err := os.ReadFile(path); err == nil {
			if recs, err = file.Parse(data, nil); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("workers file never appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(recs) != 2 || recs[1].ID != "w1" || recs[0].BlockSize != 16 || recs[0].KVTotalBlocks != 64 {
		t.Fatalf("records %+v", recs)
	}
	resp, err := http.Post("http://"+recs[1].Address+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":[1,2,3],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":2`) {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if _, err := http.Get("http://" + recs[0].Address + "/health"); err == nil {
		t.Fatal("worker still serving after shutdown")
	}
}

func TestTimingFlagReachesTheWorkers(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "polynomial"},
		{[]string{"--timing", "h100-llama3-8b"}, "h100-llama3-8b"},
		{[]string{"--timing", "../../tools/gpu/profiles/h100-32b-shape.json"}, "h100-32b-shape"},
	} {
		o, err := parseFlags(tt.args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := fleetConfig(o, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Worker.Timing.Name(); got != tt.want {
			t.Errorf("kvsim %v: workers' timing %q, want %q", tt.args, got, tt.want)
		}
	}
	var help strings.Builder
	if _, err := parseFlags([]string{"--help"}, func(string) string { return "" }, &help); err == nil || !strings.Contains(help.String(), "h100-llama3-8b") {
		t.Errorf("--help does not explain --timing:\n%s", help.String())
	}
}
