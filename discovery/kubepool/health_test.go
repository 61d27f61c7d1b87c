//go:build kubeapiserver

package kubepool_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/kubepool"
	"github.com/kvroute/kvroute/internal/testenv/kubetest"
)

// cutProxy forwards TCP to target until cut, then refuses and drops every
// connection until restored on the same address: an API server outage as
// the router sees it.
type cutProxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) restore(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// healthChan is a discovery.Observer that passes on Health reports.
type healthChan chan error

func (healthChan) BadRecord(string, error) {}
func (h healthChan) Health(err error)      { h <- err }

// An API server outage is reported once when it starts and once when the
// API server answers again; the last known pods stay in the Sink meanwhile.
func TestKubeAPIServerOutageIsReported(t *testing.T) {
	c := kubetest.Start(t, "llm")
	vllm := map[string]string{"app": "vllm"}
	c.ApplyPool(t, "vllm", vllm, 8000)
	c.CreatePod(t, "vllm-a", vllm, nil, "10.0.0.1")
	u, err := url.Parse(c.REST.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	rest := *c.REST
	rest.Host = "https://" + proxy.addr
	health := make(chan error, 16)
	rec := newRecorder()
	w, err := kubepool.New(kubepool.Config{PoolName: "vllm", PoolNamespace: c.NS, REST: &rest,
		Defaults:      kubepool.Defaults{Model: "Qwen/Qwen3-8B", BlockSize: 16},
		ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx, rec, healthChan(health)) }()
	rec.waitFor(t, "vllm-a")
	select {
	case err := <-health:
		t.Fatalf("a health report (%v) before any outage", err)
	case <-time.After(300 * time.Millisecond):
	}

	proxy.cut()
	select {
	case err := <-health:
		if err == nil {
			t.Fatal("the outage was reported as a recovery")
		}
		t.Logf("reported: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no report 10 s into the outage")
	}
	if got := rec.get("vllm-a"); got.ID == "" {
		t.Error("the last known pod left the fleet during the outage")
	}
	proxy.restore(t)
	select {
	case err := <-health:
		if err != nil {
			t.Fatalf("after the restore: %v, want the recovery (nil)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no recovery report 10 s after the API server came back")
	}
}
