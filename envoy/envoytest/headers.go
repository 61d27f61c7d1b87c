package envoytest

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// header is one entry of an Envoy header map: lower-case key, raw value.
type header struct{ key, value string }

// headerMap is an ordered, multi-valued header map with Envoy's pseudo
// headers (":method", ":path", ":authority", ":scheme", ":status") inline.
type headerMap []header

func (h headerMap) get(key string) (string, bool) {
	for _, e := range h {
		if e.key == key {
			return e.value, true
		}
	}
	return "", false
}

func (h *headerMap) remove(key string) {
	out := (*h)[:0]
	for _, e := range *h {
		if e.key != key {
			out = append(out, e)
		}
	}
	*h = out
}

func (h *headerMap) set(key, value string) {
	out, done := (*h)[:0], false
	for _, e := range *h {
		if e.key == key {
			if done {
				continue
			}
			e.value, done = value, true
		}
		out = append(out, e)
	}
	if !done {
		out = append(out, header{key, value})
	}
	*h = out
}

func (h *headerMap) add(key, value string) { *h = append(*h, header{key, value}) }

func (h headerMap) clone() headerMap { return append(headerMap(nil), h...) }

// proto renders the map the way Envoy sends it: values in raw_value.
func (h headerMap) proto() *corev3.HeaderMap {
	out := &corev3.HeaderMap{Headers: make([]*corev3.HeaderValue, 0, len(h))}
	for _, e := range h {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: e.key, RawValue: []byte(e.value)})
	}
	return out
}

// fromHTTP appends Go's header map in a stable order with lower-case keys.
func (h *headerMap) fromHTTP(hdr http.Header) {
	keys := make([]string, 0, len(hdr))
	for k := range hdr {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop[lk] {
			continue
		}
		for _, v := range hdr[k] {
			h.add(lk, v)
		}
	}
}

// hopByHop headers belong to one connection and are never forwarded.
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true,
	"transfer-encoding": true, "upgrade": true, "te": true, "trailer": true,
}

// mutationRules is Envoy's HeaderMutationRules checker.
type mutationRules struct {
	allowAllRouting, allowEnvoy, disallowSystem, disallowAll, disallowIsError bool
	allowExpr, disallowExpr                                                   *regexp.Regexp
}

// routingHeaders may only change with allow_all_routing.
var routingHeaders = map[string]bool{"host": true, ":authority": true, ":method": true, ":scheme": true}

func (m mutationRules) allowed(name string) bool {
	switch {
	case m.disallowExpr != nil && m.disallowExpr.MatchString(name):
		return false
	case m.allowExpr != nil && m.allowExpr.MatchString(name):
		return true
	case m.disallowAll:
		return false
	case !m.allowAllRouting && routingHeaders[name]:
		return false
	case m.disallowSystem && strings.HasPrefix(name, ":"):
		return false
	case !m.allowEnvoy && strings.HasPrefix(name, "x-envoy"):
		return false
	}
	return true
}

// errMutation is a header mutation Envoy refuses with a 500.
var errMutation = errors.New("ext_proc header mutation rejected")

// check returns nil to apply a mutation, errIgnored to skip it silently and
// errMutation (wrapped) when disallow_is_error makes it fatal.
func (m mutationRules) check(name string, remove bool) error {
	if remove && (strings.HasPrefix(name, ":") || name == "host") {
		return errIgnored // system headers and host are never removed
	}
	if m.allowed(name) {
		return nil
	}
	if m.disallowIsError {
		return fmt.Errorf("%w: %s may not be modified", errMutation, name)
	}
	return errIgnored
}

var errIgnored = errors.New("ignored")

// validHeaderName reports whether s is a lower-case HTTP token, optionally
// with a leading ':' (pseudo header).
func validHeaderName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

func validHeaderValue(s string) bool { return !strings.ContainsAny(s, "\r\n\x00") }

// applyHeaderMutation applies an ext_proc HeaderMutation to h under the
// rules, as Envoy does: removals first, then sets; values come from
// raw_value; an unset append_action overwrites.
func applyHeaderMutation(hm *extprocsvc.HeaderMutation, h *headerMap, rules mutationRules) error {
	for _, name := range hm.GetRemoveHeaders() {
		name = strings.ToLower(name)
		if !validHeaderName(name) {
			return fmt.Errorf("%w: invalid character in remove_headers", errMutation)
		}
		switch err := rules.check(name, true); {
		case err == nil:
			h.remove(name)
		case !errors.Is(err, errIgnored):
			return err
		}
	}
	for _, sh := range hm.GetSetHeaders() {
		hv := sh.GetHeader()
		if hv == nil {
			continue
		}
		if hv.GetValue() != "" && len(hv.GetRawValue()) > 0 {
			return fmt.Errorf("%w: only one of value and raw_value may be set", errMutation)
		}
		name, value := strings.ToLower(hv.GetKey()), string(hv.GetRawValue())
		if !validHeaderName(name) || !validHeaderValue(value) {
			return fmt.Errorf("%w: invalid character in set_headers", errMutation)
		}
		_, exists := h.get(name)
		appendMode := sh.GetAppend().GetValue() // unset append means overwrite in ext_proc
		switch sh.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			// The zero value: Envoy falls back to the append field.
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if exists {
				continue
			}
			appendMode = true
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			appendMode = false
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if !exists {
				continue
			}
			appendMode = false
		default:
			return fmt.Errorf("%w: unknown append_action %v", errMutation, sh.GetAppendAction())
		}
		switch err := rules.check(name, false); {
		case err == nil:
			if appendMode {
				h.add(name, value)
			} else {
				h.set(name, value)
			}
		case !errors.Is(err, errIgnored):
			return err
		}
	}
	return nil
}
