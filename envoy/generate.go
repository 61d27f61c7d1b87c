package envoy

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// The three bootstrap styles Generate understands and envoy/ ships.
const (
	// StyleClusterHeader routes on x-target-worker to one static cluster per worker.
	StyleClusterHeader = "cluster-header"
	// StyleOriginalDst routes through an ORIGINAL_DST cluster on
	// x-gateway-destination-endpoint, as the Gateway API Inference Extension does.
	StyleOriginalDst = "original-dst"
	// StyleXDS routes to one shared worker cluster (WorkersClusterName)
	// served by kvroute over ADS; override_host picks the host from kvroute's
	// endpoint list.
	StyleXDS = "xds"
)

// Styles lists every style Generate accepts, in the order the docs present them.
var Styles = []string{StyleClusterHeader, StyleOriginalDst, StyleXDS}

// Names kvroute and the shipped bootstraps agree on.
const (
	// TargetHeader carries the picked worker's cluster name.
	TargetHeader = "x-target-worker"
	// DestinationHeader carries the picked worker's ip:port (Gateway API
	// Inference Extension endpoint picker protocol).
	DestinationHeader = "x-gateway-destination-endpoint"
	// ExtProcClusterName is the cluster through which Envoy reaches kvroute.
	ExtProcClusterName = "kvroute"
	// XDSClusterName is the cluster through which Envoy reaches kvroute's ADS server.
	XDSClusterName = "kvroute_xds"
	// FallbackClusterName spreads requests over all workers when kvroute gave no answer.
	FallbackClusterName = "kvroute_fallback"
	// WorkersClusterName is the one worker cluster kvroute's xDS server
	// serves (style xds): every worker once, picked by override_host.
	WorkersClusterName = "kvroute_workers"
	// OriginalDstClusterName is the ORIGINAL_DST cluster of the original-dst style.
	OriginalDstClusterName = "original_destination_cluster"
	// OverrideHostPolicyName is Envoy's load balancing policy that takes the
	// hosts from kvroute's endpoint list, one per attempt.
	OverrideHostPolicyName = "envoy.load_balancing_policies.override_host"
)

// What of each response Envoy shows kvroute (Options.ResponsePath).
const (
	// ResponsePathObserved, the default: Envoy waits on kvroute once per
	// request, for the routing decision. The response headers (status,
	// who made the response, the endpoint that served) reach kvroute
	// through a second ext_proc filter in observability mode, which Envoy
	// does not wait on; the routing stream stays open until the response
	// ends and its end frees the request's load. The styles that buffer the
	// request body (cluster-header, xds) also skip the request headers:
	// the route travels in envoy.lb metadata with the answer to the body,
	// what kvroute reads of the headers comes as request attributes, and a
	// buffer filter holds the request until the answer is in.
	// FULL_DUPLEX_STREAMED (original-dst) still sends the request headers,
	// whose answer carries the route after the whole body.
	ResponsePathObserved = "observed"
	// ResponsePathHeaders: kvroute sees the response headers
	// (status, who answered, the endpoint that served), one exchange per
	// request, and the end of the ext_proc stream, which Envoy closes when
	// the request ends. The body goes to the client without waiting on
	// kvroute: no exchange per chunk. The first token counts at the
	// worker's KV event for the prompt's last block (engines send a
	// streamed answer's headers before its first token).
	ResponsePathHeaders = "headers"
	// ResponsePathStreamed: kvroute also sees every response body chunk
	// (the first token at the first chunk or the KV event, whichever comes
	// first; decode progress counted from the SSE events); Envoy waits for
	// kvroute's answer to each chunk.
	ResponsePathStreamed = "streamed"
)

// ResponsePaths lists the values Options.ResponsePath takes.
var ResponsePaths = []string{ResponsePathObserved, ResponsePathHeaders, ResponsePathStreamed}

// ObservedMetadataKey and ObservedMetadataValue are the gRPC metadata the
// routing ext_proc filter sends kvroute with each stream when the response
// is observed by the second filter (ResponsePathObserved).
const (
	ObservedMetadataKey   = "x-kvroute-response"
	ObservedMetadataValue = "observed"
)

// Worker is one backend as the bootstraps see it.
type Worker struct {
	// Cluster is the Envoy cluster name, the value kvroute writes into
	// x-target-worker (the cluster-header style routes on it; the xds style
	// serves every worker in the one cluster WorkersClusterName instead).
	Cluster string
	// Address is the worker's "host:port"; an IP literal gives a STATIC
	// cluster, a host name a STRICT_DNS one.
	Address string
}

// Options tunes Generate. The zero value gives the documented defaults.
type Options struct {
	// ListenAddress is Envoy's listener, "0.0.0.0:8080" by default. Port 0
	// lets Envoy pick a free port (its admin API's /listeners tells which).
	ListenAddress string
	// AdminAddress is Envoy's admin endpoint, "127.0.0.1:9901" by default;
	// port 0 as for ListenAddress (envoy --admin-address-path tells which).
	AdminAddress string
	// ExtProcAddress is kvroute's ext_proc gRPC address, "127.0.0.1:9002" by default.
	ExtProcAddress string
	// XDSAddress is kvroute's ADS address (style xds), "127.0.0.1:18000" by default.
	XDSAddress string
	// MessageTimeout bounds each wait for kvroute's answer, 60s by default.
	// It must exceed kvroute's admission-queue wait.
	MessageTimeout time.Duration
	// NodeID is Envoy's node id, "kvroute-envoy" by default.
	NodeID string
	// ExtProcTLS, when set, makes Envoy dial kvroute's ext_proc over TLS.
	ExtProcTLS *TLSFiles
	// ResponsePath is what of each response Envoy sends kvroute and how:
	// ResponsePathObserved (the default), ResponsePathHeaders or
	// ResponsePathStreamed.
	ResponsePath string
}

// TLSFiles are the files of Envoy's side of a TLS connection to kvroute,
// as paths on Envoy's machine.
type TLSFiles struct {
	// CAFile verifies kvroute's certificate (required).
	CAFile string
	// CertFile and KeyFile are Envoy's client certificate, for kvroute's
	// --tls-client-ca (mutual TLS); both or neither.
	CertFile, KeyFile string
	// SNI is the server name Envoy sends and requires in kvroute's
	// certificate (a DNS subject alternative name); empty sends none and
	// accepts any certificate the CA signed.
	SNI string
}

func (o Options) withDefaults() Options {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.ListenAddress, "0.0.0.0:8080")
	def(&o.AdminAddress, "127.0.0.1:9901")
	def(&o.ExtProcAddress, "127.0.0.1:9002")
	def(&o.XDSAddress, "127.0.0.1:18000")
	def(&o.NodeID, "kvroute-envoy")
	def(&o.ResponsePath, ResponsePathObserved)
	if o.MessageTimeout == 0 {
		o.MessageTimeout = 60 * time.Second
	}
	return o
}

//go:embed templates/*.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	// quote writes a string as a JSON string, which is also a valid YAML scalar
	// whatever the cluster name contains.
	"quote": func(s string) string { b, _ := json.Marshal(s); return string(b) },
}).ParseFS(templateFS, "templates/*.tmpl"))

type hostPort struct {
	Host string
	Port uint16
	IsIP bool
}

func parseHostPort(what, s string) (hostPort, error) {
	hp, err := parseHostPortZero(what, s)
	if err == nil && hp.Port == 0 {
		return hostPort{}, fmt.Errorf("%s %q: port must be 1-65535", what, s)
	}
	return hp, err
}

// parseHostPortZero is parseHostPort that also takes port 0, which Envoy
// binds to a free port (for its listener and admin addresses).
func parseHostPortZero(what, s string) (hostPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return hostPort{}, fmt.Errorf("%s %q: %w", what, s, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return hostPort{}, fmt.Errorf("%s %q: port must be 0-65535", what, s)
	}
	if host == "" {
		return hostPort{}, fmt.Errorf("%s %q: empty host", what, s)
	}
	for _, c := range host {
		if !(c == '.' || c == '-' || c == ':' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return hostPort{}, fmt.Errorf("%s %q: host has character %q", what, s, c)
		}
	}
	_, ipErr := netip.ParseAddr(host)
	return hostPort{Host: host, Port: uint16(p), IsIP: ipErr == nil}, nil
}

func discoveryType(hp hostPort) string {
	if hp.IsIP {
		return "STATIC"
	}
	return "STRICT_DNS"
}

type grpcClusterData struct {
	Name        string
	Type        string
	Addr        hostPort
	HealthCheck bool
	TLS         *TLSFiles
}

type workerData struct {
	Cluster string
	Type    string
	Addr    hostPort
	// Others are the other workers' addresses, the cluster's priority 1:
	// where a retry can go (see the "override-host" template).
	Others []hostPort
}

type templateData struct {
	NodeID            string
	Admin, Listen     hostPort
	MessageTimeout    string
	TargetHeader      string
	DestinationHeader string
	ExtProc, XDS      grpcClusterData
	Workers           []workerData
	WorkersCluster    string
	FallbackType      string
	// ResponseStreamed sends kvroute the response body (ResponsePathStreamed).
	ResponseStreamed bool
	// Observed sends the response headers to a second, observing ext_proc
	// filter (ResponsePathObserved); SkipRequestHeaders skips the request
	// headers too, where the body is buffered.
	Observed, SkipRequestHeaders bool
	ObservedKey, ObservedValue   string
}

// Generate renders an Envoy bootstrap of the given style (StyleClusterHeader,
// StyleOriginalDst or StyleXDS) as YAML. Workers are needed by the
// cluster-header style only: the other two learn their destinations at run time.
// The output is checked with Validate before it is returned; the files
// shipped in envoy/ are Generate's output for ExampleWorkers and default
// Options.
func Generate(style string, workers []Worker, opts Options) ([]byte, error) {
	opts = opts.withDefaults()
	d := templateData{
		NodeID:            opts.NodeID,
		TargetHeader:      TargetHeader,
		DestinationHeader: DestinationHeader,
		FallbackType:      "STATIC",
		WorkersCluster:    WorkersClusterName,
	}
	if opts.MessageTimeout < time.Millisecond || opts.MessageTimeout >= time.Hour {
		return nil, fmt.Errorf("envoy: message timeout %v outside Envoy's range [1ms, 1h)", opts.MessageTimeout)
	}
	d.MessageTimeout = formatDuration(opts.MessageTimeout)
	switch opts.ResponsePath {
	case ResponsePathObserved:
		d.Observed, d.ObservedKey, d.ObservedValue = true, ObservedMetadataKey, ObservedMetadataValue
		d.SkipRequestHeaders = style != StyleOriginalDst
	case ResponsePathHeaders:
	case ResponsePathStreamed:
		d.ResponseStreamed = true
	default:
		return nil, fmt.Errorf("envoy: unknown response path %q (want %s)", opts.ResponsePath, strings.Join(ResponsePaths, ", "))
	}
	if !validNodeID(opts.NodeID) {
		return nil, fmt.Errorf("envoy: node id %q must be letters, digits, '-', '_' or '.'", opts.NodeID)
	}
	var err error
	if d.Admin, err = parseHostPortZero("admin address", opts.AdminAddress); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	if d.Listen, err = parseHostPortZero("listen address", opts.ListenAddress); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	if !d.Admin.IsIP || !d.Listen.IsIP {
		return nil, fmt.Errorf("envoy: listen and admin addresses must be IP literals")
	}
	ext, err := parseHostPort("ext_proc address", opts.ExtProcAddress)
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	d.ExtProc = grpcClusterData{Name: ExtProcClusterName, Type: discoveryType(ext), Addr: ext, HealthCheck: true}
	if t := opts.ExtProcTLS; t != nil {
		if t.CAFile == "" {
			return nil, fmt.Errorf("envoy: ext_proc TLS needs a CA file to verify kvroute's certificate")
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return nil, fmt.Errorf("envoy: ext_proc TLS client certificate and key go together")
		}
		for _, f := range []string{t.CAFile, t.CertFile, t.KeyFile, t.SNI} {
			if strings.ContainsAny(f, "\x00\n\r") {
				return nil, fmt.Errorf("envoy: ext_proc TLS setting %q has a control character", f)
			}
		}
		d.ExtProc.TLS = t
	}

	switch style {
	case StyleClusterHeader:
		if len(workers) == 0 {
			return nil, fmt.Errorf("envoy: style %s needs at least one worker", style)
		}
		seen := map[string]bool{ExtProcClusterName: true, FallbackClusterName: true, XDSClusterName: true, WorkersClusterName: true}
		for _, w := range workers {
			if w.Cluster == "" {
				return nil, fmt.Errorf("envoy: worker at %q has no cluster name", w.Address)
			}
			if seen[w.Cluster] {
				return nil, fmt.Errorf("envoy: cluster name %q used twice or reserved", w.Cluster)
			}
			seen[w.Cluster] = true
			hp, err := parseHostPort("worker "+w.Cluster+" address", w.Address)
			if err != nil {
				return nil, fmt.Errorf("envoy: %w", err)
			}
			if !hp.IsIP {
				d.FallbackType = "STRICT_DNS"
			}
			d.Workers = append(d.Workers, workerData{Cluster: w.Cluster, Type: discoveryType(hp), Addr: hp})
		}
		for i := range d.Workers {
			d.Workers[i].Others = otherAddrs(d.Workers, i)
			for _, o := range d.Workers[i].Others {
				if !o.IsIP { // a STATIC cluster takes IP literals only
					d.Workers[i].Type = "STRICT_DNS"
				}
			}
		}
	case StyleOriginalDst:
	case StyleXDS:
		x, err := parseHostPort("xds address", opts.XDSAddress)
		if err != nil {
			return nil, fmt.Errorf("envoy: %w", err)
		}
		d.XDS = grpcClusterData{Name: XDSClusterName, Type: discoveryType(x), Addr: x}
	default:
		return nil, fmt.Errorf("envoy: unknown style %q (want %s)", style, strings.Join(Styles, ", "))
	}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, style+".yaml.tmpl", d); err != nil {
		return nil, fmt.Errorf("envoy: render %s: %w", style, err)
	}
	buf.WriteByte('\n')
	// What kvroute prints must be what Envoy accepts; never hand out a
	// bootstrap that fails the checks.
	if _, err := Validate(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("envoy: generated %s bootstrap is invalid: %w", style, err)
	}
	return buf.Bytes(), nil
}

// otherAddrs lists the addresses of every worker but ws[i], each once and
// never ws[i]'s own (Envoy keys a cluster's hosts by address).
func otherAddrs(ws []workerData, i int) []hostPort {
	var out []hostPort
	seen := map[hostPort]bool{ws[i].Addr: true}
	for _, w := range ws {
		if !seen[w.Addr] {
			seen[w.Addr] = true
			out = append(out, w.Addr)
		}
	}
	return out
}

// ExampleWorkers are the four local workers the shipped cluster-header.yaml
// names, on local ports 8100-8103.
var ExampleWorkers = []Worker{
	{Cluster: "w0", Address: "127.0.0.1:8100"},
	{Cluster: "w1", Address: "127.0.0.1:8101"},
	{Cluster: "w2", Address: "127.0.0.1:8102"},
	{Cluster: "w3", Address: "127.0.0.1:8103"},
}

func formatDuration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

func validNodeID(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '.' || c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
