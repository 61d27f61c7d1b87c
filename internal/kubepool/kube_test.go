//go:build kubeapiserver

package kubepool

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// cluster is a real kube-apiserver with the InferencePool CRD installed and
// a namespace to work in.
type cluster struct {
	api  *testenv.KubeAPIServer
	rest *rest.Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	ns   string
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func startCluster(t testing.TB) *cluster {
	t.Helper()
	api := testenv.StartKubeAPIServer(t)
	cfg, err := RESTConfig(api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the tests' own writes
	c := &cluster{api: api, rest: cfg, kube: kubernetes.NewForConfigOrDie(cfg), dyn: dynamic.NewForConfigOrDie(cfg), ns: "llm"}
	InstallCRD(t, c.dyn)
	ctx := context.Background()
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// InstallCRD creates the InferencePool CRD from testdata and waits until
// the API server serves the resource.
func InstallCRD(t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	raw, err := os.ReadFile("testdata/inferencepool-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := dyn.Resource(PoolGVR).Namespace("default").List(ctx, metav1.ListOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("InferencePool not served 30s after its CRD was created: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) applyPool(t testing.TB, name string, labels map[string]string, ports ...int) {
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
		"metadata": map[string]any{"name": name, "namespace": c.ns},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": ml}, "targetPorts": tps,
			"endpointPickerRef": map[string]any{"name": "kvroute", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	ctx := context.Background()
	res := c.dyn.Resource(PoolGVR).Namespace(c.ns)
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

// createPod creates a pod and, when ip is set, writes its status through the
// status subresource as the kubelet would: Running, Ready, with that IP.
func (c *cluster) createPod(t testing.TB, name string, labels, annotations map[string]string, ip string) {
	t.Helper()
	ctx := context.Background()
	p, err := c.kube.CoreV1().Pods(c.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	if ip != "" {
		c.setReady(t, p, ip, true)
	}
}

func (c *cluster) setReady(t testing.TB, p *corev1.Pod, ip string, ready bool) {
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
	if _, err := c.kube.CoreV1().Pods(c.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of %s: %v", p.Name, err)
	}
}

func (c *cluster) pod(t testing.TB, name string) *corev1.Pod {
	t.Helper()
	p, err := c.kube.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorder is a discovery.Sink that keeps the current worker set and
// signals every change.
type recorder struct {
	mu      sync.Mutex
	workers map[string]scoring.WorkerSpec
	removed map[string]time.Time
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{workers: map[string]scoring.WorkerSpec{}, removed: map[string]time.Time{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) Upsert(w scoring.WorkerSpec) {
	r.mu.Lock()
	r.workers[w.ID] = w
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) Remove(id string) {
	r.mu.Lock()
	delete(r.workers, id)
	r.removed[id] = time.Now()
	r.mu.Unlock()
	r.signal()
}

func (r *recorder) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.workers))
	for id := range r.workers {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (r *recorder) get(id string) scoring.WorkerSpec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.workers[id]
}

// waitFor waits until the worker set is exactly want.
func (r *recorder) waitFor(t testing.TB, want ...string) {
	t.Helper()
	sort.Strings(want)
	deadline := time.After(20 * time.Second)
	for {
		if got := r.ids(); fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("workers = %v, want %v", r.ids(), want)
		}
	}
}

func startWatcher(t testing.TB, c *cluster, pool string, sink *recorder) *Watcher {
	t.Helper()
	w, err := New(Config{PoolName: pool, PoolNamespace: c.ns, REST: c.rest, Sink: sink,
		Defaults: Defaults{Model: "Qwen/Qwen3-8B", BlockSize: 16}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-w.Synced():
	case <-time.After(30 * time.Second):
		t.Fatal("watcher not synced after 30s")
	}
	return w
}

func TestKubeAPIServerPoolWorkers(t *testing.T) {
	c := startCluster(t)
	vllm := map[string]string{"app": "vllm"}
	c.applyPool(t, "vllm", vllm, 8000)
	c.createPod(t, "vllm-a", vllm, map[string]string{AnnotationModel: "other/model", AnnotationKVBlocks: "4096"}, "10.0.0.1")
	c.createPod(t, "vllm-b", vllm, nil, "10.0.0.2")
	c.createPod(t, "vllm-pending", vllm, nil, "")                                // no IP, not Ready
	c.createPod(t, "web", map[string]string{"app": "web"}, nil, "10.0.0.9") // not selected

	rec := newRecorder()
	startWatcher(t, c, "vllm", rec)
	rec.waitFor(t, "vllm-a", "vllm-b")
	if a := rec.get("vllm-a"); a.Address != "10.0.0.1:8000" || a.Model != "other/model" || a.KVTotalBlocks != 4096 || a.BlockSize != 16 {
		t.Fatalf("vllm-a = %+v, want its IP, annotations and the default block size", a)
	}
	if b := rec.get("vllm-b"); b.Model != "Qwen/Qwen3-8B" || b.Address != "10.0.0.2:8000" {
		t.Fatalf("vllm-b = %+v, want the default model", b)
	}

	t.Run("pending pod becomes ready", func(t *testing.T) {
		c.setReady(t, c.pod(t, "vllm-pending"), "10.0.0.3", true)
		rec.waitFor(t, "vllm-a", "vllm-b", "vllm-pending")
	})
	t.Run("not ready is removed", func(t *testing.T) {
		c.setReady(t, c.pod(t, "vllm-pending"), "10.0.0.3", false)
		rec.waitFor(t, "vllm-a", "vllm-b")
	})
	t.Run("deleted is removed", func(t *testing.T) {
		start := time.Now()
		if err := c.kube.CoreV1().Pods(c.ns).Delete(context.Background(), "vllm-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t, "vllm-a")
		rec.mu.Lock()
		took := rec.removed["vllm-b"].Sub(start)
		rec.mu.Unlock()
		t.Logf("pod deletion to worker removal: %v", took.Round(time.Millisecond))
	})
	t.Run("two target ports give one worker per rank", func(t *testing.T) {
		c.applyPool(t, "vllm", vllm, 8000, 8001)
		rec.waitFor(t, "vllm-a-dp0", "vllm-a-dp1")
		if w := rec.get("vllm-a-dp1"); w.Address != "10.0.0.1:8001" || w.DPRank != 1 {
			t.Fatalf("vllm-a-dp1 = %+v", w)
		}
	})
	t.Run("selector change moves the fleet", func(t *testing.T) {
		c.applyPool(t, "vllm", map[string]string{"app": "web"}, 8000)
		rec.waitFor(t, "web")
	})
	t.Run("pool deleted selects nothing", func(t *testing.T) {
		if err := c.dyn.Resource(PoolGVR).Namespace(c.ns).Delete(context.Background(), "vllm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.waitFor(t)
	})
}

// BenchmarkKubeAPIServerDiscover500 measures how long a fresh watcher takes
// from Run to holding a 500-pod pool (all Ready) in its Sink.
func BenchmarkKubeAPIServerDiscover500(b *testing.B) {
	const pods = 500
	c := startCluster(b)
	vllm := map[string]string{"app": "vllm"}
	c.applyPool(b, "vllm", vllm, 8000)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.createPod(b, fmt.Sprintf("vllm-%03d", i), vllm, nil, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
		}()
	}
	wg.Wait()
	b.ResetTimer()
	for range b.N {
		rec := newRecorder()
		start := time.Now()
		w := startWatcher(b, c, "vllm", rec)
		took := time.Since(start)
		if n := w.Workers(); n != pods {
			b.Fatalf("synced with %d workers, want %d", n, pods)
		}
		b.ReportMetric(took.Seconds(), "s/discover500")
	}
}
