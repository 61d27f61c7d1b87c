// Package testenv starts real infrastructure for tests: an in-process NATS
// server and an embedded etcd, each on free loopback ports and torn down when
// the test ends. Tests use these instead of mocks of either.
//
// testenv and its subpackages (kubetest: a kube-apiserver with the
// InferencePool CRD; sourcetest: the worker-source contract) are the test
// support of the module: tests, e2e and the peer harnesses import them, no
// product package does (internal/importrules checks it).
package testenv

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// NATS is an in-process NATS server.
type NATS struct {
	Server *natsserver.Server
	URL    string
	port   int // set by Stop
	edit   func(*natsserver.Options)
}

// StartNATS starts a NATS server on a free loopback port and stops it when t
// ends.
func StartNATS(t testing.TB) *NATS {
	t.Helper()
	return startNATSOn(t, natsserver.RANDOM_PORT)
}

// Restart stops n's server and starts a new one on the same port, so
// clients can exercise their reconnect logic.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Stop()
	n.Resume(t)
}

// Stop shuts n's server down (an outage) and remembers its port for Resume.
func (n *NATS) Stop() {
	n.port = n.Server.Addr().(*net.TCPAddr).Port
	n.Server.Shutdown()
	n.Server.WaitForShutdown()
}

// Resume starts a new server on the port Stop freed.
func (n *NATS) Resume(t testing.TB) {
	t.Helper()
	fresh := startNATSWith(t, n.port, n.edit)
	n.Server, n.URL = fresh.Server, fresh.URL
}

// StartJetStream starts a NATS server with JetStream enabled, its store in
// a temporary directory, and stops it when t ends.
func StartJetStream(t testing.TB) *NATS {
	t.Helper()
	dir := t.TempDir() // one store across Restart
	return startNATSWith(t, natsserver.RANDOM_PORT, func(o *natsserver.Options) {
		o.JetStream, o.StoreDir = true, dir
	})
}

// StartNATSWith starts a NATS server after edit has changed its options
// (authorization, TLS, JetStream) and stops it when t ends.
func StartNATSWith(t testing.TB, edit func(*natsserver.Options)) *NATS {
	t.Helper()
	return startNATSWith(t, natsserver.RANDOM_PORT, edit)
}

func startNATSOn(t testing.TB, port int) *NATS {
	t.Helper()
	return startNATSWith(t, port, nil)
}

func startNATSWith(t testing.TB, port int, edit func(*natsserver.Options)) *NATS {
	t.Helper()
	opts := &natsserver.Options{
		Host:           "127.0.0.1",
		Port:           port,
		NoLog:          true,
		NoSigs:         true,
		MaxControlLine: 4096,
		MaxPayload:     8 << 20,
	}
	if edit != nil {
		edit(opts)
	}
	s, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &NATS{Server: s, URL: s.ClientURL(), edit: edit}
}

// Etcd is an embedded single-member etcd.
type Etcd struct {
	Server *embed.Etcd
	// Endpoints are the client URLs, ready for clientv3.Config.
	Endpoints []string
	cfg       *embed.Config
	stopped   bool // Server closed by Stop and not resumed
}

// StartEtcd starts an embedded etcd with its data in a temporary directory
// and closes it when t ends.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	// The ports were free when chosen but are not held until etcd binds
	// them: the two may coincide, or another test may take one first, so
	// a bind that fails starts over on fresh ports.
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		client, peer := FreePort(t), FreePort(t)
		if client == peer {
			continue
		}
		e := &Etcd{cfg: etcdConfig(t, client, peer)}
		e.Endpoints = []string{e.cfg.ListenClientUrls[0].String()}
		if e.Server, err = e.startErr(); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
				continue
			}
			t.Fatalf("embedded etcd: %v", err)
		}
		t.Cleanup(func() {
			if !e.stopped {
				e.Server.Close()
			}
		})
		return e
	}
	t.Fatalf("embedded etcd: no two free ports after 5 tries: %v", err)
	return nil
}

// etcdConfig is a single-member etcd on the two loopback ports, its data
// in a fresh temporary directory.
func etcdConfig(t testing.TB, client, peer int) *embed.Config {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	clientURL := mustURL(t, fmt.Sprintf("http://127.0.0.1:%d", client))
	peerURL := mustURL(t, fmt.Sprintf("http://127.0.0.1:%d", peer))
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	return cfg
}

func (e *Etcd) start(t testing.TB) *embed.Etcd {
	t.Helper()
	srv, err := e.startErr()
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	return srv
}

func (e *Etcd) startErr() (*embed.Etcd, error) {
	srv, err := embed.StartEtcd(e.cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		srv.Close()
		return nil, errors.New("not ready after 30s")
	}
	return srv, nil
}

// Client returns a client of e (its own logging off: it would print every
// retried call while e is stopped), closed when t ends.
func (e *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Stop closes the server (an outage); its data and ports stay for Resume.
func (e *Etcd) Stop() {
	e.Server.Close()
	e.stopped = true
}

// Resume starts etcd again on the data directory and ports Stop left, as a
// restarted member would: keys and leases come back (each lease with its
// full TTL again), clients reconnect.
func (e *Etcd) Resume(t testing.TB) {
	t.Helper()
	e.cfg.ClusterState = embed.ClusterStateFlagExisting
	e.Server = e.start(t)
	e.stopped = false
}

func mustURL(t testing.TB, s string) url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return *u
}

// FreePort is a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// Quiet silences the standard logger for libraries that write to it.
func Quiet() { log.SetOutput(io.Discard) }
