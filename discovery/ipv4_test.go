package discovery

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/fleet"
)

// Every spelling a C resolver reads as an IPv4 address is checked as that
// address: the metadata service and the unspecified address are refused
// however they are written, and an allowed address in another spelling is
// refused with its dotted form, so the data plane only ever sees one.
func TestAddressCheckCanonicalizesIPv4Spellings(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want string // "" accepts
	}{
		{"169.254.169.254:80", "169.254.0.0/16"},
		{"0251.0376.0251.0376:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"2852039166:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0xa9fea9fe:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0XA9FEA9FE:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"169.254.169.254.:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"169.254.43518:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"169.16689662:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0xa9.0xfe.0xa9.0xfe:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0xa9.254.0251.0xfe.:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0251.0376.0124776:80", "is 169.254.169.254, in 169.254.0.0/16"},
		{"0:8000", "is 0.0.0.0, in 0.0.0.0/8"},
		{"0x0:8000", "is 0.0.0.0, in 0.0.0.0/8"},
		{"0.0:8000", "is 0.0.0.0, in 0.0.0.0/8"},
		{"00000000000:8000", "is 0.0.0.0, in 0.0.0.0/8"},
		{"1681941704:80", "write it as 100.64.100.200:80"}, // not metadata: only a spelling
		{"1684300:80", "is 0.25.179.76, in 0.0.0.0/8"},
		{"0x64646464c8:80", "no IPv4 address"},
		{"100.100.100.0310:80", "is 100.100.100.200, in 100.100.100.200/32"},
		{"[::ffff:a9fe:a9fe]:80", "169.254.0.0/16"},
		{"[::169.254.169.254]:80", "169.254.0.0/16"},
		{"[64:ff9b::169.254.169.254]:80", "169.254.0.0/16"},
		{"[2002:a9fe:a9fe::1]:80", "169.254.0.0/16"},
		{"[::]:80", "::/128"},
		{"[::1]:8000", ""},
		{"10.0.0.5:8000", ""},
		{"012.0.0.5:8000", "write it as 10.0.0.5:8000"},
		{"0x7f.1:8000", "write it as 127.0.0.1:8000"},
		{"127.1:8000", "write it as 127.0.0.1:8000"},
		{"10.0.0.5.:8000", "write it as 10.0.0.5:8000"},
		{"08.0.0.1:80", "no IPv4 address"},
		{"256.0.0.1:80", "no IPv4 address"},
		{"1.2.3.4.5:80", "no IPv4 address"},
		{"4294967296:80", "no IPv4 address"},
		{"vllm.1:80", "no IPv4 address"},
		{"vllm.0x1:80", "no IPv4 address"},
		{"0x:80", "is 0.0.0.0"},
		{"0xz:80", ""}, // a name: not a number in any base
		{"vllm-0.svc.cluster.local.:8000", ""},
		{"1e100.net:443", ""},
		{"123abc:80", ""},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			err := ValidateRecordWith(withAddress(tc.addr), nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatal("accepted")
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// An allowed range is allowed in every spelling of its addresses only as
// far as the range goes; the spelling itself is still refused.
func TestAllowedRangeStillWantsTheDottedSpelling(t *testing.T) {
	allow, err := ParseAllowRanges("169.254.10.0/24")
	if err != nil {
		t.Fatal(err)
	}
	p := &AddressPolicy{Allow: allow}
	if err := ValidateRecordWith(withAddress("169.254.10.7:80"), p); err != nil {
		t.Fatalf("the allowed address was refused: %v", err)
	}
	err = ValidateRecordWith(withAddress("0xa9fe0a07:80"), p)
	if err == nil || !strings.Contains(err.Error(), "write it as 169.254.10.7:80") {
		t.Fatalf("got %v, want the dotted spelling asked for", err)
	}
	if err := ValidateRecordWith(withAddress("0xa9fea9fe:80"), p); err == nil || !strings.Contains(err.Error(), "allow-address-ranges") {
		t.Fatalf("metadata outside the allowed range: got %v", err)
	}
}

func withAddress(a string) fleet.Worker {
	r := goodRecord()
	r.Address = a
	return r
}

// spell writes ip as inet_aton reads it: parts (1-4) numbers, each in the
// base the bits of bases pick (decimal, octal, hex, upper-case hex).
func spell(ip uint32, parts int, bases uint16, trailingDot bool) string {
	var vals []uint64
	for i := 0; i < parts-1; i++ {
		vals = append(vals, uint64(ip>>(24-8*i))&0xff)
	}
	rest := uint(8 * (4 - (parts - 1)))
	vals = append(vals, uint64(ip)&(1<<rest-1))
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte('.')
		}
		switch (bases >> (2 * i)) & 3 {
		case 0:
			b.WriteString(strconv.FormatUint(v, 10))
		case 1:
			b.WriteString("0" + strconv.FormatUint(v, 8))
		case 2:
			b.WriteString("0x" + strconv.FormatUint(v, 16))
		case 3:
			b.WriteString("0X" + strings.ToUpper(strconv.FormatUint(v, 16)))
		}
	}
	if trailingDot {
		b.WriteByte('.')
	}
	return b.String()
}

// FuzzAddressSpellings: any spelling of any IPv4 address reads back as
// that address; one in a refused range is refused, and any spelling but
// the dotted one is refused. Free-form hosts never panic, and an accepted
// host is either an IP outside the refused ranges or a DNS name whose last
// label is no number.
func FuzzAddressSpellings(f *testing.F) {
	f.Add(uint32(0xa9fea9fe), uint8(4), uint16(0x55), false, "0251.0376.0251.0376")
	f.Add(uint32(0xa9fea9fe), uint8(1), uint16(0), true, "2852039166")
	f.Add(uint32(0xa9fea9fe), uint8(3), uint16(0x2a), false, "0xa9fea9fe")
	f.Add(uint32(0), uint8(2), uint16(0x3), true, "169.254.169.254.")
	f.Add(uint32(0x0a000005), uint8(4), uint16(0), false, "169.254.43518")
	f.Add(uint32(0x64646464), uint8(4), uint16(0xff), false, "[::ffff:169.254.169.254]")
	f.Fuzz(func(t *testing.T, ip uint32, parts uint8, bases uint16, dot bool, host string) {
		n := int(parts%4) + 1
		s := spell(ip, n, bases, dot)
		want := netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})
		got, numeric, ok := numericHost(s)
		if !numeric || !ok || got != want {
			t.Fatalf("%q read as %v (numeric %v, ok %v), want %v", s, got, numeric, ok, want)
		}
		err := ValidateRecordWith(withAddress(s+":80"), nil)
		refused := false
		for _, r := range refusedRanges {
			refused = refused || r.Contains(want)
		}
		if refused && (err == nil || !strings.Contains(err.Error(), "is "+want.String()+", in ")) {
			t.Fatalf("%q (%v) in a refused range: got %v", s, want, err)
		}
		if s != want.String() && err == nil {
			t.Fatalf("%q accepted, though it is not the dotted spelling of %v", s, want)
		}

		if err := ValidateRecordWith(withAddress(host+":80"), nil); err == nil {
			h := strings.Trim(host, "[]")
			if ip, perr := netip.ParseAddr(h); perr == nil {
				for _, r := range refusedRanges {
					if r.Contains(ip.Unmap()) {
						t.Fatalf("%q accepted, in %v", host, r)
					}
				}
				return
			}
			if _, numeric, _ := numericHost(host); numeric {
				t.Fatalf("numeric host %q accepted", host)
			}
			labels := strings.Split(strings.TrimSuffix(host, "."), ".")
			if isNumericPart(labels[len(labels)-1]) {
				t.Fatalf("%q accepted, its last label a number", host)
			}
		}
	})
}
