package discovery

import (
	"net/netip"
	"strconv"
	"strings"
)

// numericHost reads host the way a C resolver does before it looks a name
// up (inet_aton, which getaddrinfo and Envoy's STRICT_DNS resolvers call
// first): one to four dot-separated parts, each decimal, octal (a leading
// 0) or hexadecimal (0x), the last part filling the bytes the others left,
// and one trailing dot allowed. 0251.0376.0251.0376, 0xa9fea9fe,
// 2852039166, 169.254.43518 and "169.254.169.254." are all 169.254.169.254.
//
// It returns the address and true when host is such a spelling. numeric is
// true, with ok false, for a host made only of numeric parts that is no
// valid address (a part too large, "08"): no DNS name looks like that, and
// a resolver may still read it as an address, so it is refused.
func numericHost(host string) (addr netip.Addr, numeric, ok bool) {
	h := strings.TrimSuffix(host, ".")
	if h == "" {
		return netip.Addr{}, false, false
	}
	parts := strings.Split(h, ".")
	if len(parts) > 4 {
		// More than four parts is never an address, but a name whose
		// last label is a number is not a DNS name either (RFC 3696 §2).
		return netip.Addr{}, isNumericPart(parts[len(parts)-1]), false
	}
	vals := make([]uint64, len(parts))
	allNumeric := true
	valid := true
	for i, p := range parts {
		if !isNumericPart(p) {
			allNumeric = false
			continue
		}
		v, err := parsePart(p)
		if err != nil {
			valid = false
			continue
		}
		vals[i] = v
	}
	if !allNumeric {
		// A name whose last label is numeric (foo.0x10, a.1) is not a
		// DNS name; some resolvers read it as an address anyway.
		return netip.Addr{}, isNumericPart(parts[len(parts)-1]), false
	}
	if !valid {
		return netip.Addr{}, true, false
	}
	// Every part but the last is one byte; the last fills the rest.
	last := len(vals) - 1
	var n uint64
	for i := 0; i < last; i++ {
		if vals[i] > 0xff {
			return netip.Addr{}, true, false
		}
		n = n<<8 | vals[i]
	}
	rest := uint(8 * (4 - last))
	if vals[last] >= 1<<rest {
		return netip.Addr{}, true, false
	}
	n = n<<rest | vals[last]
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true, true
}

// isNumericPart reports whether p is spelled as a number in some base:
// digits, or 0x / 0X followed by hex digits (possibly none, which inet_aton
// reads as 0).
func isNumericPart(p string) bool {
	if p == "" {
		return false
	}
	if len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X') {
		for i := 2; i < len(p); i++ {
			if !isHex(p[i]) {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// parsePart reads one numeric part in inet_aton's bases. Values above 32
// bits are errors: they overflow in C and in no base name an address.
func parsePart(p string) (uint64, error) {
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		if len(p) == 2 {
			return 0, nil
		}
		return strconv.ParseUint(p[2:], 16, 32)
	case len(p) > 1 && p[0] == '0':
		return strconv.ParseUint(p[1:], 8, 32)
	default:
		return strconv.ParseUint(p, 10, 32)
	}
}

// embeddedIPv4 returns the IPv4 address an IPv6 address carries where a
// network may deliver it to that IPv4 host: IPv4-mapped (::ffff:a.b.c.d),
// IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case ip.Is4In6():
		return ip.Unmap(), true
	case isZero(b[:12]) && b[12] != 0:
		// IPv4-compatible; ::1 and :: (b[12] == 0) are IPv6's own.
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case nat64.Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
