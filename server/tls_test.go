package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/scoring"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// testPKI writes a CA and a certificate it signs (for 127.0.0.1, server
// and client use) under dir and returns the file paths.
func testPKI(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", kder)
}

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
	caFile, certFile, keyFile := testPKI(t, dir)
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
	if _, err := discovery.Register(context.Background(), cli, cfg.Namespace,
		scoring.WorkerSpec{ID: "tls0", Model: model, Address: "10.0.0.9:8000", BlockSize: 16, KVTotalBlocks: 100},
		discovery.RegisterOptions{TTL: 5 * time.Second, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ready after a registration over TLS", r.Ready)
	if w, status := route(t, dial(t, r), chatBody(3)); status != 200 || w != "tls0" {
		t.Fatalf("routed to %q (%d), want tls0", w, status)
	}
}
