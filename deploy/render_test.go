package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Object is one rendered Kubernetes object: its identity and its JSON.
type Object struct {
	APIVersion, Kind, Name, Namespace string
	JSON                              []byte
}

func (o Object) String() string { return o.Kind + "/" + o.Name }

// overlays are every kustomization users apply; each must render.
var overlays = []string{"base", "overlays/dev", "overlays/vllm", "overlays/gateway-api", "overlays/istio", "overlays/inferencepool", existingFleet, withMonitoring, myFleet}

// withMonitoring is the vllm overlay with the optional monitoring component
// (ServiceMonitor, Grafana dashboard), as a user adds it; relative to k8s/.
const withMonitoring = "../testdata/vllm-monitoring"

// myFleet is docs/deploy.md's example of an overlay of one's own.
const myFleet = "../testdata/my-fleet"

// existingFleet is kvroute in front of vLLM pods the operator already runs.
const existingFleet = "overlays/existing-fleet"

var (
	renderMu    sync.Mutex
	renderCache = map[string][]Object{}
)

// render builds k8s/<dir> with kustomize's Go API, as `kubectl apply -k` does.
func render(t testing.TB, dir string) []Object {
	t.Helper()
	renderMu.Lock()
	defer renderMu.Unlock()
	if objs, ok := renderCache[dir]; ok {
		return objs
	}
	objs, err := renderDir(filesys.MakeFsOnDisk(), filepath.Join("k8s", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	renderCache[dir] = objs
	return objs
}

func renderDir(fs filesys.FileSystem, dir string) ([]Object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fs, dir)
	if err != nil {
		return nil, err
	}
	var objs []Object
	for _, r := range rm.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		objs = append(objs, Object{APIVersion: r.GetApiVersion(), Kind: r.GetKind(), Name: r.GetName(), Namespace: r.GetNamespace(), JSON: js})
	}
	return objs, nil
}

// decodeStrict decodes JSON into v, refusing fields v does not have.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

func find(objs []Object, kind, name string) (Object, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o, true
		}
	}
	return Object{}, false
}

// findPrefix finds a generated object (ConfigMap names get a hash suffix).
func findPrefix(objs []Object, kind, name string) (Object, bool) {
	for _, o := range objs {
		if o.Kind == kind && (o.Name == name || strings.HasPrefix(o.Name, name+"-")) {
			return o, true
		}
	}
	return Object{}, false
}

func kinds(objs []Object) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.String())
	}
	sort.Strings(ks)
	return ks
}

func TestEveryOverlayRenders(t *testing.T) {
	want := map[string][]string{
		"base":                 {"Deployment/kvroute", "Deployment/envoy", "Service/kvroute", "Service/kvroute-grpc", "Service/envoy", "ServiceAccount/kvroute"},
		"overlays/dev":         {"Namespace/kvroute-dev", "Deployment/nats", "Deployment/etcd", "Deployment/kvsim", "Deployment/envoy"},
		"overlays/vllm":        {"Deployment/vllm", "Deployment/envoy"},
		withMonitoring:         {"Deployment/vllm", "ServiceMonitor/kvroute", "ConfigMap/kvroute-dashboard", "Deployment/envoy"},
		"overlays/gateway-api": {"InferencePool/vllm", "HTTPRoute/llm", "Deployment/vllm", "Deployment/kvroute"},
		existingFleet:          {"InferencePool/vllm", "Deployment/kvroute", "Deployment/envoy", "Role/kvroute-pool-reader"},
		"overlays/istio":       {"EnvoyFilter/kvroute-ext-proc", "DestinationRule/kvroute", "Gateway/llm-gateway", "VirtualService/llm", "Deployment/llm-gateway"},
	}
	absent := map[string][]string{
		"overlays/vllm":        {"ServiceMonitor/kvroute"}, // optional: needs the Prometheus Operator's CRDs
		"overlays/gateway-api": {"Deployment/envoy", "Service/envoy"},
		existingFleet:          {"Deployment/vllm", "Deployment/nats", "Deployment/etcd"},
		"overlays/istio":       {"Deployment/envoy", "Service/envoy"},
	}
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			have := map[string]bool{}
			for _, k := range kinds(objs) {
				have[k] = true
			}
			for _, w := range want[dir] {
				if !have[w] {
					t.Errorf("%s lacks %s; it has %v", dir, w, kinds(objs))
				}
			}
			for _, a := range absent[dir] {
				if have[a] {
					t.Errorf("%s still has %s", dir, a)
				}
			}
			if dir != "base" {
				for _, o := range objs {
					if o.Kind != "Namespace" && o.Namespace == "" {
						t.Errorf("%s: %s has no namespace", dir, o)
					}
				}
			}
		})
	}
}

func TestBrokenKustomizationFailsToRender(t *testing.T) {
	fs := filesys.MakeFsInMemory()
	files := map[string]string{
		"k/kustomization.yaml": "resources: [missing.yaml]\n",
	}
	for p, body := range files {
		if err := fs.WriteFile(p, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := renderDir(fs, "k"); err == nil {
		t.Fatal("a kustomization naming a missing resource rendered")
	}
}
