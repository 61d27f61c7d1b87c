package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzStream drives the state machine with arbitrary message sequences:
// it must never panic, and a routed request's load is freed exactly once.
// mode's bit 0x40 marks the response observed; ops with the high bit set
// are a body that comes first (request headers skipped) or the observing
// filter's report.
func FuzzStream(f *testing.F) {
	f.Add([]byte{0x81, 0x80, 5}, uint8(0x40))
	f.Add([]byte{0x81, 0x80, 0x80}, uint8(0x42))
	f.Add([]byte{0, 1, 1, 3, 4, 4}, uint8(2))
	f.Add([]byte{0, 1, 2, 3, 4, 5}, uint8(4))
	f.Add([]byte{0, 0, 3, 3}, uint8(0))
	f.Add([]byte{1, 4, 0, 2}, uint8(1))
	f.Fuzz(func(t *testing.T, ops []byte, mode uint8) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		fl := newFleet()
		s := NewStream(&Config{MaxBodyBytes: 1 << 10}, fl)
		bm := BodyMode(mode % 6)
		if mode&0x40 != 0 {
			s.SetResponseObserved()
		}
		var err error
		for i, op := range ops {
			eos := i%2 == 1
			if op >= 0x80 && op%2 == 0 {
				s.Observe(observedHeaders("id", []string{"200", "503", "404"}[i%3], "via_upstream"))
				continue
			}
			var m *pb.ProcessingRequest
			if op >= 0x80 {
				m = bodyFirst(chatBody, chatAttrs)
				m.ProtocolConfig.RequestBodyMode = bm
				var out []*pb.ProcessingResponse
				out, err = s.Step(context.Background(), m)
				checkEnvoyRules(t, m, out, err)
				if err != nil {
					break
				}
				continue
			}
			switch op % 7 {
			case 0:
				m = headerMsg(bm, BodyMode((mode/8)%5), eos, hdr{":path", "/v1/chat/completions"})
			case 1:
				m = reqBody(chatBody, eos)
			case 2:
				m = reqTrailers()
			case 3:
				m = respHeaders([]string{"200", "503", "x"}[i%3], eos)
			case 4:
				m = respBody("data: x\n\n", eos)
			case 5:
				m = respTrailers()
			case 6:
				m = &pb.ProcessingRequest{}
			}
			var out []*pb.ProcessingResponse
			out, err = s.Step(context.Background(), m)
			checkEnvoyRules(t, m, out, err)
			if err != nil {
				break
			}
		}
		s.Close(err)
		for _, tk := range fl.tickets {
			if _, _, _, frees := tk.snapshot(); len(frees) != 1 {
				t.Fatalf("ticket freed %d times (%v)", len(frees), frees)
			}
		}
	})
}

// FuzzRouteHeaders: whatever cluster, address and fallback a Decider
// returns, the stream never sets a header value with control bytes, and
// it either routes or refuses (freeing the load once).
func FuzzRouteHeaders(f *testing.F) {
	f.Add("w0", "10.0.0.1:8000", "10.0.0.2:8000")
	f.Add("w0\r\nx: y", "10.0.0.1:8000", "")
	f.Add("w0", "\x00", "a,b")
	f.Fuzz(func(t *testing.T, cluster, address, fallback string) {
		fl := newFleet()
		fl.workers = []Decision{{Cluster: cluster, Address: address, Fallbacks: []string{fallback}}}
		s := NewStream(&Config{}, fl)
		if _, err := s.Step(context.Background(), chatHeaders(ModeBuffered)); err != nil {
			t.Fatal(err)
		}
		out, err := s.Step(context.Background(), reqBody(chatBody, true))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range out[0].GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if v := string(h.GetHeader().GetRawValue()); !validHeaderValue(v) {
				t.Fatalf("header %s set to invalid value %q", h.GetHeader().GetKey(), v)
			}
		}
		s.Close(nil)
		if _, _, _, frees := fl.tickets[0].snapshot(); len(frees) != 1 {
			t.Fatalf("load freed %d times", len(frees))
		}
	})
}

// FuzzAttributeHeaders decodes arbitrary request attributes: it must never
// panic, and every header it keeps has a lower-case token for a name.
func FuzzAttributeHeaders(f *testing.F) {
	f.Add("request.headers['x-kvroute-priority']", "3", "request.path", "/v1/chat/completions")
	f.Add("request.headers['']", "", "request.id", "id")
	f.Add("request.headers['a']']", "x", "request.headers['", "y")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		st := &structpb.Struct{Fields: map[string]*structpb.Value{k1: structpb.NewStringValue(v1), k2: structpb.NewStringValue(v2)}}
		for name := range attributeHeaders(st) {
			if !strings.HasPrefix(name, ":") && name != RequestIDHeader && !headerToken(name) {
				t.Fatalf("kept header %q", name)
			}
			if strings.ContainsAny(name, "[]' ") || strings.ToLower(name) != name {
				t.Fatalf("kept header %q", name)
			}
		}
	})
}

// FuzzObservePeer decodes arbitrary forwarded reports: never a panic, and
// a report that decodes is an observed response-headers message.
func FuzzObservePeer(f *testing.F) {
	good, _ := encodeObservation(observedHeaders("id", "503", "via_upstream"))
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeObservation(b)
		if err == nil && (m.GetResponseHeaders() == nil || !m.GetObservabilityMode()) {
			t.Fatalf("decoded %v", m)
		}
		o := newObservers(time.Millisecond)
		if err == nil && o.observe(m) {
			t.Fatal("an empty registry took a report")
		}
	})
}
