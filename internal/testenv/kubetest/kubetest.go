// Package kubetest gives tests a real Kubernetes API: a kube-apiserver over
// an embedded etcd (testenv.StartKubeAPIServer) with the InferencePool CRD
// installed, and helpers that create pools and pods and set pod status as
// the kubelet would.
package kubetest

import (
	"context"
	_ "embed"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Cluster is a real kube-apiserver with the InferencePool CRD installed and
// a namespace to work in.
type Cluster struct {
	API  *testenv.KubeAPIServer
	REST *rest.Config
	Kube kubernetes.Interface
	Dyn  dynamic.Interface
	NS   string
}

//go:embed inferencepool-crd.yaml
var crdYAML []byte

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Start starts the API server, installs the CRD and creates namespace ns.
func Start(t testing.TB, ns string) *Cluster {
	t.Helper()
	return StartWithCRDs(t, ns, crdYAML)
}

// StartWithCRDs is Start with other CustomResourceDefinitions (YAML, one
// per document) in place of the built-in InferencePool CRD, for instance
// the Gateway API Inference Extension's own; one of them must serve
// InferencePool v1.
func StartWithCRDs(t testing.TB, ns string, crds ...[]byte) *Cluster {
	t.Helper()
	api := testenv.StartKubeAPIServer(t)
	cfg, err := kubepool.RESTConfig(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the tests' own writes
	c := &Cluster{API: api, REST: cfg, Kube: kubernetes.NewForConfigOrDie(cfg), Dyn: dynamic.NewForConfigOrDie(cfg), NS: ns}
	installCRDs(t, c.Dyn, crds)
	ctx := context.Background()
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.NS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// InstallCRD creates the InferencePool CRD and waits until
// the API server serves the resource.
func InstallCRD(t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	installCRDs(t, dyn, [][]byte{crdYAML})
}

func installCRDs(t testing.TB, dyn dynamic.Interface, crds [][]byte) {
	t.Helper()
	ctx := context.Background()
	for _, c := range crds {
		var obj map[string]any
		if err := yaml.Unmarshal(c, &obj); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD: %v", err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := dyn.Resource(kubepool.PoolGVR).Namespace("default").List(ctx, metav1.ListOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("InferencePool not served 30s after its CRD was created: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ApplyPool creates or updates an InferencePool selecting labels on ports.
func (c *Cluster) ApplyPool(t testing.TB, name string, labels map[string]string, ports ...int) {
	t.Helper()
	ml := map[string]any{}
	for k, v := range labels {
		ml[k] = v
	}
	tps := []any{}
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": int64(p)})
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name, "namespace": c.NS},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": ml}, "targetPorts": tps,
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	ctx := context.Background()
	res := c.Dyn.Resource(kubepool.PoolGVR).Namespace(c.NS)
	cur, err := res.Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		obj.SetResourceVersion(cur.GetResourceVersion())
		_, err = res.Update(ctx, obj, metav1.UpdateOptions{})
	} else {
		_, err = res.Create(ctx, obj, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("apply pool: %v", err)
	}
}

// CreatePod creates a pod and, when ip is set, writes its status through the
// status subresource as the kubelet would: Running, Ready, with that IP.
func (c *Cluster) CreatePod(t testing.TB, name string, labels, annotations map[string]string, ip string) {
	t.Helper()
	ctx := context.Background()
	p, err := c.Kube.CoreV1().Pods(c.NS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	if ip != "" {
		c.SetReady(t, p, ip, true)
	}
}

// SetReady writes the pod's status: Running, with ip, Ready or not.
func (c *Cluster) SetReady(t testing.TB, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p = p.DeepCopy()
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	if _, err := c.Kube.CoreV1().Pods(c.NS).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of %s: %v", p.Name, err)
	}
}

// Pod reads a pod.
func (c *Cluster) Pod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Kube.CoreV1().Pods(c.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
