package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery/etcd"
	"github.com/kvroute/kvroute/fleet"
	"github.com/kvroute/kvroute/internal/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func freeLoopback(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The router discovers workers from an etcd that requires TLS with client
// certificates (mTLS), given the CA and its own certificate, as the
// --etcd-ca, --etcd-cert and --etcd-key flags build them.
func TestEtcdOverMutualTLS(t *testing.T) {
	testenv.Quiet()
	dir := t.TempDir()
	caFile, certFile, keyFile := testenv.WritePKI(t, dir)
	cfgE := embed.NewConfig()
	cfgE.Dir = filepath.Join(dir, "etcd")
	cfgE.Logger, cfgE.LogLevel = "zap", "error"
	cfgE.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	client, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", freeLoopback(t)))
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", freeLoopback(t)))
	cfgE.ListenClientUrls, cfgE.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfgE.ListenPeerUrls, cfgE.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfgE.InitialCluster = cfgE.Name + "=" + peer.String()
	cfgE.ClientTLSInfo.CertFile, cfgE.ClientTLSInfo.KeyFile = certFile, keyFile
	cfgE.ClientTLSInfo.TrustedCAFile, cfgE.ClientTLSInfo.ClientCertAuth = caFile, true
	e, err := embed.StartEtcd(cfgE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd with TLS not ready")
	}

	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}

	// Without the client certificate etcd refuses the client.
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 2 * time.Second,
		TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = plain.Put(ctx, "/probe", "x")
		cancel()
		plain.Close()
	}
	if err == nil {
		t.Fatal("etcd accepted a client without a certificate; the test would prove nothing")
	}

	n := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.EtcdEndpoints, cfg.EtcdTLS, cfg.NATSURL = []string{client.String()}, tlsCfg, n.URL
	r := start(t, cfg)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client.String()}, DialTimeout: 5 * time.Second, TLS: tlsCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := etcd.Register(context.Background(), cli, cfg.Namespace,
		fleet.Worker{ID: "tls0", Model: model, Address: "10.0.0.9:8000", BlockSize: 16, KVTotalBlocks: 100},
		etcd.RegisterOptions{TTL: 5 * time.Second, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready after a registration over TLS", r.Ready)
	if w, status := route(t, dial(t, r), chatBody(3)); status != 200 || w != "tls0" {
		t.Fatalf("routed to %q (%d), want tls0", w, status)
	}
}
