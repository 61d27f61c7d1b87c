package main

import (
	"flag"
	"strings"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/internal/flagfile"
)

// The configuration file has one key per serve flag, derived here from the
// flag's help group so that a new flag gets a key without anyone writing
// one: the group names a section and the key is the flag's name, e.g.
// --state-dir is discovery.state-dir. The routing section is the
// exception: mode, cost model, cost parameters, health and queue, in the
// spirit of a scheduler's plugin configuration:
//
//	routing:
//	  mode: kv
//	  fallbacks: 1
//	  cost:
//	    model: latency
//	    params: {prefill-rate: 20000, ...}   # the rest of "Routing cost"
//	  health: {eject-after: 2, ...}
//	  queue: {policy: fcfs, threshold: 4, max-length: 1024, max-wait: 30s}
var groupSection = map[string][]string{
	"Start here":    {"server"}, // where configHome does not say
	"Discovery":     {"discovery"},
	"Events":        {"events"},
	"Routing cost":  {"routing", "cost", "params"},
	"Requests":      {"requests"},
	"Limits":        {"limits"},
	"Security":      {"security"},
	"Observability": {"observability"},
}

// configHome places the flags that their help group does not: the
// "Start here" flags, and the routing keys outside routing.cost.params.
var configHome = map[string][]string{
	"router-mode":             {"routing", "mode"},
	"cost-model":              {"routing", "cost", "model"},
	"fallbacks":               {"routing", "fallbacks"},
	"eject-after":             {"routing", "health", "eject-after"},
	"eject-backoff":           {"routing", "health", "eject-backoff"},
	"eject-backoff-max":       {"routing", "health", "eject-backoff-max"},
	"router-queue-policy":     {"routing", "queue", "policy"},
	"router-queue-threshold":  {"routing", "queue", "threshold"},
	"router-queue-max-length": {"routing", "queue", "max-length"},
	"router-queue-max-wait":   {"routing", "queue", "max-wait"},
	"tokenizer":               {"requests", "tokenizer"},
	"chat-template":           {"requests", "chat-template"},
	"workers-file":            {"discovery", "workers-file"},
	"etcd-endpoints":          {"discovery", "etcd-endpoints"},
	"pool-name":               {"discovery", "pool-name"},
	"nats-url":                {"events", "nats-url"},
	"namespace":               {"server", "namespace"},
	"grpc-addr":               {"server", "grpc-addr"},
	"http-addr":               {"server", "http-addr"},
	"admin-listen":            {"server", "admin-listen"},
}

// reloadable are the flags whose change in the file a running router
// applies (scoring.Scheduler.Reconfigure); a change of any other key is
// logged as needing a restart.
var reloadable = map[string]bool{
	"router-mode": true, "cost-model": true,
	"kv-overlap-score-credit": true, "prefill-load-scale": true, "kv-overlap-score-weight": true,
	"host-cache-hit-weight": true, "disk-cache-hit-weight": true,
	"decode-active-request-weight": true, "decode-slowdown-weight": true, "duplicate-prefill-weight": true,
	"cache-churn-weight": true, "no-track-prefill-tokens": true, "router-temperature": true,
	"weighted-a": true, "weighted-b": true, "weighted-c": true,
	"router-queue-threshold": true, "router-queue-max-length": true, "router-queue-max-wait": true,
}

// secretFlags print as [redacted] in `kvroute config print`.
var secretFlags = map[string]bool{"etcd-password": true, "nats-password": true}

// configOrder is the order of `kvroute config print`: sections as in
// --help-all, the routing section in reading order.
var configOrder = []string{"server", "routing", "routing.mode", "routing.cost", "routing.cost.model", "routing.cost.params",
	"routing.queue", "routing.queue.policy", "routing.queue.threshold", "routing.health", "routing.fallbacks",
	"discovery", "events", "requests", "limits", "security", "observability"}

// configFlag names the file; it has no key of its own.
const configFlag = "config"

// configKey is a serve flag's key path (nil: none).
func configKey(groups []cli.Group) func(*flag.Flag) []string {
	group := map[string]string{}
	for _, g := range groups {
		for _, f := range g.Flags {
			group[f] = g.Title
		}
	}
	return func(f *flag.Flag) []string {
		if f.Name == configFlag || strings.HasPrefix(f.Usage, cli.Hidden) {
			return nil
		}
		if p, ok := configHome[f.Name]; ok {
			return p
		}
		sec, ok := groupSection[group[f.Name]]
		if !ok {
			sec = []string{"other"} // a flag in no group: TestServeHelpGroupsEveryFlag fails
		}
		return append(append([]string(nil), sec...), f.Name)
	}
}

// serveSchema is the configuration file's schema for serve's flag set.
func serveSchema(fs *flag.FlagSet) (*flagfile.Schema, error) {
	return flagfile.New(fs, configKey(serveGroups), configOrder...)
}
