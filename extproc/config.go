package extproc

import (
	"log/slog"
	"time"
)

// Header and metadata names of the Envoy and Gateway API contracts
// (docs/architecture.md §3.6, the Gateway API Inference Extension's endpoint picker protocol).
const (
	// DefaultTargetHeader carries the chosen worker's cluster name.
	DefaultTargetHeader = "x-target-worker"
	// DestinationHeader carries "ip:port[,fallback ip:port...]".
	DestinationHeader = "x-gateway-destination-endpoint"
	// LBMetadataNamespace holds DestinationHeader in dynamic metadata and the
	// served-endpoint report in the response's metadata_context.
	LBMetadataNamespace = "envoy.lb"
	// SubsetHintNamespace and SubsetHintKey locate the list of endpoints the
	// data plane allows for this request.
	SubsetHintNamespace = "envoy.lb.subset_hint"
	SubsetHintKey       = "x-gateway-destination-endpoint-subset"
	// ServedKey is the endpoint that really served the request, in the
	// response's metadata_context under LBMetadataNamespace.
	ServedKey = "x-gateway-destination-endpoint-served"
	// CachedTokensHeader and ModeHeader are the optional debug headers.
	CachedTokensHeader = "x-kvroute-cached-tokens"
	ModeHeader         = "x-kvroute-mode"
	// PredictedCachedTokensHeader tells the worker how many prompt tokens
	// the router expects it to hold (Decision.CachedTokens), whenever the
	// decision matched the prompt against a KV index; client copies are
	// always removed. kvsim echoes it so kvbench can score predictions.
	PredictedCachedTokensHeader = "x-kvroute-predicted-cached-tokens"
	// WorkerHeader names the chosen worker on the response to the client
	// when Config.ResponseWorkerHeader is set.
	WorkerHeader = "x-kvroute-worker"
	// RequestIDHeader is the request id the request log files each
	// decision under (Envoy sets it on every request by default).
	RequestIDHeader = "x-request-id"
)

// TargetValue chooses what the target header holds.
type TargetValue int

const (
	// TargetCluster writes the worker's Envoy cluster name (the default).
	TargetCluster TargetValue = iota
	// TargetAddress writes the worker's ip:port.
	TargetAddress
)

// Config shapes how streams answer Envoy. The zero value works: defaults
// are filled in where a field is zero.
type Config struct {
	// TargetHeader names the header that carries the chosen worker
	// (default x-target-worker).
	TargetHeader string
	// TargetValue selects cluster name or ip:port for TargetHeader.
	TargetValue TargetValue
	// MaxBodyBytes is the largest request body accepted (default 16 MiB);
	// larger ones get 413.
	MaxBodyBytes int
	// DebugHeaders adds x-kvroute-cached-tokens and x-kvroute-mode to the
	// upstream request. Off by default; client copies are always removed.
	DebugHeaders bool
	// ChunkSize bounds each streamed_response chunk (default 62,000 bytes,
	// under Envoy's per-message limits).
	ChunkSize int
	// DefaultRequestMode is assumed when Envoy sends no protocol_config
	// (Envoy before 1.33). Zero means NONE; most deployments set BUFFERED.
	DefaultRequestMode BodyMode
	// ResponseWorkerHeader adds x-kvroute-worker, the chosen worker's id,
	// to the response the client gets: on the response-headers message
	// when Envoy sends it on the routing stream, and as envoy.lb metadata
	// with the routing answer, from which the one-exchange bootstraps add
	// the header (no round trip either way).
	ResponseWorkerHeader bool
	// Requests, when not nil, receives every decision and its outcome
	// (the admin listener's /debug/requests).
	Requests RequestLog
	// Now is the clock for the request log's timings; nil means time.Now.
	Now func() time.Time
	// Logger receives stream-level logs; nil means slog.Default().
	Logger *slog.Logger
}

// RequestLog keeps recent decisions and their outcomes. A stream calls
// Decided once it has routed or rejected a request and Finished, with the
// handle Decided returned, once the exchange is over. Implementations must
// be safe for concurrent use and must not block.
type RequestLog interface {
	// Decided records a decision (rejected is nil) or a rejection (d is
	// nil) for the request id, which may be empty. d is only valid during
	// the call: copy what is kept.
	Decided(id string, d *Decision, rejected *HTTPError) (handle uint64)
	// Finished records how the exchange ended.
	Finished(handle uint64, end Finish)
}

// Finish is how one routed exchange ended, as far as the stream saw it.
type Finish struct {
	// Status is the HTTP status the client got (the upstream's, or the
	// router's own rejection); 0 when no response headers were seen.
	Status int
	// Outcome is how the response ended.
	Outcome Outcome
	// TTFT is the time from the decision to the first response byte the
	// router saw (0: none seen). With response body mode NONE it is the
	// time to the response headers.
	TTFT time.Duration
	// Duration is the time from the decision to the end of the exchange.
	Duration time.Duration
}

func (c *Config) now() time.Time {
	if c.Now == nil {
		return time.Now()
	}
	return c.Now()
}

func (c *Config) targetHeader() string {
	if c.TargetHeader == "" {
		return DefaultTargetHeader
	}
	return c.TargetHeader
}

func (c *Config) maxBody() int {
	if c.MaxBodyBytes <= 0 {
		return defaultMaxBodySize
	}
	return c.MaxBodyBytes
}

func (c *Config) chunkSize() int {
	if c.ChunkSize <= 0 {
		return defaultChunkSize
	}
	return c.ChunkSize
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}
