package main

import "github.com/kvroute/kvroute/internal/cli"

// serveGroups are the headings of `kvroute serve --help-all`, most
// asked-for first. Every serve flag belongs to one
// (TestServeHelpGroupsEveryFlag), and a flag's group also places it in the
// configuration file (configKey).
var serveGroups = []cli.Group{
	{Title: "Start here", Flags: startHere},
	{Title: "Discovery", Flags: []string{"workers-file-interval", "lease-flap-grace", "state-dir", "pool-namespace", "pool-model", "pool-block-size", "pool-kv-blocks", "kubeconfig", "xds-addr", "xds-node-id"}},
	{Title: "Events", Flags: []string{"kv-events", "kv-cache-block-size", "engine", "engine-events", "engine-events-listen", "engine-events-port", "engine-events-topic", "engine-replay-port", "engine-load",
		"index-jump-search", "index-grow-tables", "embedded-nats-addr", "durable-events", "events-max-age", "events-max-bytes", "jetstream-dir", "jetstream-replicas", "snapshot-interval",
		"warm-from", "warm-timeout", "resync-interval", "stale-report-age", "replica-sync", "router-id", "sync-heartbeat"}},
	{Title: "Routing cost", Flags: []string{"cost-model", "prefill-rate", "prefill-overhead", "learn-prefill-rate", "prefill-backlog-decay", "eviction-forecast", "prefill-load-scale",
		"decode-active-request-weight", "decode-slowdown-weight", "duplicate-prefill-weight", "cache-churn-weight", "prefill-context-cost", "decode-kv-cost", "host-cache-hit-weight", "disk-cache-hit-weight",
		"kv-overlap-score-weight", "kv-overlap-score-credit", "pending-overlay-ttl", "no-track-prefill-tokens", "router-temperature",
		"weighted-a", "weighted-b", "weighted-c", "fallbacks", "eject-after", "eject-backoff", "eject-backoff-max"}},
	{Title: "Requests", Flags: []string{"model-header", "target-header", "target-value", "default-body-mode", "on-bad-body", "mm-model", "mm-inject-uuid", "render-addr"}},
	{Title: "Limits", Flags: []string{"max-body-bytes", "max-messages", "max-prompt-bytes", "max-concurrent-decisions", "max-request-age", "max-streams",
		"router-queue-policy", "router-queue-threshold", "router-queue-max-length", "router-queue-max-wait",
		"stream-idle-timeout", "conn-idle-timeout", "keepalive-min-time", "shutdown-drain-delay", "shutdown-grace"}},
	{Title: "Security", Flags: []string{"tls-cert", "tls-key", "tls-client-ca", "admin-token-file", "allow-address-ranges",
		"etcd-ca", "etcd-cert", "etcd-key", "etcd-username", "etcd-password", "etcd-password-file",
		"nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-password-file", "nats-tls-ca", "nats-tls-cert", "nats-tls-key"}},
	{Title: "Observability", Flags: []string{"log-format", "log-level", "debug-headers", "response-worker-header", "request-log-size"}},
}

// startHere are the flags a first run sets.
var startHere = []string{"config", "router-mode", "tokenizer", "chat-template", "workers-file", "etcd-endpoints", "pool-name", "nats-url", "namespace", "grpc-addr", "http-addr", "admin-listen"}

// serveBrief is `kvroute serve --help`: the first-run flags and the
// infrastructure that a deployment sets on the command line (where events
// and load come from, TLS and credentials, logs). Everything else is in
// --help-all and in the configuration file (docs/operating.md).
var serveBrief = []cli.Group{
	{Title: "Start here", Flags: startHere},
	{Title: "Infrastructure", Flags: []string{"engine-events", "engine-load", "pool-namespace", "kubeconfig", "state-dir",
		"tls-cert", "tls-key", "tls-client-ca", "admin-token-file", "nats-creds", "nats-tls-ca", "etcd-ca", "etcd-cert", "etcd-key", "etcd-password-file",
		"log-format", "log-level"}},
}

const serveBriefFooter = `Every other setting (routing cost and weights, queue, limits, events,
discovery details, more credentials) is in --help-all and in the
configuration file: --config FILE, shown by ` + "`kvroute config print`" + `,
documented in docs/operating.md.`
