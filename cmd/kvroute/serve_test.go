package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"github.com/kvroute/kvroute/internal/cli"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/extproc"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseServeFlagsAndEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, out string)
		wantErr string
	}{
		{
			name: "environment fills flags not given",
			args: []string{"--workers-file", "w.yaml"},
			env:  map[string]string{"KVROUTE_ROUTER_MODE": "round_robin", "KVROUTE_TOKENIZERS": "a=/x,b=/y", "KVROUTE_CHAT_TEMPLATES": "a=/t.jinja", "KVROUTE_NO_KV_EVENTS": "true", "KVROUTE_KV_OVERLAP_SCORE_WEIGHT": "2.5"},
		},
		{
			name: "command line beats environment",
			args: []string{"--workers-file", "w.yaml", "--router-mode", "random"},
			env:  map[string]string{"KVROUTE_ROUTER_MODE": "round_robin"},
		},
		{
			name: "tokenize's single-folder variables are not serve's",
			args: []string{"--workers-file", "w.yaml"},
			env:  map[string]string{"KVROUTE_TOKENIZER": "/models/qwen", "KVROUTE_CHAT_TEMPLATE": "/t.jinja"},
		},
		{
			name: "an old MODEL=DIR value of KVROUTE_TOKENIZER is still read",
			args: []string{"--workers-file", "w.yaml"},
			env:  map[string]string{"KVROUTE_TOKENIZER": "Qwen/Qwen3-8B=/tokenizers/Qwen3-8B"},
		},
		{name: "bare tokenizer folder", args: []string{"--workers-file", "w.yaml", "--tokenizer", "/models/qwen"}, wantErr: "MODEL=DIR"},
		{name: "bare chat template", args: []string{"--workers-file", "w.yaml", "--chat-template", "/t.jinja"}, wantErr: "MODEL=FILE"},
		{
			name: "xds address from the environment",
			args: []string{"--workers-file", "w.yaml"},
			env:  map[string]string{"KVROUTE_XDS_ADDR": "127.0.0.1:18000", "KVROUTE_XDS_NODE_ID": "edge-1"},
		},
		{name: "bad environment value", args: []string{"--workers-file", "w.yaml"}, env: map[string]string{"KVROUTE_FALLBACKS": "many"}, wantErr: "KVROUTE_FALLBACKS"},
		{name: "bad target value", args: []string{"--workers-file", "w.yaml", "--target-value", "pod"}, wantErr: "target-value"},
		{name: "bad body policy", args: []string{"--workers-file", "w.yaml", "--on-bad-body", "ignore"}, wantErr: "on-bad-body"},
		{name: "no discovery", args: nil, wantErr: "discovery"},
		{name: "client CA without a certificate", args: []string{"--workers-file", "w.yaml", "--tls-client-ca", "ca.pem"}, wantErr: "tls-cert"},
		{name: "unknown mode", args: []string{"--workers-file", "w.yaml", "--router-mode", "magic"}, wantErr: "magic"},
		{name: "multimodal models", args: []string{"--workers-file", "w.yaml", "--mm-model", "Qwen/Qwen2.5-VL-7B-Instruct=qwen2.5-vl", "--mm-inject-uuid=false"},
			env: map[string]string{"KVROUTE_MM_MODEL": "google/gemma-3-4b-it=gemma3"}},
		{name: "unknown multimodal family", args: []string{"--workers-file", "w.yaml", "--mm-model", "m=llava"}, wantErr: "llava"},
		{name: "multimodal model without family", args: []string{"--workers-file", "w.yaml", "--mm-model", "m"}, wantErr: "MODEL=FAMILY"},
		{name: "wildcard namespace", args: []string{"--workers-file", "w.yaml", "--namespace", "*"}, wantErr: "namespace"},
		{name: "bad allowed range", args: []string{"--workers-file", "w.yaml", "--allow-address-ranges", "169.254.0.0/99"}, wantErr: "allow-address-ranges"},
		{name: "missing admin token file", args: []string{"--workers-file", "w.yaml", "--admin-token-file", "/nonexistent/token"}, wantErr: "secret file"},
		{name: "nats password twice", args: []string{"--workers-file", "w.yaml", "--nats-password", "a", "--nats-password-file", "/x"}, wantErr: "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			cfg, err := parseServe(tt.args, &out, &out, envOf(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch tt.name {
			case "environment fills flags not given":
				if cfg.Scoring.Mode != "round_robin" || len(cfg.Tokenizers) != 2 || cfg.KVEvents || cfg.Scoring.PrefillLoadScale != 2.5 || cfg.Scoring.OverlapCredit != 1 {
					t.Errorf("cfg = %+v", cfg)
				}
				if cfg.Tokenizers["a"].ChatTemplate != "/t.jinja" {
					t.Errorf("chat template of a: %q", cfg.Tokenizers["a"].ChatTemplate)
				}
				if cfg.Stream.DefaultRequestMode != extproc.ModeBuffered || cfg.Fallbacks != 2 || cfg.GRPCAddr != ":9002" {
					t.Errorf("defaults lost: %+v", cfg)
				}
			case "tokenize's single-folder variables are not serve's":
				if len(cfg.Tokenizers) != 0 {
					t.Errorf("serve took tokenize's variables: %v", cfg.Tokenizers)
				}
				if !strings.Contains(out.String(), "ignoring KVROUTE_TOKENIZER") || !strings.Contains(out.String(), "ignoring KVROUTE_CHAT_TEMPLATE") {
					t.Errorf("no note about the ignored variables:\n%s", out.String())
				}
			case "an old MODEL=DIR value of KVROUTE_TOKENIZER is still read":
				if len(cfg.Tokenizers) != 1 || cfg.Tokenizers["Qwen/Qwen3-8B"].Dir != "/tokenizers/Qwen3-8B" {
					t.Errorf("tokenizers %v", cfg.Tokenizers)
				}
			case "xds address from the environment":
				if cfg.XDSAddr != "127.0.0.1:18000" || cfg.XDSNodeID != "edge-1" {
					t.Errorf("xds %q node %q", cfg.XDSAddr, cfg.XDSNodeID)
				}
			case "multimodal models":
				mm, ok := cfg.Multimodal["Qwen/Qwen2.5-VL-7B-Instruct"]
				if len(cfg.Multimodal) != 1 || !ok || mm.Processor.PatchSize != 14 || mm.InjectUUID {
					t.Errorf("multimodal %+v", cfg.Multimodal)
				}
			case "command line beats environment":
				if cfg.Scoring.Mode != "random" {
					t.Errorf("mode %s", cfg.Scoring.Mode)
				}
			}
		})
	}
}

func TestHelpAllExplainsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help-all"}, nil, &out, &out, envOf(nil)); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	cmd, _ := newServeFlags()
	cmd.Flags.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, cli.Hidden) {
			return
		}
		if !strings.Contains(out.String(), "--"+f.Name) || !strings.Contains(out.String(), envName(f.Name)) {
			t.Errorf("help lacks --%s or %s", f.Name, envName(f.Name))
		}
	})
	for _, want := range []string{"--router-mode", "--kv-overlap-score-weight", "--router-temperature", "--kv-events",
		"--kv-cache-block-size", "--router-queue-threshold", "--router-queue-policy", "--no-track-prefill-tokens", "--namespace", "--tokenizer", "--chat-template", "KVROUTE_TOKENIZERS", "KVROUTE_CHAT_TEMPLATES"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %s", want)
		}
	}
}

func TestEnvoyConfigIsACommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"envoy-config", "--style", "xds"}, nil, &out, &errOut, envOf(nil)); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if _, err := envoy.Validate(out.Bytes()); err != nil {
		t.Fatalf("envoy-config output is not a valid bootstrap: %v", err)
	}
	if !strings.Contains(out.String(), "ads") {
		t.Errorf("xds bootstrap does not mention ADS:\n%s", out.String())
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"frobnicate"}, nil, &out, &out, envOf(nil))
	if code := cli.Exit("kvroute", err, &out); code != 2 {
		t.Fatalf("err = %v (exit %d), want a usage error", err, code)
	}
}

func TestServeStartsAndStopsOnCancel(t *testing.T) {
	dir := t.TempDir()
	wf := filepath.Join(dir, "workers.json")
	if err := os.WriteFile(wf, []byte(`[{"id":"w0","model":"m","address":"127.0.0.1:9","block_size":16}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--workers-file", wf, "--grpc-addr", "127.0.0.1:0", "--http-addr", "-",
			"--embedded-nats-addr", "127.0.0.1:0", "--shutdown-grace", "1s", "--shutdown-drain-delay", "0s", "--log-level", "warn"}, nil, &logs, &logs, envOf(nil))
	}()
	time.Sleep(300 * time.Millisecond) // let it come up; a failure to start returns early
	select {
	case err := <-done:
		t.Fatalf("serve ended early: %v\n%s", err, logs.String())
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}

func TestEngineEventsListenFlags(t *testing.T) {
	none := envOf(nil)
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		wantEvents string
		wantReplay int
		wantErr    string
	}{
		{name: "listen implies zmq and no replay", args: []string{"--engine-events-listen", "tcp://0.0.0.0:5557"}, wantEvents: "zmq", wantReplay: -1},
		{name: "from the environment too", env: map[string]string{"KVROUTE_ENGINE_EVENTS_LISTEN": "tcp://0.0.0.0:5557"}, wantEvents: "zmq", wantReplay: -1},
		{name: "a replay port given is kept", args: []string{"--engine-events-listen", "tcp://0.0.0.0:5557", "--engine-replay-port", "5558"}, wantEvents: "zmq", wantReplay: 5558},
		{name: "listening with events over NATS is refused", args: []string{"--engine-events-listen", "tcp://0.0.0.0:5557", "--engine-events", "nats"}, wantErr: "engine-events-listen"},
		{name: "without listen nothing changes", wantEvents: "nats", wantReplay: 5558},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			env := none
			if tc.env != nil {
				env = envOf(tc.env)
			}
			cfg, err := parseServe(append([]string{"--workers-file", "w.yaml"}, tc.args...), &out, &out, env)
			if err == nil {
				err = cfg.Validate()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.EngineEvents != tc.wantEvents || cfg.EngineReplayPort != tc.wantReplay {
				t.Fatalf("engine events %q, replay port %d; want %q, %d", cfg.EngineEvents, cfg.EngineReplayPort, tc.wantEvents, tc.wantReplay)
			}
		})
	}
}
