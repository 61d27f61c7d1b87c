package envoytest

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type routeTable struct {
	remove []string
	vhosts []virtualHost
}

type virtualHost struct {
	domains []string
	remove  []string
	routes  []route
}

type route struct {
	name          string
	prefix, path  string
	exactPath     bool
	headers       []headerMatch
	cluster       string
	clusterHeader string
	timeout       time.Duration
	notFound      int
	remove        []string
	retry         *retryPolicy // nil: no retries
}

type headerMatch struct {
	name     string
	present  bool
	exact    string
	hasExact bool
	invert   bool
}

// routeChoice is a cached route decision: the route and, for a
// cluster_header route, the cluster name read when the route was picked.
type routeChoice struct {
	vh      *virtualHost
	route   *route
	cluster string
}

func (h headerMatch) matches(hs headerMap) bool {
	v, ok := hs.get(strings.ToLower(h.name))
	var m bool
	if h.hasExact {
		m = ok && v == h.exact
	} else {
		m = ok == h.present
	}
	return m != h.invert
}

func domainMatches(domains []string, host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	for _, d := range domains {
		if d == "*" || strings.EqualFold(d, host) {
			return true
		}
	}
	return false
}

// match picks the route for the headers as Envoy's router does: the first
// virtual host whose domains match :authority, then its first matching route.
// A cluster_header route reads its cluster name here, so the choice stays
// fixed until the route cache is cleared.
func (t *routeTable) match(hs headerMap) (routeChoice, bool) {
	authority, _ := hs.get(":authority")
	path, _ := hs.get(":path")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for i := range t.vhosts {
		vh := &t.vhosts[i]
		if !domainMatches(vh.domains, authority) {
			continue
		}
		for j := range vh.routes {
			r := &vh.routes[j]
			if r.exactPath && path != r.path || !r.exactPath && !strings.HasPrefix(path, r.prefix) {
				continue
			}
			ok := true
			for _, h := range r.headers {
				ok = ok && h.matches(hs)
			}
			if !ok {
				continue
			}
			c := routeChoice{vh: vh, route: r, cluster: r.cluster}
			if r.clusterHeader != "" {
				c.cluster, _ = hs.get(strings.ToLower(r.clusterHeader))
			}
			return c, true
		}
		return routeChoice{}, false
	}
	return routeChoice{}, false
}

// headersToRemove lists the request_headers_to_remove that apply to a route,
// innermost last, as Envoy's router applies them before forwarding.
func (t *routeTable) headersToRemove(c routeChoice) []string {
	out := append([]string(nil), t.remove...)
	out = append(out, c.vh.remove...)
	return append(out, c.route.remove...)
}

type clusterKind int

const (
	clusterStatic clusterKind = iota
	clusterOriginalDst
)

// upstreamCluster is a cluster's endpoints and the HTTP transport to them.
type upstreamCluster struct {
	name string
	kind clusterKind
	// endpoints are priority 0's; priorities holds every level, in order.
	endpoints      []string
	priorities     [][]string
	override       *overrideHost // the override_host policy, or nil
	headerName     string        // ORIGINAL_DST: the header naming the destination
	h2             bool
	connectTimeout time.Duration

	next      atomic.Uint64
	once      sync.Once
	transport *http.Transport
}

// setEndpoints replaces every priority with one level of eps.
func (c *upstreamCluster) setEndpoints(eps []string) {
	c.endpoints = eps
	c.priorities = [][]string{eps}
}

// parseHost reads one ip:port as Envoy's ORIGINAL_DST and override_host
// parse it.
func parseHost(v string) (string, bool) {
	ap, err := netip.ParseAddrPort(strings.TrimSpace(v))
	if err != nil {
		return "", false
	}
	return ap.String(), true
}

func (c *upstreamCluster) roundTripper() *http.Transport {
	c.once.Do(func() {
		d := &net.Dialer{Timeout: c.connectTimeout, KeepAlive: 30 * time.Second}
		t := &http.Transport{
			DialContext:         func(ctx context.Context, n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) },
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     time.Minute,
			// The worker's bytes pass through untouched, as through Envoy.
			DisableCompression: true,
		}
		p := new(http.Protocols)
		if c.h2 {
			p.SetUnencryptedHTTP2(true)
		} else {
			p.SetHTTP1(true)
		}
		t.Protocols = p
		c.transport = t
	})
	return c.transport
}

func (c *upstreamCluster) close() {
	c.once.Do(func() {})
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}
