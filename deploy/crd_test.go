package deploy

import (
	"encoding/json"
	"fmt"
	"regexp"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionet "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// customChecks validate custom resources: against their published Go types
// where the module can be fetched (Gateway API, Istio, Prometheus Operator),
// else against a strict hand-written schema (InferencePool).
var customChecks = map[string]func([]byte) error{
	"inference.networking.k8s.io/v1/InferencePool": checkInferencePool,
	"gateway.networking.k8s.io/v1/HTTPRoute": func(b []byte) error {
		return decodeStrict(b, new(gatewayv1.HTTPRoute))
	},
	"monitoring.coreos.com/v1/ServiceMonitor": func(b []byte) error {
		return decodeStrict(b, new(monitoringv1.ServiceMonitor))
	},
	"networking.istio.io/v1alpha3/EnvoyFilter": istioCheck(func() proto.Message { return new(istionet.EnvoyFilter) }),
	"networking.istio.io/v1/DestinationRule":   istioCheck(func() proto.Message { return new(istionet.DestinationRule) }),
	"networking.istio.io/v1/Gateway":           istioCheck(func() proto.Message { return new(istionet.Gateway) }),
	"networking.istio.io/v1/VirtualService":    istioCheck(func() proto.Message { return new(istionet.VirtualService) }),
}

// istioObject is an Istio custom resource: Kubernetes metadata around a spec
// that is one of istio.io/api's protobuf messages.
type istioObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
}

// istioCheck decodes the spec with protojson, which refuses unknown fields
// and unknown enum names, as Istio's own validation does.
func istioCheck(mk func() proto.Message) func([]byte) error {
	return func(b []byte) error {
		_, err := decodeIstio(b, mk)
		return err
	}
}

func decodeIstio(b []byte, mk func() proto.Message) (proto.Message, error) {
	var o istioObject
	if err := decodeStrict(b, &o); err != nil {
		return nil, err
	}
	m := mk()
	if err := protojson.Unmarshal(o.Spec, m); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	return m, nil
}

// InferencePool (inference.networking.k8s.io/v1): the Gateway API Inference
// Extension module cannot be fetched through the Go module proxy (403), so
// these types are the subset of its published api/v1 schema that we use,
// decoded strictly and checked against the schema's rules (enums, ranges,
// required fields, "port is required when kind is Service").
type inferencePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts       []poolPort `json:"targetPorts"`
		AppProtocol       string     `json:"appProtocol,omitempty"`
		EndpointPickerRef *struct {
			Group       *string   `json:"group,omitempty"`
			Kind        string    `json:"kind,omitempty"`
			Name        string    `json:"name"`
			Port        *poolPort `json:"port,omitempty"`
			FailureMode string    `json:"failureMode,omitempty"`
		} `json:"endpointPickerRef,omitempty"`
	} `json:"spec"`
}

type poolPort struct {
	Number int `json:"number"`
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func decodeInferencePool(b []byte) (*inferencePool, error) {
	var p inferencePool
	if err := decodeStrict(b, &p); err != nil {
		return nil, err
	}
	s := p.Spec
	if len(s.Selector.MatchLabels) == 0 || len(s.Selector.MatchLabels) > 64 {
		return nil, fmt.Errorf("spec.selector.matchLabels must hold 1-64 labels")
	}
	if len(s.TargetPorts) < 1 || len(s.TargetPorts) > 8 {
		return nil, fmt.Errorf("spec.targetPorts must hold 1-8 ports, has %d", len(s.TargetPorts))
	}
	seen := map[int]bool{}
	for _, tp := range s.TargetPorts {
		if tp.Number < 1 || tp.Number > 65535 || seen[tp.Number] {
			return nil, fmt.Errorf("spec.targetPorts: port %d out of range or repeated", tp.Number)
		}
		seen[tp.Number] = true
	}
	if s.AppProtocol != "" && s.AppProtocol != "http" && s.AppProtocol != "kubernetes.io/h2c" {
		return nil, fmt.Errorf("spec.appProtocol %q not http or kubernetes.io/h2c", s.AppProtocol)
	}
	if r := s.EndpointPickerRef; r != nil {
		if !dnsLabel.MatchString(r.Name) {
			return nil, fmt.Errorf("spec.endpointPickerRef.name %q is not a valid object name", r.Name)
		}
		if r.FailureMode != "" && r.FailureMode != "FailOpen" && r.FailureMode != "FailClose" {
			return nil, fmt.Errorf("spec.endpointPickerRef.failureMode %q not FailOpen or FailClose", r.FailureMode)
		}
		if (r.Kind == "" || r.Kind == "Service") && r.Port == nil {
			return nil, fmt.Errorf("spec.endpointPickerRef.port is required when kind is Service")
		}
		if r.Port != nil && (r.Port.Number < 1 || r.Port.Number > 65535) {
			return nil, fmt.Errorf("spec.endpointPickerRef.port.number %d out of range", r.Port.Number)
		}
	}
	return &p, nil
}

func checkInferencePool(b []byte) error {
	_, err := decodeInferencePool(b)
	return err
}

func TestCustomResourceChecksCatchMistakes(t *testing.T) {
	pool := `{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute","kind":"Service","port":{"number":9002},"failureMode":"FailOpen"}}}`
	cases := []struct {
		name, key, json string
		ok              bool
	}{
		{"a good pool", "inference.networking.k8s.io/v1/InferencePool", pool, true},
		{"pool with the pre-v1 portNumber", "inference.networking.k8s.io/v1/InferencePool",
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute","portNumber":9002}}}`, false},
		{"pool with the v1alpha2 targetPortNumber", "inference.networking.k8s.io/v1/InferencePool",
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPortNumber":8000}}`, false},
		{"pool failure mode misspelled", "inference.networking.k8s.io/v1/InferencePool",
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute","port":{"number":9002},"failureMode":"FailOpn"}}}`, false},
		{"pool service ref without port", "inference.networking.k8s.io/v1/InferencePool",
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute"}}}`, false},
		{"pool without target ports", "inference.networking.k8s.io/v1/InferencePool",
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[]}}`, false},
		{"HTTPRoute with backendRef misspelled", "gateway.networking.k8s.io/v1/HTTPRoute",
			`{"apiVersion":"gateway.networking.k8s.io/v1","kind":"HTTPRoute","metadata":{"name":"r"},"spec":{"rules":[{"backendRef":[{"name":"p"}]}]}}`, false},
		{"EnvoyFilter with an unknown operation", "networking.istio.io/v1alpha3/EnvoyFilter",
			`{"apiVersion":"networking.istio.io/v1alpha3","kind":"EnvoyFilter","metadata":{"name":"f"},"spec":{"configPatches":[{"applyTo":"HTTP_FILTER","patch":{"operation":"INSERT_BEFOR"}}]}}`, false},
		{"EnvoyFilter with an unknown field", "networking.istio.io/v1alpha3/EnvoyFilter",
			`{"apiVersion":"networking.istio.io/v1alpha3","kind":"EnvoyFilter","metadata":{"name":"f"},"spec":{"workloadSelectors":{}}}`, false},
		{"DestinationRule with a bad h2 policy", "networking.istio.io/v1/DestinationRule",
			`{"apiVersion":"networking.istio.io/v1","kind":"DestinationRule","metadata":{"name":"d"},"spec":{"host":"x","trafficPolicy":{"connectionPool":{"http":{"h2UpgradePolicy":"ALWAYS"}}}}}`, false},
		{"ServiceMonitor with endpoints misspelled", "monitoring.coreos.com/v1/ServiceMonitor",
			`{"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor","metadata":{"name":"m"},"spec":{"endpoint":[{"port":"metrics"}]}}`, false},
	}
	for _, c := range cases {
		err := customChecks[c.key]([]byte(c.json))
		if c.ok && err != nil {
			t.Errorf("%s: rejected: %v", c.name, err)
		}
		if !c.ok && err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}
