package envoytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previousprioritiesv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	metadatav3 "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// Retries, as Envoy's router makes them: a route's retry_policy says on
// which failures (only connect-failure and reset are modelled) and how many
// times; each attempt asks the cluster for a host again. The override_host
// load balancing policy hands out the next host of the endpoint list per
// attempt; round robin honours the previous_hosts predicate and the
// previous_priorities retry priority.

// retryPolicy is a route's retry_policy, checked and unpacked.
type retryPolicy struct {
	connectFailure bool // retry_on connect-failure
	reset          bool // retry_on reset
	numRetries     int
	// previousHosts: the previous_hosts predicate rejects hosts already
	// attempted; the balancer picks again up to hostSelectionMax times.
	previousHosts    bool
	hostSelectionMax int
	// priorityUpdate > 0: previous_priorities excludes the priorities
	// attempted, recomputed every priorityUpdate attempts.
	priorityUpdate int
}

// Envoy's default retry back-off: the first retry waits a random time
// below the 25 ms base interval.
const retryBaseInterval = 25 * time.Millisecond

func buildRetryPolicy(where string, rp *routev3.RetryPolicy) (*retryPolicy, error) {
	if rp == nil {
		return nil, nil
	}
	where += " retry_policy"
	if err := onlyFields(rp, where, "retry_on", "num_retries", "retry_host_predicate", "host_selection_retry_max_attempts", "retry_priority"); err != nil {
		return nil, err
	}
	p := &retryPolicy{numRetries: 1, hostSelectionMax: 1}
	if rp.GetNumRetries() != nil {
		p.numRetries = int(rp.GetNumRetries().GetValue())
	}
	for _, on := range strings.Split(rp.GetRetryOn(), ",") {
		switch strings.TrimSpace(on) {
		case "":
		case "connect-failure":
			p.connectFailure = true
		case "reset":
			p.reset = true
		default:
			return nil, fmt.Errorf("envoy gateway: %s: retry_on %q is not supported by the Gateway (only connect-failure and reset)", where, on)
		}
	}
	for _, hp := range rp.GetRetryHostPredicate() {
		if tc := hp.GetTypedConfig(); tc == nil || !tc.MessageIs(&previoushostsv3.PreviousHostsPredicate{}) {
			return nil, fmt.Errorf("envoy gateway: %s: retry_host_predicate %q is not supported (only envoy.retry_host_predicates.previous_hosts)", where, hp.GetName())
		}
		var ph previoushostsv3.PreviousHostsPredicate
		if err := hp.GetTypedConfig().UnmarshalTo(&ph); err != nil {
			return nil, fmt.Errorf("envoy gateway: %s: %w", where, err)
		}
		if err := onlyFields(&ph, where+" previous_hosts"); err != nil {
			return nil, err
		}
		p.previousHosts = true
	}
	if rp.GetHostSelectionRetryMaxAttempts() > 0 {
		p.hostSelectionMax = int(rp.GetHostSelectionRetryMaxAttempts())
	}
	if pr := rp.GetRetryPriority(); pr != nil {
		var pp previousprioritiesv3.PreviousPrioritiesConfig
		if tc := pr.GetTypedConfig(); tc == nil || !tc.MessageIs(&pp) || tc.UnmarshalTo(&pp) != nil {
			return nil, fmt.Errorf("envoy gateway: %s: retry_priority %q is not supported (only envoy.retry_priorities.previous_priorities)", where, pr.GetName())
		}
		p.priorityUpdate = int(pp.GetUpdateFrequency())
		if p.priorityUpdate < 1 {
			return nil, fmt.Errorf("envoy gateway: %s: previous_priorities update_frequency must be at least 1", where)
		}
	}
	return p, nil
}

// maxRetries is how many retries the policy allows; none without a policy.
func (p *retryPolicy) maxRetries() int {
	if p == nil {
		return 0
	}
	return p.numRetries
}

// retriable reports whether an attempt that failed with err (before any
// response head) may be retried under the policy: a refused or timed-out
// connect is connect-failure; any other transport failure is a reset.
func (p *retryPolicy) retriable(err error) bool {
	if p == nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return p.connectFailure || p.reset // Envoy counts a connect failure as a reset too
	}
	return p.reset
}

// overrideHost is a cluster's override_host load balancing policy.
type overrideHost struct {
	sources []hostSource
	// selected is where the chosen host is written (selected_host_key),
	// namespace and key; empty when unset.
	selectedNS, selectedKey string
}

// hostSource is one override_host source: a request header or a key of
// the request's dynamic metadata.
type hostSource struct {
	header  string
	ns, key string
}

func buildLBPolicy(where string, c *clusterv3.Cluster, uc *upstreamCluster) error {
	lp := c.GetLoadBalancingPolicy()
	if lp == nil {
		return nil
	}
	if err := onlyFields(lp, where+" load_balancing_policy", "policies"); err != nil {
		return err
	}
	if len(lp.GetPolicies()) != 1 {
		return fmt.Errorf("envoy gateway: %s: load_balancing_policy must list exactly one policy", where)
	}
	tc := lp.GetPolicies()[0].GetTypedExtensionConfig().GetTypedConfig()
	var oh overridehostv3.OverrideHost
	if tc == nil || !tc.MessageIs(&oh) || tc.UnmarshalTo(&oh) != nil {
		return fmt.Errorf("envoy gateway: %s: load_balancing_policy %q is not supported (only envoy.load_balancing_policies.override_host)", where, lp.GetPolicies()[0].GetTypedExtensionConfig().GetName())
	}
	o := &overrideHost{}
	for i, s := range oh.GetOverrideHostSources() {
		switch {
		case s.GetHeader() != "" && s.GetMetadata() == nil:
			o.sources = append(o.sources, hostSource{header: strings.ToLower(s.GetHeader())})
		case s.GetHeader() == "" && s.GetMetadata() != nil:
			ns, key, err := metadataKey(s.GetMetadata())
			if err != nil {
				return fmt.Errorf("envoy gateway: %s: override_host source %d: %w", where, i, err)
			}
			o.sources = append(o.sources, hostSource{ns: ns, key: key})
		default:
			return fmt.Errorf("envoy gateway: %s: override_host source %d must set exactly one of header and metadata", where, i)
		}
	}
	if k := oh.GetSelectedHostKey(); k != nil {
		var err error
		if o.selectedNS, o.selectedKey, err = metadataKey(k); err != nil {
			return fmt.Errorf("envoy gateway: %s: override_host selected_host_key: %w", where, err)
		}
	}
	fb := oh.GetFallbackPolicy().GetPolicies()
	if len(fb) != 1 || !fb[0].GetTypedExtensionConfig().GetTypedConfig().MessageIs(&roundrobinv3.RoundRobin{}) {
		return fmt.Errorf("envoy gateway: %s: override_host fallback_policy must be exactly envoy.load_balancing_policies.round_robin", where)
	}
	var rr roundrobinv3.RoundRobin
	if err := fb[0].GetTypedExtensionConfig().GetTypedConfig().UnmarshalTo(&rr); err != nil {
		return fmt.Errorf("envoy gateway: %s: %w", where, err)
	}
	if err := onlyFields(&rr, where+" round_robin"); err != nil {
		return err
	}
	uc.override = o
	return nil
}

// metadataKey accepts the one shape the Gateway models: a namespace and a
// single key.
func metadataKey(k *metadatav3.MetadataKey) (string, string, error) {
	if k.GetKey() == "" || len(k.GetPath()) != 1 || k.GetPath()[0].GetKey() == "" {
		return "", "", errors.New("only a namespace with a one-key path is supported")
	}
	return k.GetKey(), k.GetPath()[0].GetKey(), nil
}

// attempts is one request's host selection state across its attempts.
type attempts struct {
	policy *retryPolicy
	// list is the override_host endpoint list, read at the first pick and
	// consumed one host per pick, as Envoy keeps it in filter state.
	list     []string
	listRead bool
	tried    []string // hosts attempted, in order
	triedPri []int    // their priorities
	excluded []bool   // priorities excluded by previous_priorities
}

// pickAttempt chooses the host of the next attempt, as the cluster's load
// balancer does, and records it for the retry predicates. lookup reads the request's headers and dynamic metadata
// for override_host. ok is false when the cluster has no host.
func (c *upstreamCluster) pickAttempt(st *attempts, lookup func(hostSource) (string, bool)) (string, bool) {
	host, pri, ok := c.choose(st, lookup)
	if ok {
		st.tried = append(st.tried, host)
		st.triedPri = append(st.triedPri, pri)
		if p := st.policy; p != nil && p.priorityUpdate > 0 && len(st.tried)%p.priorityUpdate == 0 {
			st.excluded = make([]bool, len(c.priorities))
			for _, tp := range st.triedPri {
				if tp >= 0 && tp < len(st.excluded) {
					st.excluded[tp] = true
				}
			}
		}
	}
	return host, ok
}

func (c *upstreamCluster) choose(st *attempts, lookup func(hostSource) (string, bool)) (string, int, bool) {
	if c.kind == clusterOriginalDst {
		// The destination header, whatever the attempt: ORIGINAL_DST has
		// no other host to offer.
		v, ok := lookup(hostSource{header: strings.ToLower(c.headerName)})
		if !ok {
			return "", 0, false
		}
		h, ok := parseHost(v)
		return h, 0, ok
	}
	if o := c.override; o != nil {
		if !st.listRead {
			st.listRead = true
			for _, s := range o.sources {
				v, ok := lookup(s)
				if !ok {
					continue
				}
				for _, h := range strings.Split(v, ",") {
					if h = strings.TrimSpace(h); h != "" {
						st.list = append(st.list, h)
					}
				}
			}
		}
		// The next listed host the cluster knows, skipping the rest; the
		// retry host predicate is not consulted for listed hosts.
		for len(st.list) > 0 {
			h := st.list[0]
			st.list = st.list[1:]
			if pri, ok := c.priorityOf(h); ok {
				return h, pri, true
			}
		}
	}
	return c.roundRobin(st)
}

// roundRobin is Envoy's round robin over the highest priority not excluded
// (all of them excluded: the original load), re-picking up to
// hostSelectionMax times while the previous_hosts predicate rejects a host.
func (c *upstreamCluster) roundRobin(st *attempts) (string, int, bool) {
	pri := -1
	for i, eps := range c.priorities {
		if len(eps) > 0 && (i >= len(st.excluded) || !st.excluded[i]) {
			pri = i
			break
		}
	}
	if pri < 0 {
		for i, eps := range c.priorities {
			if len(eps) > 0 {
				pri = i
				break
			}
		}
	}
	if pri < 0 {
		return "", 0, false
	}
	eps := c.priorities[pri]
	tries := 1
	if p := st.policy; p != nil && p.previousHosts && len(st.tried) > 0 {
		tries += p.hostSelectionMax
	}
	var h string
	for range tries {
		h = eps[int(c.next.Add(1)-1)%len(eps)]
		if st.policy == nil || !st.policy.previousHosts || !slices.Contains(st.tried, h) {
			break
		}
	}
	return h, pri, true
}

func (c *upstreamCluster) priorityOf(host string) (int, bool) {
	for i, eps := range c.priorities {
		if slices.Contains(eps, host) {
			return i, true
		}
	}
	return 0, false
}

// replayBody holds what an upstream request body has produced so far, so a
// retry can send it again, as Envoy's router buffers the request body while
// a retry is still possible. Every attempt reads through its own cursor;
// whichever cursor pulls from the source appends to the shared buffer.
type replayBody struct {
	mu    sync.Mutex
	src   io.Reader
	buf   []byte
	err   error // the source's terminal error (io.EOF at the end)
	limit int64
}

func newReplayBody(src io.Reader, limit int64) *replayBody {
	return &replayBody{src: src, limit: limit}
}

// overflowed reports whether the body outgrew the buffer limit: Envoy
// then gives up retrying.
func (b *replayBody) overflowed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(len(b.buf)) > b.limit
}

func (b *replayBody) cursor() *bodyCursor { return &bodyCursor{b: b} }

type bodyCursor struct {
	b      *replayBody
	pos    int
	closed atomic.Bool
}

var errAttemptOver = errors.New("envoy gateway: upstream attempt abandoned")

func (c *bodyCursor) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, errAttemptOver
	}
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.pos < len(b.buf) {
		n := copy(p, b.buf[c.pos:])
		c.pos += n
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.src.Read(p)
	b.buf = append(b.buf, p[:n]...)
	c.pos += n
	if err != nil {
		b.err = err
	}
	if n > 0 {
		return n, nil
	}
	return 0, err
}

func (c *bodyCursor) Close() error {
	c.closed.Store(true)
	return nil
}

// retryBackoff waits before a retry as Envoy does (jittered below the base
// interval), or until ctx ends.
func retryBackoff(ctx context.Context) bool {
	t := time.NewTimer(time.Duration(rand.Int64N(int64(retryBaseInterval))))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// lbMetadata is the request's dynamic metadata namespaces the Gateway
// keeps: what ext_proc wrote into a receiving namespace and what
// override_host wrote as the selected host.
type lbMetadata map[string]*structpb.Struct

func (m lbMetadata) get(ns, key string) (string, bool) {
	v, ok := m[ns].GetFields()[key]
	if !ok {
		return "", false
	}
	s, ok := v.GetKind().(*structpb.Value_StringValue)
	if !ok {
		return "", false
	}
	return s.StringValue, true
}

// snapshot copies the namespaces so another goroutine may read them.
func (m lbMetadata) snapshot() lbMetadata {
	out := make(lbMetadata, len(m))
	for ns, s := range m {
		out[ns] = proto.Clone(s).(*structpb.Struct)
	}
	return out
}

func (m lbMetadata) set(ns, key, value string) {
	if m[ns] == nil {
		m[ns] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	m[ns].Fields[key] = structpb.NewStringValue(value)
}

// merge applies ext_proc's dynamic_metadata for the namespaces allowed,
// key by key, as Envoy merges it into the stream's metadata.
func (m lbMetadata) merge(dm *structpb.Struct, allowed []string) {
	for ns, v := range dm.GetFields() {
		if !slices.Contains(allowed, ns) {
			continue
		}
		s := v.GetStructValue()
		if s == nil {
			continue
		}
		if m[ns] == nil {
			m[ns] = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		for k, fv := range s.GetFields() {
			m[ns].Fields[k] = fv
		}
	}
}
