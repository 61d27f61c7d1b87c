package extproc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// startServer serves d on a loopback port and returns a connected client.
func startServer(t testing.TB, cfg ServerConfig) (*Server, *grpc.ClientConn) {
	t.Helper()
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(clientTLS)
	}
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return srv, cc
}

var clientTLS *tls.Config

// exchange sends msgs on one stream, collecting every response until the
// expected count arrives.
func exchange(t testing.TB, ctx context.Context, cc *grpc.ClientConn, msgs []*pb.ProcessingRequest, want int) []*pb.ProcessingResponse {
	t.Helper()
	st, out := exchangeOpen(t, ctx, cc, msgs, want)
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	return out
}

// exchangeOpen is exchange without the half-close: the stream stays open,
// as Envoy's does while the upstream answers, until ctx ends.
func exchangeOpen(t testing.TB, ctx context.Context, cc *grpc.ClientConn, msgs []*pb.ProcessingRequest, want int) (pb.ExternalProcessor_ProcessClient, []*pb.ProcessingResponse) {
	t.Helper()
	st, err := pb.NewExternalProcessorClient(cc).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	var out []*pb.ProcessingResponse
	for len(out) < want {
		r, err := st.Recv()
		if err != nil {
			t.Fatalf("recv after %d responses: %v", len(out), err)
		}
		out = append(out, r)
	}
	return st, out
}

func TestServerBodyModesOverGRPC(t *testing.T) {
	f := newFleet()
	srv, cc := startServer(t, ServerConfig{Decider: f})
	srv.SetReady(true)
	tests := []struct {
		name string
		msgs []*pb.ProcessingRequest
		want []string
	}{
		{"buffered", []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, []string{"req_headers", "req_body+route"}},
		{"full duplex", []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody(chatBody[:5], false), reqBody(chatBody[5:], true)}, []string{"req_headers+route", "req_chunk_eos"}},
		{"none", []*pb.ProcessingRequest{chatHeaders(ModeNone)}, []string{"req_headers+route"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := exchange(t, context.Background(), cc, tt.msgs, len(tt.want))
			if got := kinds(out); !slices.Equal(got, tt.want) {
				t.Fatalf("responses %v, want %v", got, tt.want)
			}
			for _, r := range out {
				if rt, ok := routeOf(r); ok && (rt.set["x-target-worker"] != "w0" || rt.metadata == "") {
					t.Errorf("route %+v", rt)
				}
			}
		})
	}
}

func TestServerImmediateResponseOverGRPC(t *testing.T) {
	f := newFleet()
	f.err = ErrShed("queue full")
	_, cc := startServer(t, ServerConfig{Decider: f})
	out := exchange(t, context.Background(), cc, []*pb.ProcessingRequest{chatHeaders(ModeFullDuplex), reqBody(chatBody, true)}, 1)
	if st, _ := immediateOf(t, out); st != 429 {
		t.Errorf("status %d, want 429", st)
	}
}

func TestServerOutOfOrderClosesStreamAndFreesLoad(t *testing.T) {
	f := newFleet()
	_, cc := startServer(t, ServerConfig{Decider: f})
	st, err := pb.NewExternalProcessorClient(cc).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*pb.ProcessingRequest{chatHeaders(ModeNone), reqBody("x", true)} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("err = %v, want FailedPrecondition", err)
	}
	waitFrees(t, f.lastTicket(), []Outcome{OutcomeReset})
}

func TestServerCancellationFreesLoad(t *testing.T) {
	f := newFleet()
	_, cc := startServer(t, ServerConfig{Decider: f})
	ctx, cancel := context.WithCancel(context.Background())
	// The stream stays open: a half-close would end it (and free the load)
	// on its own, racing the check below.
	exchangeOpen(t, ctx, cc, []*pb.ProcessingRequest{chatHeaders(ModeBuffered), reqBody(chatBody, true)}, 2)
	tk := f.lastTicket()
	if _, _, _, frees := tk.snapshot(); len(frees) != 0 {
		t.Fatalf("freed before cancel: %v", frees)
	}
	cancel()
	waitFrees(t, tk, []Outcome{OutcomeReset})
}

func waitFrees(t *testing.T, tk *recTicket, want []Outcome) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, _, frees := tk.snapshot()
		if slices.Equal(frees, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("frees = %v, want %v", frees, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServerHealth(t *testing.T) {
	srv, cc := startServer(t, ServerConfig{Decider: newFleet()})
	hc := healthpb.NewHealthClient(cc)
	check := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("health %q: %v", name, err)
		}
		return r.GetStatus()
	}
	for _, name := range []string{"", ServiceName, "readiness"} {
		if got := check(name); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%q before ready: %v", name, got)
		}
	}
	if got := check("liveness"); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness: %v", got)
	}
	srv.SetReady(true)
	for _, name := range []string{"", ServiceName, "readiness"} {
		if got := check(name); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q when ready: %v", name, got)
		}
	}
}

func TestServerShutdownEndsOpenStreams(t *testing.T) {
	f := newFleet()
	f.block = true
	srv, cc := startServer(t, ServerConfig{Decider: f})
	srv.SetReady(true)
	st, err := pb.NewExternalProcessorClient(cc).Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(chatHeaders(ModeNone)); err != nil {
		t.Fatal(err)
	}
	for { // wait until the Decider holds the request
		f.mu.Lock()
		n := len(f.seen)
		f.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	srv.Shutdown(ctx)
	if srv.Ready() {
		t.Error("still ready after Shutdown")
	}
	if _, err := st.Recv(); err == nil {
		t.Error("stream still open after Shutdown")
	}
}

func TestServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	caCert, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caCert.Raw)
	srvCert := issue(t, caCert, caKey, filepath.Join(dir, "srv"), true)
	cliCert := issue(t, caCert, caKey, filepath.Join(dir, "cli"), false)
	tlsCfg, err := LoadTLS(filepath.Join(dir, "srv.pem"), filepath.Join(dir, "srv.key"), filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	_ = srvCert

	clientTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cliCert}}
	defer func() { clientTLS = nil }()
	_, cc := startServer(t, ServerConfig{Decider: newFleet(), TLS: tlsCfg})
	out := exchange(t, context.Background(), cc, []*pb.ProcessingRequest{chatHeaders(ModeNone)}, 1)
	if kind(out[0]) != "req_headers+route" {
		t.Errorf("response %v", kinds(out))
	}

	// Without a client certificate the handshake fails.
	clientTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	_, cc2 := startServer(t, ServerConfig{Decider: newFleet(), TLS: tlsCfg})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := pb.NewExternalProcessorClient(cc2).Process(ctx)
	if err == nil {
		_ = st.Send(chatHeaders(ModeNone))
		_, err = st.Recv()
	}
	if err == nil {
		t.Fatal("stream without a client certificate succeeded")
	}
	if _, err := LoadTLS(filepath.Join(dir, "srv.pem"), filepath.Join(dir, "srv.key"), filepath.Join(dir, "srv.key")); err == nil {
		t.Error("a key file accepted as client CA")
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, base string, server bool) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: filepath.Base(base)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	writePEM(t, base+".pem", "CERTIFICATE", der)
	writePEM(t, base+".key", "EC PRIVATE KEY", kder)
	c, err := tls.LoadX509KeyPair(base+".pem", base+".key")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
