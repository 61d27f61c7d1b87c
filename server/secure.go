package server

import (
	"log/slog"
	"strings"

	"github.com/kvroute/kvroute/bus"
	"github.com/nats-io/nats.go"
)

// natsAuth turns the NATS credential settings into client options: at
// most one of a credentials file, an NKey seed or a user and password,
// plus TLS.
func (c *Config) natsAuth() ([]nats.Option, error) {
	return bus.Auth(c.NATSCredsFile, c.NATSNKeySeedFile, c.NATSUser, c.NATSPassword, c.NATSTLS)
}

// redacted stands in for a secret that is set.
const redacted = "[redacted]"

func secret(s string) string {
	if s == "" {
		return ""
	}
	return redacted
}

// LogValue is the config as the startup log line shows it: addresses,
// discovery and the security settings that are on, with every secret
// (passwords, admin token, credentials inside URLs) replaced by
// "[redacted]".
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("namespace", c.Namespace),
		slog.String("grpc_addr", c.GRPCAddr),
		slog.String("http_addr", c.HTTPAddr),
		slog.String("admin_addr", c.AdminAddr),
		slog.String("admin_token", secret(c.AdminToken)),
		slog.String("nats_url", redactURL(c.NATSURL)),
		slog.String("nats_creds_file", c.NATSCredsFile),
		slog.String("nats_nkey_seed_file", c.NATSNKeySeedFile),
		slog.String("nats_user", c.NATSUser),
		slog.String("nats_password", secret(c.NATSPassword)),
		slog.Bool("nats_tls", c.NATSTLS != nil),
		slog.Any("etcd_endpoints", redactURLs(c.EtcdEndpoints)),
		slog.String("etcd_username", c.EtcdUsername),
		slog.String("etcd_password", secret(c.EtcdPassword)),
		slog.Bool("etcd_tls", c.EtcdTLS != nil),
		slog.String("workers_file", c.WorkersFile),
		slog.Any("allow_address_ranges", c.AllowAddressRanges),
		slog.Bool("ext_proc_tls", c.TLS != nil),
		slog.Int("max_messages", c.MaxMessages),
		slog.Int("max_prompt_bytes", c.MaxPromptBytes),
		slog.Int("max_concurrent_decisions", c.MaxConcurrentDecisions),
		slog.Int("max_streams", int(c.MaxStreams)),
		slog.Duration("stream_idle_timeout", c.StreamIdleTimeout),
	)
}

// redactURL hides the user info of a URL list (nats://user:pass@host).
func redactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		scheme, rest, ok := strings.Cut(p, "://")
		if !ok {
			scheme, rest = "", p
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			rest = redacted + rest[at:]
		}
		if ok {
			parts[i] = scheme + "://" + rest
		} else {
			parts[i] = rest
		}
	}
	return strings.Join(parts, ",")
}

func redactURLs(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = redactURL(s)
	}
	return out
}
