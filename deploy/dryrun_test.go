//go:build kubeapiserver

package deploy

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testenv/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/kyaml/kio"
)

// The CRDs the overlays' custom resources need, from the projects that
// publish them: the Gateway API Inference Extension's InferencePool (v1.0.0,
// as tools/gie-epp pins it), the Gateway API's standard channel and Istio's.
var crdSources = []struct{ module, glob string }{
	{"sigs.k8s.io/gateway-api-inference-extension@v1.0.0", "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"},
	{"sigs.k8s.io/gateway-api", "config/crd/standard/gateway.networking.k8s.io_*.yaml"},
	{"istio.io/api", "kubernetes/customresourcedefinitions.gen.yaml"},
}

// moduleDir finds a module in the module cache: a pinned version through
// `go mod download`, else the version deploy's go.mod requires.
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	args := []string{"list", "-m", "-f", "{{.Dir}}", mod}
	if strings.Contains(mod, "@") {
		args = []string{"mod", "download", "-json", mod}
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	if !strings.Contains(mod, "@") {
		return strings.TrimSpace(string(out))
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %s", mod, out)
	}
	return info.Dir
}

// crdDocuments reads every CustomResourceDefinition document of the sources.
func crdDocuments(t *testing.T) [][]byte {
	t.Helper()
	var docs [][]byte
	for _, s := range crdSources {
		files, err := filepath.Glob(filepath.Join(moduleDir(t, s.module), s.glob))
		if err != nil || len(files) == 0 {
			t.Fatalf("no CRDs at %s in %s (%v)", s.glob, s.module, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			nodes, err := kio.FromBytes(data)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, n := range nodes {
				if n.GetKind() != "CustomResourceDefinition" {
					continue // the Gateway API's ValidatingAdmissionPolicy
				}
				s, err := n.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, s)
			}
		}
	}
	return docs
}

// TestKubeAPIServerAcceptsEveryOverlay is `kubectl apply --dry-run=server`
// for every overlay: each rendered object is created with dryRun=All and
// strict field validation against a real kube-apiserver with the real CRDs,
// so a field the API server (or a CRD's schema) does not know, a bad enum or
// a missing required field fails here rather than on a user's cluster.
func TestKubeAPIServerAcceptsEveryOverlay(t *testing.T) {
	c := kubetest.StartWithCRDs(t, "kvroute", crdDocuments(t)...)
	ctx := context.Background()
	// The dev overlay's own namespace, and the one existing-fleet's pods run in.
	for _, ns := range []string{"kvroute-dev", "inference"} {
		if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.REST)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, dir := range overlays {
		t.Run(dir, func(t *testing.T) {
			for _, o := range render(t, dir) {
				var obj unstructured.Unstructured
				if err := obj.UnmarshalJSON(o.JSON); err != nil {
					t.Fatalf("%s: %v", o, err)
				}
				gvk := obj.GroupVersionKind()
				if gvk.Group == "monitoring.coreos.com" {
					continue // optional component; the Prometheus Operator's CRDs are not fetched here
				}
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					mapper.Reset()
					if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
						t.Errorf("%s: the API server does not serve %s: %v", o, gvk, err)
						continue
					}
				}
				ns := o.Namespace
				if dir == "base" && m.Scope.Name() == meta.RESTScopeNameNamespace {
					ns = "default"
				}
				res := c.Dyn.Resource(m.Resource).Namespace(ns)
				if m.Scope.Name() != meta.RESTScopeNameNamespace {
					res = c.Dyn.Resource(m.Resource)
				}
				_, err = res.Create(ctx, &obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
				if apierrors.IsAlreadyExists(err) && o.Kind == "Namespace" {
					continue // created above, so that the overlay's objects have it
				}
				if err != nil {
					t.Errorf("%s: the API server refuses %s: %v", dir, o, err)
				}
			}
		})
	}
}

func TestKubeAPIServerDryRunCatchesMistakes(t *testing.T) {
	c := kubetest.Start(t, "kvroute")
	for _, bad := range []struct {
		gvr  schema.GroupVersionResource
		json string
	}{
		{schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
			`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{"replica":1,"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}}`},
		{schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"},
			`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"p"},"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvroute","port":{"number":9002},"failureMode":"Sometimes"}}}`},
	} {
		var obj unstructured.Unstructured
		if err := obj.UnmarshalJSON([]byte(bad.json)); err != nil {
			t.Fatal(err)
		}
		_, err := c.Dyn.Resource(bad.gvr).Namespace("kvroute").Create(context.Background(), &obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
		if err == nil {
			t.Errorf("dry run accepted %s", bad.json)
		}
	}
}
