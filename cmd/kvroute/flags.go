package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/envflag"
	"github.com/kvroute/kvroute/multimodal"
	"github.com/kvroute/kvroute/picker"
)

// envName is the environment variable that sets a flag: KVROUTE_<FLAG>,
// except where envNames says otherwise.
func envName(flagName string) string {
	if n, ok := envNames[flagName]; ok {
		return n
	}
	return envflag.Name(flagName)
}

// envNames renames the variables of serve flags whose plain name `kvroute
// tokenize` already uses with another meaning: there KVROUTE_TOKENIZER is
// one folder and KVROUTE_CHAT_TEMPLATE one file, here they are MODEL=DIR
// and MODEL=FILE lists. A shared environment then cannot feed tokenize's
// folder to serve as a malformed spec (or the other way round).
var envNames = map[string]string{
	"tokenizer":     "KVROUTE_TOKENIZERS",
	"chat-template": "KVROUTE_CHAT_TEMPLATES",
}

// applyEnv sets every flag not given on the command line from its
// KVROUTE_* variable.
func applyEnv(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) error {
	return envflag.Apply(fs, lookupEnv, envName)
}

// legacyEnv reads the single-path variables that serve's list flags were
// once read from (KVROUTE_TOKENIZER, KVROUTE_CHAT_TEMPLATE) for flags that
// neither the command line nor their own variable set. A value in the list
// form (MODEL=PATH,...) is still taken, with a note; a bare path is
// `kvroute tokenize`'s meaning and is ignored, with a note, rather than
// refused: one environment may serve both commands.
func legacyEnv(fs *flag.FlagSet, lookupEnv func(string) (string, bool), note io.Writer) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, plural := range envNames {
		old := envflag.Name(name)
		v, ok := lookupEnv(old)
		if _, set := lookupEnv(plural); !ok || set || given[name] || strings.TrimSpace(v) == "" {
			continue
		}
		listForm := true
		for _, e := range strings.Split(v, ",") {
			if k, p, ok := strings.Cut(strings.TrimSpace(e), "="); !ok || k == "" || p == "" {
				listForm = false
			}
		}
		if !listForm {
			fmt.Fprintf(note, "kvroute serve: ignoring %s=%q (a single path is for `kvroute tokenize`); serve reads %s=MODEL=PATH,...\n", old, v, plural)
			continue
		}
		fmt.Fprintf(note, "kvroute serve: reading %s as %s; please rename it\n", old, plural)
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("%s=%q: %w", old, v, err)
		}
	}
	return nil
}

// stringList is a repeatable flag; from the environment, values are
// comma-separated.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

// Repeatable makes the list a YAML sequence in the configuration file.
func (l *stringList) Repeatable() bool { return true }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

const serveUsage = `kvroute — KV-cache-aware router for LLM inference, as an Envoy ext_proc server.

Usage:
  kvroute [serve] [flags]       run the router (default)
  kvroute tokenize [flags]      tokenize JSON lines from stdin as the router does
  kvroute envoy-config [flags]  print an Envoy bootstrap (--style cluster-header, original-dst or xds)
  kvroute config validate FILE  check a configuration file (exit 0 when good)
  kvroute config print [flags]  the effective configuration, with where each value came from
  kvroute version               module version, VCS revision, Go version (also --version)
  kvroute help                  this text with every flag (also --help-all)

For every request Envoy sends over ext_proc, kvroute tokenizes the OpenAI body
as the model server will, finds how many leading KV blocks each worker holds
(from vLLM KV events on NATS), weighs that against load, and sets
x-target-worker, x-gateway-destination-endpoint and envoy.lb metadata.
Workers come from etcd (--etcd-endpoints), a static file (--workers-file) or
a Gateway API InferencePool (--pool-name; with --engine-events zmq and
--engine-load scrape it needs no NATS, etcd or sidecar).
Every flag can also be set with the environment variable shown, and every
setting has a key in the --config file (flags > KVROUTE_* > file > default).
Note that
serve's tokenizers are KVROUTE_TOKENIZERS=MODEL=DIR[,MODEL=DIR...] (and
KVROUTE_CHAT_TEMPLATES=MODEL=FILE,...): KVROUTE_TOKENIZER and
KVROUTE_CHAT_TEMPLATE are single paths for ` + "`kvroute tokenize`" + `; serve
ignores them (and says so), except an old MODEL=DIR value, still read.
Secrets can come from files: --etcd-password-file, --nats-creds.`

// parseMMModels reads --mm-model MODEL=FAMILY values.
func parseMMModels(specs []string, inject bool) (map[string]picker.MultimodalModel, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := make(map[string]picker.MultimodalModel, len(specs))
	for _, spec := range specs {
		model, fam, ok := strings.Cut(spec, "=")
		if !ok || model == "" {
			return nil, cli.Usagef("--mm-model %q: want MODEL=FAMILY", spec)
		}
		f, err := multimodal.ParseFamily(fam)
		if err != nil {
			return nil, cli.Usagef("--mm-model %q: %v", spec, err)
		}
		out[model] = picker.MultimodalModel{Processor: multimodal.DefaultProcessor(f), InjectUUID: inject}
	}
	return out, nil
}
