package bench

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// EmbeddedNATS is an in-process NATS server on a free loopback port.
type EmbeddedNATS struct {
	srv *natsserver.Server
}

// StartNATS starts an in-process NATS server on 127.0.0.1 and a free port.
func StartNATS() (*EmbeddedNATS, error) {
	s, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true,
		MaxPayload: 8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats: not ready after 10s")
	}
	return &EmbeddedNATS{srv: s}, nil
}

// URL is the client URL.
func (n *EmbeddedNATS) URL() string { return n.srv.ClientURL() }

// Close stops the server and waits for it.
func (n *EmbeddedNATS) Close() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}

// EmbeddedEtcd is a single-member etcd in a temporary directory.
type EmbeddedEtcd struct {
	e   *embed.Etcd
	dir string
	// Endpoints are the client URLs.
	Endpoints []string
}

// StartEtcd starts an embedded etcd on free loopback ports with its data in
// a fresh temporary directory, removed by Close.
func StartEtcd() (*EmbeddedEtcd, error) {
	dir, err := os.MkdirTemp("", "kvbench-etcd-")
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	client, err := loopbackURL()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	peer, err := loopbackURL()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		_ = os.RemoveAll(dir)
		return nil, errors.New("embedded etcd: not ready after 30s")
	}
	return &EmbeddedEtcd{e: e, dir: dir, Endpoints: []string{client.String()}}, nil
}

// Close stops etcd and removes its data.
func (e *EmbeddedEtcd) Close() {
	e.e.Close()
	_ = os.RemoveAll(e.dir)
}

// loopbackURL reserves a free loopback port. The port is released before
// etcd binds it; on a busy machine another process could take it first,
// which makes StartEtcd fail loudly rather than misbehave.
func loopbackURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, fmt.Errorf("free port: %w", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return url.URL{Scheme: "http", Host: addr}, nil
}
