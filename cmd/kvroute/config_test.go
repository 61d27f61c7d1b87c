package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/flagfile"
	"github.com/kvroute/kvroute/scoring"
)

// writeConfig writes a configuration file in a test folder.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every visible serve flag has exactly one key, none is left to a
// catch-all section, and the routing settings a reload applies live under
// routing.
func TestConfigKeysEveryFlagOneKey(t *testing.T) {
	cmd, _ := newServeFlags()
	schema, err := serveSchema(cmd.Flags)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	cmd.Flags.VisitAll(func(f *flag.Flag) {
		key := schema.Key(f.Name)
		switch {
		case f.Name == configFlag || strings.HasPrefix(f.Usage, cli.Hidden):
			if key != "" {
				t.Errorf("--%s has the key %s, want none", f.Name, key)
			}
			return
		case key == "":
			t.Errorf("--%s has no key", f.Name)
			return
		case strings.HasPrefix(key, "other."):
			t.Errorf("--%s is in no help group, so its key is %s", f.Name, key)
		}
		if prev, ok := keys[key]; ok {
			t.Errorf("--%s and --%s share %s", prev, f.Name, key)
		}
		keys[key] = f.Name
		if schema.Flag(key) != f.Name {
			t.Errorf("key %s sets --%s, want --%s", key, schema.Flag(key), f.Name)
		}
		if reloadable[f.Name] && !strings.HasPrefix(key, "routing.") {
			t.Errorf("--%s reloads but its key %s is outside routing", f.Name, key)
		}
	})
	for name := range configHome {
		if cmd.Flags.Lookup(name) == nil {
			t.Errorf("configHome places --%s, which serve does not have", name)
		}
	}
	for name := range reloadable {
		if cmd.Flags.Lookup(name) == nil {
			t.Errorf("reloadable names --%s, which serve does not have", name)
		}
	}
	for key, want := range map[string]string{
		"routing.mode": "router-mode", "routing.cost.model": "cost-model", "routing.cost.params.prefill-rate": "prefill-rate",
		"routing.queue.max-length": "router-queue-max-length", "routing.health.eject-after": "eject-after",
		"server.grpc-addr": "grpc-addr", "discovery.pool-name": "pool-name", "security.nats-creds": "nats-creds",
	} {
		if got := schema.Flag(key); got != want {
			t.Errorf("%s sets --%s, want --%s", key, got, want)
		}
	}
}

// The defaults live in the flag registration; they agree with the
// packages' named defaults, and an empty file changes nothing.
func TestConfigDefaultsAgree(t *testing.T) {
	cmd, _ := newServeFlags()
	d := scoring.DefaultOptions()
	for name, want := range map[string]string{
		"router-mode": d.Mode, "cost-model": d.CostModel,
		"prefill-rate": fmt.Sprint(scoring.DefaultPrefillRate), "prefill-overhead": scoring.DefaultPrefillOverhead.String(),
		"decode-active-request-weight": fmt.Sprint(scoring.DefaultDecodeActiveRequests), "cache-churn-weight": fmt.Sprint(scoring.DefaultCacheChurnWeight),
		"duplicate-prefill-weight": fmt.Sprint(scoring.DefaultDuplicatePrefill), "decode-slowdown-weight": fmt.Sprint(scoring.DefaultDecodeSlowdownWeight),
		"router-queue-threshold": fmt.Sprint(scoring.DefaultQueueThreshold), "router-queue-policy": scoring.DefaultQueuePolicy,
		"router-queue-max-length": fmt.Sprint(scoring.DefaultQueueMaxLength), "router-queue-max-wait": scoring.DefaultQueueMaxWait.String(),
		"max-request-age": scoring.DefaultMaxRequestAge.String(), "stale-report-age": scoring.DefaultStaleReportAge.String(),
		"pending-overlay-ttl": scoring.DefaultPendingTTL.String(), "eject-after": fmt.Sprint(scoring.DefaultEjectAfter),
	} {
		if got := cmd.Flags.Lookup(name).DefValue; got != want {
			t.Errorf("--%s defaults to %s, scoring's default is %s", name, got, want)
		}
	}
	empty := writeConfig(t, "# nothing set\n")
	base, err := parseServe([]string{"--workers-file", "w.yaml"}, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	withFile, err := parseServe([]string{"--workers-file", "w.yaml", "--config", empty}, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	base.Logger, withFile.Logger = nil, nil
	if fmt.Sprintf("%+v", base) != fmt.Sprintf("%+v", withFile) {
		t.Errorf("an empty file changed the configuration:\n%+v\n%+v", base, withFile)
	}
}

// Precedence: defaults < file < KVROUTE_* < flags, with the source of each.
func TestConfigPrecedence(t *testing.T) {
	file := writeConfig(t, "routing:\n  mode: random\n  fallbacks: 1\n  cost:\n    params:\n      weighted-a: 3\n  queue:\n    max-length: 9\ndiscovery:\n  workers-file: w.yaml\n")
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		flag    string
		want    string
		wantSrc flagfile.SourceKind
	}{
		{"default", []string{"--config", file}, nil, "router-queue-max-wait", "30s", flagfile.Default},
		{"file over default", []string{"--config", file}, nil, "router-mode", "random", flagfile.File},
		{"env over file", []string{"--config", file}, map[string]string{"KVROUTE_ROUTER_MODE": "round_robin"}, "router-mode", "round_robin", flagfile.Env},
		{"flag over env and file", []string{"--config", file, "--router-mode", "least_loaded"}, map[string]string{"KVROUTE_ROUTER_MODE": "round_robin"}, "router-mode", "least_loaded", flagfile.Flag},
		{"file named by the environment", nil, map[string]string{"KVROUTE_CONFIG": file}, "weighted-a", "3", flagfile.File},
		{"file list item", []string{"--config", file}, nil, "router-queue-max-length", "9", flagfile.File},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := loadServe(tt.args, &bytes.Buffer{}, &bytes.Buffer{}, envOf(tt.env), os.ReadFile)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.cmd.Flags.Lookup(tt.flag).Value.String(); got != tt.want {
				t.Errorf("--%s = %s, want %s", tt.flag, got, tt.want)
			}
			if got := st.sources[tt.flag].Kind; got != tt.wantSrc {
				t.Errorf("--%s from %s, want %s", tt.flag, got, tt.wantSrc)
			}
			cfg, err := st.config(&bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Fallbacks != 1 || cfg.WorkersFile != "w.yaml" {
				t.Errorf("file values lost: fallbacks %d, workers file %q", cfg.Fallbacks, cfg.WorkersFile)
			}
		})
	}
}

// A bad file is refused with the key and, where the YAML has one, its line.
func TestConfigBadFiles(t *testing.T) {
	tests := []struct {
		name, file string
		want       []string
	}{
		{"unknown key", "routing:\n  mdoe: kv\n", []string{":2: routing.mdoe: unknown key (did you mean routing.mode?)"}},
		{"flag name at the top", "router-mode: kv\n", []string{":1: router-mode: unknown key (did you mean routing.mode?)"}},
		{"wrong type", "routing:\n  fallbacks: two\n", []string{":2: routing.fallbacks: \"two\""}},
		{"bad duration", "routing:\n  queue:\n    max-wait: 30\n", []string{":3: routing.queue.max-wait:", "want a duration"}},
		{"out of range", "discovery:\n  workers-file: w\nrouting:\n  cost:\n    params:\n      decode-slowdown-weight: -2\n", []string{":6: routing.cost.params.decode-slowdown-weight:", "must be a finite number ≥ 0"}},
		{"unknown mode", "discovery:\n  workers-file: w\nrouting:\n  mode: magic\n", []string{":4: routing.mode:", "magic"}},
		{"negative fallbacks", "discovery:\n  workers-file: w\nrouting:\n  fallbacks: -1\n", []string{":4: routing.fallbacks:"}},
		{"range error that names no setting", "discovery:\n  workers-file: w\nrouting:\n  queue:\n    max-length: -3\n", []string{":5: routing.queue.max-length:", "must not be negative"}},
		{"section as a value", "routing: kv\n", []string{":1: routing: is a section"}},
		{"not YAML", "routing: {\n", []string{"not YAML"}},
		{"hidden flags have no key", "events:\n  no-kv-events: true\n", []string{"unknown key"}},
		{"the file cannot name a file", "server:\n  config: x.yaml\n", []string{"unknown key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeConfig(t, tt.file)
			var out bytes.Buffer
			err := run(context.Background(), []string{"config", "validate", p}, nil, &out, &out, envOf(nil))
			if err == nil {
				t.Fatalf("validate accepted:\n%s", tt.file)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not name the file", err)
			}
			// serve refuses it the same way.
			if _, err := parseServe([]string{"--config", p}, &out, &out, envOf(nil)); err == nil {
				t.Errorf("serve accepted it")
			}
		})
	}
	if err := run(context.Background(), []string{"config", "validate", "/nonexistent.yaml"}, nil, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil)); err == nil {
		t.Error("validate accepted a missing file")
	}
}

// print shows every key with its value and where it came from; secrets
// are redacted.
func TestConfigPrintSources(t *testing.T) {
	file := writeConfig(t, "routing:\n  mode: random\ndiscovery:\n  workers-file: w.yaml\nsecurity:\n  nats-password: hunter2\n")
	var out bytes.Buffer
	env := map[string]string{"KVROUTE_FALLBACKS": "1"}
	if err := run(context.Background(), []string{"config", "print", "--config", file, "--log-level", "debug"}, nil, &out, &out, envOf(env)); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"  mode: random # file " + file + ":2",
		"  workers-file: w.yaml # file " + file + ":4",
		"  fallbacks: 1 # env KVROUTE_FALLBACKS",
		"  log-level: debug # flag",
		"  max-wait: 30s # default",
		"  nats-password: '[redacted]' # file",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("print lacks %q", want)
		}
	}
	if strings.Contains(got, "hunter2") {
		t.Error("print shows the password")
	}
	// What print shows, read back as a file, is the same configuration.
	again := writeConfig(t, strings.ReplaceAll(got, "'[redacted]'", "hunter2"))
	a, err := parseServe([]string{"--config", file, "--log-level", "debug"}, &bytes.Buffer{}, &bytes.Buffer{}, envOf(env))
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseServe([]string{"--config", again}, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	a.Logger, b.Logger = nil, nil
	if fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
		t.Errorf("print does not read back to the same configuration:\n%+v\n%+v", a, b)
	}
}

// The documented example is valid, every key it shows is real, and it
// sets what it shows.
func TestExampleConfigIsValid(t *testing.T) {
	const example = "../../docs/kvroute.yaml"
	var out bytes.Buffer
	if err := run(context.Background(), []string{"config", "validate", example}, nil, &out, &out, envOf(nil)); err != nil {
		t.Fatal(err)
	}
	st, err := loadServe([]string{"--config", example}, &bytes.Buffer{}, &bytes.Buffer{}, envOf(nil), os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.fromFile) < 30 {
		t.Errorf("the example sets %d keys; it should show every section", len(st.fromFile))
	}
	cfg, err := st.config(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Scoring.Mode != "kv" || cfg.Scoring.CostModel != "latency" || cfg.Scoring.QueueMaxWait != 30*time.Second || len(cfg.Tokenizers) != 1 {
		t.Errorf("example read as %+v", cfg.Scoring)
	}
}

// serve's loader never panics on a file, and refuses with a file error or
// a configuration error, never silently.
func FuzzServeConfig(f *testing.F) {
	example, _ := os.ReadFile("../../docs/kvroute.yaml")
	for _, seed := range []string{string(example), "", "routing:\n  mode: kv\n", "routing: {cost: {params: {weighted-a: -1}}}", "requests:\n  tokenizer: [a=b, c]\n", "limits: {max-streams: -1}"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := loadServe([]string{"--config", "fuzz.yaml"}, io.Discard, io.Discard, envOf(nil), func(string) ([]byte, error) { return data, nil })
		if err != nil {
			return
		}
		_, _ = st.config(io.Discard)
	})
}
