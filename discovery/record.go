package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/fleet"
)

// Limits on the names a record carries. They reach etcd keys, NATS
// subjects, Envoy cluster names and request headers, so they are kept to a
// token charset and a bounded length.
const (
	// MaxIDLen bounds worker ids, cluster names and namespaces.
	MaxIDLen = 128
	// MaxModelLen bounds model and LoRA adapter names.
	MaxModelLen = 256
)

// ValidName reports whether s is a usable worker id or namespace:
// 1–MaxIDLen characters of [A-Za-z0-9_-]. Dots are left out because ids and
// namespaces are NATS subject tokens.
func ValidName(s string) bool { return validToken(s, false) }

// ValidCluster reports whether s is a usable Envoy cluster name:
// 1–MaxIDLen characters of [A-Za-z0-9._-].
func ValidCluster(s string) bool { return validToken(s, true) }

func validToken(s string, dot bool) bool {
	if s == "" || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		case c == '.' && dot:
		default:
			return false
		}
	}
	return true
}

// printable reports whether s has no control characters (C0, DEL) and is
// valid UTF-8 free of C1 controls: safe in a log line and a header.
func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0xfffd {
			return false
		}
	}
	return true
}

// refusedRanges are addresses a worker record may not point the data plane
// at unless an operator allows them: link-local (where cloud metadata
// services live), the metadata services outside it, and addresses that are
// not one host.
var refusedRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),     // IPv4 link-local, incl. 169.254.169.254 metadata
	netip.MustParsePrefix("fe80::/10"),          // IPv6 link-local
	netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IMDS over IPv6
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network", unspecified
	netip.MustParsePrefix("::/128"),             // unspecified
	netip.MustParsePrefix("224.0.0.0/4"),        // multicast
	netip.MustParsePrefix("ff00::/8"),           // multicast
	netip.MustParsePrefix("255.255.255.255/32"), // broadcast
}

// refusedHosts are metadata service host names, refused like their ranges.
var refusedHosts = []string{"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"}

// AddressPolicy says which worker addresses are refused. The zero value
// (and nil) refuses the link-local and metadata ranges and names.
type AddressPolicy struct {
	// Allow lists ranges that are accepted even though they fall in a
	// refused range (--allow-address-ranges).
	Allow []netip.Prefix
}

// ParseAllowRanges reads --allow-address-ranges: comma-separated CIDRs or
// single IPs.
func ParseAllowRanges(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("allowed address range %q: want a CIDR (169.254.0.0/16) or an IP", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// check reports why addr may not be a worker address, or nil.
func (p *AddressPolicy) check(addr string) error {
	if !printable(addr) {
		return fmt.Errorf("address %q holds control characters", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("address %q is not host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("address %q: port %q is not 1-65535", addr, port)
	}
	ip, err := netip.ParseAddr(host)
	spelled := ""
	if err != nil {
		a, numeric, ok := numericHost(host)
		switch {
		case ok:
			// Another spelling of an IPv4 address (octal, hex, one
			// integer, a short form, a trailing dot): checked as the
			// address a resolver turns it into, then refused as a
			// spelling, so every component sees one form.
			ip, spelled = a, a.String()
		case numeric:
			return fmt.Errorf("address %q: host %q is a number but no IPv4 address; write the address in dotted decimal", addr, host)
		case !validHostname(host):
			return fmt.Errorf("address %q: host %q is neither an IP nor a DNS name", addr, host)
		default:
			for _, h := range refusedHosts {
				if strings.EqualFold(strings.TrimSuffix(host, "."), h) {
					return fmt.Errorf("address %q names a cloud metadata service", addr)
				}
			}
			return nil
		}
	}
	if ip.Zone() != "" {
		return fmt.Errorf("address %q: zoned (link-local) addresses are refused", addr)
	}
	if err := p.checkIP(addr, ip.Unmap()); err != nil {
		return err
	}
	if v4, ok := embeddedIPv4(ip); ok {
		if err := p.checkIP(addr, v4); err != nil {
			return err
		}
	}
	if spelled != "" {
		return fmt.Errorf("address %q spells the IPv4 address %s; write it as %s", addr, spelled, net.JoinHostPort(spelled, port))
	}
	return nil
}

// checkEndpoint reports why ep may not be an engine's ZMQ socket: it must
// be tcp://host:port, and host:port must pass the address checks.
func (p *AddressPolicy) checkEndpoint(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("endpoint %q: want tcp://host:port", clip(ep))
	}
	return p.check(rest)
}

// checkIP reports whether ip falls in a refused range that the policy does
// not allow.
func (p *AddressPolicy) checkIP(addr string, ip netip.Addr) error {
	for _, r := range refusedRanges {
		if !r.Contains(ip) {
			continue
		}
		if p != nil {
			for _, a := range p.Allow {
				if a.Contains(ip) {
					return nil
				}
			}
		}
		return fmt.Errorf("address %q is %s, in %s (link-local, metadata or not one host); list it in --allow-address-ranges to accept it", addr, ip, r)
	}
	return nil
}

// validHostname reports whether h is a DNS name: labels of [A-Za-z0-9-]
// (and _ for service names), dot-separated, 253 characters at most.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// ValidateRecord is ValidateRecordWith under the default address policy.
func ValidateRecord(r fleet.Worker) error { return ValidateRecordWith(r, nil) }

// ValidateRecordWith reports the problems that make a registration
// unusable. It is stricter than fleet.Worker.Validate: a record comes
// from the network, its ID names etcd keys and NATS subjects, its cluster
// and address reach Envoy as header values, and its address must not send
// traffic to a metadata service. policy may be nil.
func ValidateRecordWith(r fleet.Worker, policy *AddressPolicy) error {
	var errs []error
	if r.ID == "" {
		errs = append(errs, errors.New("id is empty"))
	} else if !ValidName(r.ID) {
		errs = append(errs, fmt.Errorf("id %q: want 1-%d characters of [A-Za-z0-9_-] (it names etcd keys and NATS subjects)", clip(r.ID), MaxIDLen))
	}
	if r.Cluster != "" && !ValidCluster(r.Cluster) {
		errs = append(errs, fmt.Errorf("cluster %q: want 1-%d characters of [A-Za-z0-9._-] (it is an Envoy cluster name and a header value)", clip(r.Cluster), MaxIDLen))
	}
	if r.Model == "" {
		errs = append(errs, errors.New("model is empty"))
	} else if len(r.Model) > MaxModelLen || !printable(r.Model) {
		errs = append(errs, fmt.Errorf("model %q: want at most %d printable characters", clip(r.Model), MaxModelLen))
	}
	if err := policy.check(r.Address); err != nil {
		errs = append(errs, err)
	}
	if r.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block_size %d must be at least 1", r.BlockSize))
	}
	for _, ep := range []struct{ key, v string }{{"events_endpoint", r.EventsEndpoint}, {"replay_endpoint", r.ReplayEndpoint}} {
		if ep.v == "" {
			continue
		}
		if err := policy.checkEndpoint(ep.v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep.key, err))
		}
	}
	if r.KVTotalBlocks < 0 || r.MaxNumBatchedTokens < 0 || r.MaxNumSeqs < 0 || r.DPRank < 0 {
		errs = append(errs, errors.New("kv_total_blocks, max_num_batched_tokens, max_num_seqs and dp_rank must not be negative"))
	}
	if r.Weight < 0 {
		errs = append(errs, fmt.Errorf("weight %g must not be negative", r.Weight))
	}
	for _, a := range r.LoRAAdapters {
		if a == "" || len(a) > MaxModelLen || !printable(a) {
			errs = append(errs, fmt.Errorf("lora_adapters holds an empty, overlong or unprintable name %q", clip(a)))
			break
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("worker record %q: %w", clip(r.ID), errors.Join(errs...))
	}
	return nil
}

// clip shortens a refused value for an error message; %q escapes the rest.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// ParseRecord is ParseRecordWith under the default address policy.
func ParseRecord(data []byte) (fleet.Worker, error) { return ParseRecordWith(data, nil) }

// ParseRecordWith decodes and validates a record from JSON. Unknown fields
// are allowed so newer workers can add fields without breaking older
// routers.
func ParseRecordWith(data []byte, policy *AddressPolicy) (fleet.Worker, error) {
	var r fleet.Worker
	if err := json.Unmarshal(data, &r); err != nil {
		return fleet.Worker{}, fmt.Errorf("worker record: %w", err)
	}
	if err := ValidateRecordWith(r, policy); err != nil {
		return fleet.Worker{}, err
	}
	return r, nil
}
