package kubepool

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func pool(t testing.TB, js string) *unstructured.Unstructured {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal([]byte(js), &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestParseSpec(t *testing.T) {
	cases := []struct {
		name, js, err string
		ports         []int
	}{
		{"v1 pool", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute"}}}`, "", []int{8000}},
		{"two ports", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000},{"number":8001}]}}`, "", []int{8000, 8001}},
		{"no spec", `{}`, "no spec", nil},
		{"v1alpha2 selector layout", `{"spec":{"selector":{"app":"vllm"},"targetPorts":[{"number":8000}]}}`, "matchLabels", nil},
		{"v1alpha2 targetPortNumber", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPortNumber":8000}}`, "targetPorts", nil},
		{"port out of range", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":70000}]}}`, "not a port", nil},
		{"port not a number", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":"http"}]}}`, "not a number", nil},
		{"fractional port", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":80.5}]}}`, "not an integer", nil},
		{"repeated port", `{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000},{"number":8000}]}}`, "repeats", nil},
		{"label value not a string", `{"spec":{"selector":{"matchLabels":{"app":1}},"targetPorts":[{"number":8000}]}}`, "not a string", nil},
		{"empty selector", `{"spec":{"selector":{"matchLabels":{}},"targetPorts":[{"number":8000}]}}`, "empty", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec(pool(t, tc.js))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Ports) != len(tc.ports) || s.Ports[0] != tc.ports[0] || s.Selector["app"] != "vllm" {
				t.Fatalf("spec = %+v, want ports %v and app=vllm", s, tc.ports)
			}
		})
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add(`{"spec":{"selector":{"matchLabels":{"app":"vllm"}},"targetPorts":[{"number":8000}]}}`)
	f.Add(`{"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":1e9},{"number":null}]}}`)
	f.Add(`{"spec":[]}`)
	f.Fuzz(func(t *testing.T, js string) {
		var obj map[string]any
		if json.Unmarshal([]byte(js), &obj) != nil {
			return
		}
		s, err := ParseSpec(&unstructured.Unstructured{Object: obj})
		if err != nil {
			return
		}
		if len(s.Selector) == 0 || len(s.Ports) == 0 {
			t.Fatalf("accepted a spec that selects nothing: %+v", s)
		}
		for _, p := range s.Ports {
			if p < 1 || p > 65535 {
				t.Fatalf("accepted port %d", p)
			}
		}
	})
}

func readyPod(name, ip string, ready bool, labels, ann map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ann},
		Status:     corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func TestWorkers(t *testing.T) {
	vllm := map[string]string{"app": "vllm", "tier": "gpu"}
	one := Spec{Selector: map[string]string{"app": "vllm"}, Ports: []int{8000}}
	two := Spec{Selector: map[string]string{"app": "vllm"}, Ports: []int{8000, 8002}}
	d := Defaults{Model: "m", BlockSize: 32}
	deleting := readyPod("p", "10.0.0.1", true, vllm, nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	cases := []struct {
		name  string
		pod   *corev1.Pod
		spec  Spec
		ids   []string
		addrs []string
		err   string
	}{
		{"ready pod", readyPod("p", "10.0.0.1", true, vllm, nil), one, []string{"p"}, []string{"10.0.0.1:8000"}, ""},
		{"one worker per port", readyPod("p", "10.0.0.1", true, vllm, nil), two, []string{"p-dp0", "p-dp1"}, []string{"10.0.0.1:8000", "10.0.0.1:8002"}, ""},
		{"not ready", readyPod("p", "10.0.0.1", false, vllm, nil), one, nil, nil, ""},
		{"no IP", readyPod("p", "", true, vllm, nil), one, nil, nil, ""},
		{"terminating", deleting, one, nil, nil, ""},
		{"not selected", readyPod("p", "10.0.0.1", true, map[string]string{"app": "web"}, nil), one, nil, nil, ""},
		{"IPv6", readyPod("p", "fd00::1", true, vllm, nil), one, []string{"p"}, []string{"[fd00::1]:8000"}, ""},
		{"bad annotation", readyPod("p", "10.0.0.1", true, vllm, map[string]string{AnnotationBlockSize: "big"}), one, nil, nil, "not a number"},
		{"dotted pod name", readyPod("llama-3.1-0", "10.0.0.1", true, vllm, nil), one, []string{"llama-3_1-0"}, []string{"10.0.0.1:8000"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws, err := Workers(tc.pod, tc.spec, d)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(ws) != len(tc.ids) {
				t.Fatalf("workers = %+v, want ids %v", ws, tc.ids)
			}
			for i, w := range ws {
				if w.ID != tc.ids[i] || w.Address != tc.addrs[i] || w.DPRank != i || w.Model != "m" || w.BlockSize != 32 {
					t.Fatalf("worker %d = %+v, want %s at %s rank %d", i, w, tc.ids[i], tc.addrs[i], i)
				}
			}
		})
	}
	ann := readyPod("p", "10.0.0.1", true, vllm, map[string]string{AnnotationModel: "other", AnnotationBlockSize: "64", AnnotationKVBlocks: "900"})
	ws, err := Workers(ann, one, d)
	if err != nil || ws[0].Model != "other" || ws[0].BlockSize != 64 || ws[0].KVTotalBlocks != 900 {
		t.Fatalf("annotated pod: %+v, %v; want the annotations to win over the defaults", ws, err)
	}
}
