package envoytest

import (
	"errors"
	"regexp"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func opt(key, value string, action corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(value)}, AppendAction: action}
}

func TestApplyHeaderMutation(t *testing.T) {
	base := headerMap{{":method", "POST"}, {":path", "/a"}, {":authority", "gw"}, {"x-a", "1"}, {"x-a", "2"}}
	cases := []struct {
		name    string
		rules   mutationRules
		mut     *extprocsvc.HeaderMutation
		want    headerMap
		wantErr bool
	}{
		{"set overwrites all values by default", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("x-a", "9", 0)}},
			headerMap{{":method", "POST"}, {":path", "/a"}, {":authority", "gw"}, {"x-a", "9"}}, false},
		{"append field appends", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", RawValue: []byte("3")}, Append: wrapperspb.Bool(true)}}},
			append(base.clone(), header{"x-a", "3"}), false},
		{"add if absent skips present", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("x-a", "3", corev3.HeaderValueOption_ADD_IF_ABSENT), opt("x-b", "1", corev3.HeaderValueOption_ADD_IF_ABSENT)}},
			append(base.clone(), header{"x-b", "1"}), false},
		{"overwrite if exists skips absent", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{opt("x-b", "1", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS)}},
			base, false},
		{"value field is not read", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-b", Value: "v"}}}},
			append(base.clone(), header{"x-b", ""}), false},
		{"value and raw_value together fail", mutationRules{},
			&extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-b", Value: "v", RawValue: []byte("r")}}}},
			nil, true},
		{"routing and envoy headers ignored", mutationRules{},
			setHeaders(":method", "GET", ":authority", "x", "host", "x", ":scheme", "https", "x-envoy-retry-on", "5xx", ":path", "/b"),
			headerMap{{":method", "POST"}, {":path", "/b"}, {":authority", "gw"}, {"x-a", "1"}, {"x-a", "2"}}, false},
		{"allow_all_routing and allow_envoy", mutationRules{allowAllRouting: true, allowEnvoy: true},
			setHeaders(":method", "GET", "x-envoy-retry-on", "5xx"),
			headerMap{{":method", "GET"}, {":path", "/a"}, {":authority", "gw"}, {"x-a", "1"}, {"x-a", "2"}, {"x-envoy-retry-on", "5xx"}}, false},
		{"system headers and host never removed", mutationRules{allowAllRouting: true},
			&extprocsvc.HeaderMutation{RemoveHeaders: []string{":path", "host", "X-A"}},
			headerMap{{":method", "POST"}, {":path", "/a"}, {":authority", "gw"}}, false},
		{"disallow_system", mutationRules{disallowSystem: true}, setHeaders(":path", "/b"), base, false},
		{"disallow_all", mutationRules{disallowAll: true}, setHeaders("x-c", "1"), base, false},
		{"allow expression beats disallow_all", mutationRules{disallowAll: true, allowExpr: regexp.MustCompile("^(?:x-c)$")},
			setHeaders("x-c", "1"), append(base.clone(), header{"x-c", "1"}), false},
		{"disallow_is_error", mutationRules{disallowIsError: true}, setHeaders("x-envoy-a", "1"), nil, true},
		{"invalid name", mutationRules{}, setHeaders("bad name", "1"), nil, true},
		{"invalid value", mutationRules{}, setHeaders("x-c", "a\r\nb"), nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := base.clone()
			err := applyHeaderMutation(tc.mut, &h, tc.rules)
			if tc.wantErr {
				if !errors.Is(err, errMutation) {
					t.Fatalf("err = %v, want errMutation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(h, tc.want) {
				t.Fatalf("got %v\nwant %v", h, tc.want)
			}
		})
	}
}

// The processor's mutations are network input: any bytes must give a
// mutation result or an error, never a panic, and never a header that
// breaks HTTP framing.
func FuzzApplyHeaderMutation(f *testing.F) {
	seed, _ := proto.Marshal(setHeaders("x-target-worker", "w1", ":path", "/x", "x-envoy-a", "b"))
	f.Add(seed, false)
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 0x41}, true)
	f.Fuzz(func(t *testing.T, data []byte, strict bool) {
		var hm extprocsvc.HeaderMutation
		if proto.Unmarshal(data, &hm) != nil {
			return
		}
		h := headerMap{{":method", "POST"}, {":path", "/"}, {"x-a", "1"}}
		if err := applyHeaderMutation(&hm, &h, mutationRules{disallowIsError: strict}); err != nil {
			return
		}
		for _, e := range h {
			if !validHeaderName(e.key) || !validHeaderValue(e.value) {
				t.Fatalf("invalid header %q: %q survived", e.key, e.value)
			}
		}
	})
}
