package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bus"
	"github.com/kvroute/kvroute/internal/testenv"
	"github.com/kvroute/kvroute/kvevents/vllmwire"
	"github.com/kvroute/kvroute/server"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// These tests build the router's configuration from the serve flags, as
// an operator gives them, and connect to a real in-process NATS server
// that requires an NKey or TLS.

// serveWith parses flags plus a workers file and loopback listeners, and
// starts the router; the router is shut down when t ends.
func serveWith(t *testing.T, logs io.Writer, args ...string) (*server.Server, error) {
	t.Helper()
	dir := t.TempDir()
	workers := filepath.Join(dir, "workers.yaml")
	if err := os.WriteFile(workers, []byte("workers:\n- {id: w0, model: m, address: '10.0.0.1:8000', block_size: 16, kv_total_blocks: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--workers-file", workers, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	var out bytes.Buffer
	cfg, err := parseServe(append(base, args...), &out, &out, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("flags: %v", err)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.ShutdownGrace = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	r, err := server.Start(ctx, cfg)
	if err != nil {
		cancel()
		return nil, err
	}
	t.Cleanup(func() { cancel(); _ = r.Wait() })
	return r, nil
}

// routesEvents publishes a KV event batch for w0 over pub and waits until
// r's index holds it.
func routesEvents(t *testing.T, r *server.Server, pub *nats.Conn) {
	t.Helper()
	toks := make([]uint32, 32)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	ev := vllmwire.BlockStored{BlockHashes: []vllmwire.EngineHash{vllmwire.HashInt(1), vllmwire.HashInt(2)}, TokenIDs: toks, BlockSize: 16}
	if err := bus.PublishEvents(pub, "default", "w0", 0, vllmwire.EventBatch{TS: 1, Events: []vllmwire.Event{ev}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for r.Index().Stats().Entries != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the router's index holds %d entries, want the 2 just published", r.Index().Stats().Entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeSeed(t *testing.T, kp nkeys.KeyPair) (file string, seed []byte) {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(file, append(append([]byte{}, seed...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return file, seed
}

// --nats-nkey: the router authenticates with the seed file's NKey (the
// server knows only the public key) and consumes KV events; a seed the
// server does not know is refused with an authorization error; neither
// seed ever appears on a log line or in the error.
func TestNATSNKeyFlag(t *testing.T) {
	testenv.Quiet()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := user.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.StartNATSWith(t, func(o *natsserver.Options) { o.Nkeys = []*natsserver.NkeyUser{{Nkey: pub}} })
	seedFile, seed := writeSeed(t, user)
	stranger, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	wrongFile, wrongSeed := writeSeed(t, stranger)

	// No credentials at all: refused.
	if _, err := nats.Connect(n.URL); err == nil {
		t.Fatal("the NATS server accepted a client without an NKey; the test would prove nothing")
	}

	var logs testenv.SyncBuffer
	_, err = serveWith(t, &logs, "--nats-url", n.URL, "--nats-nkey", wrongFile)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("unknown NKey: %v, want an authorization error", err)
	}
	t.Logf("unknown NKey: %v", err)
	if strings.Contains(err.Error(), string(wrongSeed)) {
		t.Fatalf("the error holds the seed: %v", err)
	}
	badFile := filepath.Join(t.TempDir(), "bad.nk")
	if err := os.WriteFile(badFile, []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := serveWith(t, &logs, "--nats-url", n.URL, "--nats-nkey", badFile); err == nil || !strings.Contains(err.Error(), "nkey") {
		t.Fatalf("a file without a seed: %v, want an nkey error", err)
	}

	r, err := serveWith(t, &logs, "--nats-url", n.URL, "--nats-nkey", seedFile)
	if err != nil {
		t.Fatalf("with the NKey seed: %v", err)
	}
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(n.URL, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	routesEvents(t, r, nc)
	out := logs.String()
	if !strings.Contains(out, "nats connected") {
		t.Fatalf("no connection log line:\n%s", out)
	}
	for _, s := range [][]byte{seed, wrongSeed} {
		if strings.Contains(out, string(s)) || strings.Contains(out, string(s[:20])) {
			t.Fatalf("a log line holds an NKey seed:\n%s", out)
		}
	}
}

// natsPKI is testenv.WritePKI's CA file and its certificate loaded for a
// TLS-only NATS server.
func natsPKI(t *testing.T) (caFile string, serverCert tls.Certificate) {
	t.Helper()
	caFile, certFile, keyFile := testenv.WritePKI(t, t.TempDir())
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, cert
}

// --nats-tls-ca: against a NATS server that requires TLS with a
// certificate from the test's own CA, the router given the CA connects
// and consumes KV events; without it the connection fails with an error
// that names the certificate.
func TestNATSTLSCAFlag(t *testing.T) {
	testenv.Quiet()
	caFile, cert := natsPKI(t)
	n := testenv.StartNATSWith(t, func(o *natsserver.Options) {
		o.TLS, o.TLSTimeout = true, 5
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	})
	url := fmt.Sprintf("tls://127.0.0.1:%d", n.Server.Addr().(*net.TCPAddr).Port)

	var logs testenv.SyncBuffer
	_, err := serveWith(t, &logs, "--nats-url", url)
	if err == nil || !strings.Contains(err.Error(), "nats connect") || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("TLS NATS without the CA: %v, want a connect error naming the certificate", err)
	}

	t.Logf("without the CA: %v", err)

	r, err := serveWith(t, &logs, "--nats-url", url, "--nats-tls-ca", caFile)
	if err != nil {
		t.Fatalf("with --nats-tls-ca: %v", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	nc, err := nats.Connect(url, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	routesEvents(t, r, nc)
	if !strings.Contains(logs.String(), "nats_tls=true") {
		t.Fatalf("the config log line does not show NATS TLS on:\n%s", logs.String())
	}
}
