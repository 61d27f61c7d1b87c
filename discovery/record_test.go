package discovery

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/fleet"
)

func goodRecord() fleet.Worker {
	return fleet.Worker{ID: "w0", Model: "Qwen/Qwen3-8B", Address: "10.0.0.5:8000", Cluster: "pool-a.w0", BlockSize: 16}
}

// Records from etcd and files reach keys, subjects, Envoy cluster names
// and headers: bad bytes and dangerous addresses are refused with an error
// that names the field.
func TestValidateRecordRefusesHostileRecords(t *testing.T) {
	allow, err := ParseAllowRanges("169.254.10.0/24, fe80::1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		edit   func(*fleet.Worker)
		policy *AddressPolicy
		want   string // "" accepts
	}{
		{"good", func(*fleet.Worker) {}, nil, ""},
		{"dns host", func(r *fleet.Worker) { r.Address = "vllm-0.vllm.ns.svc.cluster.local:8000" }, nil, ""},
		{"ipv6", func(r *fleet.Worker) { r.Address = "[fd00::5]:8000" }, nil, ""},
		{"loopback", func(r *fleet.Worker) { r.Address = "127.0.0.1:8000" }, nil, ""},
		{"CRLF in cluster", func(r *fleet.Worker) { r.Cluster = "w0\r\nx-evil: 1" }, nil, "cluster"},
		{"NUL in cluster", func(r *fleet.Worker) { r.Cluster = "w0\x00" }, nil, "cluster"},
		{"cluster named kvroute is a token", func(r *fleet.Worker) { r.Cluster = "kvroute" }, nil, ""},
		{"space in id", func(r *fleet.Worker) { r.ID = "w 0" }, nil, "id"},
		{"dot in id", func(r *fleet.Worker) { r.ID = "w.0" }, nil, "id"},
		{"wildcard id", func(r *fleet.Worker) { r.ID = "*" }, nil, "id"},
		{"long id", func(r *fleet.Worker) { r.ID = strings.Repeat("w", MaxIDLen+1) }, nil, "id"},
		{"LF in address", func(r *fleet.Worker) { r.Address = "10.0.0.5:8000\n" }, nil, "control characters"},
		{"CR in address", func(r *fleet.Worker) { r.Address = "10.0.0.5\r:8000" }, nil, "control characters"},
		{"no port", func(r *fleet.Worker) { r.Address = "10.0.0.5" }, nil, "host:port"},
		{"port 0", func(r *fleet.Worker) { r.Address = "10.0.0.5:0" }, nil, "port"},
		{"port name", func(r *fleet.Worker) { r.Address = "10.0.0.5:http" }, nil, "port"},
		{"bad host", func(r *fleet.Worker) { r.Address = "a/b:80" }, nil, "DNS name"},
		{"metadata IP", func(r *fleet.Worker) { r.Address = "169.254.169.254:80" }, nil, "169.254.0.0/16"},
		{"metadata IP mapped", func(r *fleet.Worker) { r.Address = "[::ffff:169.254.169.254]:80" }, nil, "169.254.0.0/16"},
		{"metadata name", func(r *fleet.Worker) { r.Address = "metadata.google.internal:80" }, nil, "metadata"},
		{"aws ipv6 metadata", func(r *fleet.Worker) { r.Address = "[fd00:ec2::254]:80" }, nil, "fd00:ec2::254"},
		{"ipv6 link-local", func(r *fleet.Worker) { r.Address = "[fe80::1]:8000" }, nil, "fe80::/10"},
		{"zoned", func(r *fleet.Worker) { r.Address = "[fe80::1%eth0]:8000" }, nil, "zoned"},
		{"unspecified", func(r *fleet.Worker) { r.Address = "0.0.0.0:8000" }, nil, "not one host"},
		{"allowed link-local range", func(r *fleet.Worker) { r.Address = "169.254.10.7:8000" }, &AddressPolicy{Allow: allow}, ""},
		{"allowed single ipv6", func(r *fleet.Worker) { r.Address = "[fe80::1]:8000" }, &AddressPolicy{Allow: allow}, ""},
		{"outside the allowed range", func(r *fleet.Worker) { r.Address = "169.254.169.254:80" }, &AddressPolicy{Allow: allow}, "allow-address-ranges"},
		{"control char in model", func(r *fleet.Worker) { r.Model = "m\x1b[31m" }, nil, "model"},
		{"bad adapter", func(r *fleet.Worker) { r.LoRAAdapters = []string{"a\nb"} }, nil, "lora_adapters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := goodRecord()
			tc.edit(&r)
			err := ValidateRecordWith(r, tc.policy)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted %+v", r)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not mention %q", err, tc.want)
			}
			if err != nil && strings.ContainsAny(err.Error(), "\r\n\x00") {
				t.Errorf("the error repeats a control character verbatim: %q", err)
			}
		})
	}
}

func TestParseAllowRanges(t *testing.T) {
	got, err := ParseAllowRanges("169.254.0.0/16,fe80::/10, 100.100.100.200")
	if err != nil || len(got) != 3 || got[2].Bits() != 32 {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := ParseAllowRanges("169.254.0.0/40"); err == nil {
		t.Error("a bad CIDR was accepted")
	}
	if _, err := ParseAllowRanges("*"); err == nil {
		t.Error("* was accepted")
	}
}

// FuzzParseRecord: whatever an etcd value holds, ParseRecord returns a
// record that passes validation (so is safe in keys, subjects and headers)
// or an error, never a panic.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{
		`{"id":"w0","model":"m","address":"10.0.0.5:8000","block_size":16}`,
		`{"id":"w0","model":"m","address":"10.0.0.5:8000","cluster":"a\r\nb","block_size":16}`,
		`{"id":"w0","model":"m","address":"169.254.169.254:80","block_size":16}`,
		`{"id":"w0","model":"m","address":"[fe80::1%eth0]:80","block_size":16,"lora_adapters":["x"]}`,
		`{"id":"*","model":"m","address":"h:1","block_size":1}`,
		`{"id":"w0","model":"m","address":"10.0.0.5:8000","block_size":32,"events_endpoint":"tcp://10.0.0.5:5601","replay_endpoint":"tcp://10.0.0.5:5602"}`,
		`{"id":"w0","model":"m","address":"10.0.0.5:8000","block_size":32,"events_endpoint":"tcp://169.254.169.254:80"}`,
		`null`, `[]`, `{"id":1}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRecord(data)
		if err != nil {
			return
		}
		if !ValidName(r.ID) || (r.Cluster != "" && !ValidCluster(r.Cluster)) || !printable(r.Address) || !printable(r.Model) ||
			!printable(r.EventsEndpoint) || !printable(r.ReplayEndpoint) {
			t.Fatalf("accepted an unsafe record %+v", r)
		}
		if err := ValidateRecord(r); err != nil {
			t.Fatalf("ParseRecord accepted what ValidateRecord refuses: %v", err)
		}
	})
}

func TestValidateRecordEventEndpoints(t *testing.T) {
	base := fleet.Worker{ID: "w", Model: "m", Address: "10.0.0.1:8000", BlockSize: 32}
	for _, tt := range []struct {
		name, events, replay string
		ok                   bool
	}{
		{"none", "", "", true},
		{"both on the worker's host", "tcp://10.0.0.1:5601", "tcp://10.0.0.1:5602", true},
		{"a DNS name", "tcp://engine-a.svc:5557", "", true},
		{"not tcp", "ipc:///tmp/kv", "", false},
		{"no port", "tcp://10.0.0.1", "", false},
		{"a metadata service", "", "tcp://169.254.169.254:80", false},
		{"port out of range", "tcp://10.0.0.1:70000", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := base
			r.EventsEndpoint, r.ReplayEndpoint = tt.events, tt.replay
			if err := ValidateRecord(r); (err == nil) != tt.ok {
				t.Errorf("ValidateRecord = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}
