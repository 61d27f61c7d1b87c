//go:build kubeapiserver

package kubepool_test

import (
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv/kubetest"
	"github.com/kvroute/kvroute/internal/testenv/sourcetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// poolBackend is a real API server with an InferencePool on port 8000:
// a worker is a Ready pod carrying its model and block size in
// annotations.
type poolBackend struct{ c *kubetest.Cluster }

var selected = map[string]string{"app": "vllm"}

func (b poolBackend) Open(t *testing.T) discovery.Source {
	w, err := kubepool.New(kubepool.Config{PoolName: "vllm", PoolNamespace: b.c.NS, REST: b.c.REST})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func (b poolBackend) Put(t *testing.T, w fleet.Worker) {
	ip, port, err := net.SplitHostPort(w.Address)
	if err != nil || port != "8000" {
		t.Fatalf("worker address %q: want <ip>:8000, the pool's port", w.Address)
	}
	ann := map[string]string{kubepool.AnnotationModel: w.Model, kubepool.AnnotationBlockSize: strconv.Itoa(w.BlockSize)}
	pods := b.c.Kube.CoreV1().Pods(b.c.NS)
	p, err := pods.Get(context.Background(), w.ID, metav1.GetOptions{})
	if err != nil {
		b.c.CreatePod(t, w.ID, selected, ann, ip)
		return
	}
	p.Annotations = ann
	if p, err = pods.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.c.SetReady(t, p, ip, true)
}

func (b poolBackend) Delete(t *testing.T, id string) {
	if err := b.c.Kube.CoreV1().Pods(b.c.NS).Delete(context.Background(), id, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (b poolBackend) PutBad(t *testing.T) {
	b.c.CreatePod(t, "bad", selected, map[string]string{kubepool.AnnotationBlockSize: "sixteen"}, "10.0.0.99")
}

func TestKubeAPIServerWatcherKeepsTheSourceContract(t *testing.T) {
	c := kubetest.Start(t, "llm")
	c.ApplyPool(t, "vllm", selected, 8000)
	sourcetest.Run(t, poolBackend{c})
}
