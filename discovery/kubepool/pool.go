// Package kubepool discovers a fleet from a Gateway API Inference Extension
// InferencePool (inference.networking.k8s.io/v1), as the GIE endpoint picker
// does: it watches the named pool for its selector and target ports, watches
// the namespace's pods, and hands every Ready pod with an IP to a
// fleet.Sink as one worker per target port. A pod that stops being
// Ready, starts terminating or is deleted is removed at once.
//
// The pool is read through the dynamic client (the GIE Go module is not a
// dependency); pods through client-go's typed informers. No leader election:
// every router replica watches on its own.
package kubepool

import (
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// PoolGVR is the InferencePool resource of the GIE v1 API.
var PoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// Spec is what the router needs from an InferencePool: which pods, and
// which of their ports serve (one data-parallel rank each).
type Spec struct {
	// Selector is spec.selector.matchLabels; a pod matches when it carries
	// every label with the same value.
	Selector map[string]string
	// Ports are spec.targetPorts[].number, in order.
	Ports []int
}

// Matches reports whether labels satisfy the selector. An empty selector
// matches nothing: a pool that selects every pod of a namespace is a
// mistake, not a fleet.
func (s Spec) Matches(labels map[string]string) bool {
	if len(s.Selector) == 0 {
		return false
	}
	for k, v := range s.Selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// ParseSpec reads an InferencePool object's spec, as the v1 CRD defines it:
//
//	spec:
//	  selector: {matchLabels: {app: vllm}}
//	  targetPorts: [{number: 8000}]
//
// Anything else in the object is ignored. Missing or malformed fields are
// errors, never panics: the object comes from the API server.
func ParseSpec(obj *unstructured.Unstructured) (Spec, error) {
	if obj == nil {
		return Spec{}, errors.New("inferencepool: no object")
	}
	spec, ok := obj.Object["spec"].(map[string]any)
	if !ok {
		return Spec{}, errors.New("inferencepool: no spec")
	}
	var out Spec
	sel, ok := spec["selector"].(map[string]any)
	if !ok {
		return Spec{}, errors.New("inferencepool: spec.selector is missing or not an object")
	}
	ml, ok := sel["matchLabels"].(map[string]any)
	if !ok || len(ml) == 0 {
		return Spec{}, errors.New("inferencepool: spec.selector.matchLabels is missing or empty")
	}
	out.Selector = make(map[string]string, len(ml))
	for k, v := range ml {
		s, ok := v.(string)
		if !ok {
			return Spec{}, fmt.Errorf("inferencepool: selector label %q is not a string", k)
		}
		out.Selector[k] = s
	}
	tps, ok := spec["targetPorts"].([]any)
	if !ok || len(tps) == 0 {
		return Spec{}, errors.New("inferencepool: spec.targetPorts is missing or empty")
	}
	seen := map[int]bool{}
	for i, tp := range tps {
		m, ok := tp.(map[string]any)
		if !ok {
			return Spec{}, fmt.Errorf("inferencepool: targetPorts[%d] is not an object", i)
		}
		n, err := portNumber(m["number"])
		if err != nil {
			return Spec{}, fmt.Errorf("inferencepool: targetPorts[%d].number: %w", i, err)
		}
		if seen[n] {
			return Spec{}, fmt.Errorf("inferencepool: targetPorts[%d].number %d repeats", i, n)
		}
		seen[n] = true
		out.Ports = append(out.Ports, n)
	}
	return out, nil
}

func portNumber(v any) (int, error) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case int:
		n = int64(x)
	case int32:
		n = int64(x)
	case float64:
		if x != float64(int64(x)) {
			return 0, fmt.Errorf("%v is not an integer", x)
		}
		n = int64(x)
	case string:
		p, err := strconv.ParseInt(x, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%q is not a number", x)
		}
		n = p
	case nil:
		return 0, errors.New("missing")
	default:
		return 0, fmt.Errorf("%v (%T) is not a number", v, v)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%d is not a port", n)
	}
	return int(n), nil
}
