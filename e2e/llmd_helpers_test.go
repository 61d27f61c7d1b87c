//go:build llmdsim

package e2e

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
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// hfAddr is where the stand-in for huggingface.co listens. llm-d-inference-sim
// asks https://huggingface.co/api/models/<model> whether --model is a real
// model, and only then tokenizes through --render-url; with no route to the
// internet it would fall back to its dummy tokenizer, whose ids are
// hashes of words, not the model's. An address of its own on loopback keeps
// port 443 clear of anything else on the machine.
const hfAddr = "127.88.0.1:443"

// hfStub answers huggingface.co's model lookup for the simulators: a TLS
// server with a throwaway CA, the hosts file and the CA file the simulators
// get. Each simulator runs in a mount namespace of its own (unshare) where
// that hosts file is /etc/hosts, so nothing else on the machine sees it. It
// needs root (port 443, mount namespaces); the test skips without it.
type hfStub struct {
	hostsFile, caFile string
}

func startHFStub(t *testing.T) *hfStub {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("llm-d-inference-sim tokenizes through --render-url only for a model huggingface.co knows; the stand-in for it needs root (port 443, a mount namespace per simulator)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) is needed to give each simulator its own /etc/hosts")
	}
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "huggingface.co"},
		DNSNames: []string{"huggingface.co"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	s := &hfStub{hostsFile: filepath.Join(dir, "hosts"), caFile: filepath.Join(dir, "ca.pem")}
	if err := os.WriteFile(s.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(hfAddr)
	hosts := fmt.Sprintf("127.0.0.1 localhost\n%s huggingface.co\n", host)
	if err := os.WriteFile(s.hostsFile, []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", hfAddr)
	if err != nil {
		t.Skipf("cannot listen on %s for the huggingface.co stand-in: %v", hfAddr, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"` + r.URL.Path + `"}`))
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}},
	}
	go func() { _ = srv.ServeTLS(lis, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// llmdSim is one llm-d-inference-sim process.
type llmdSim struct {
	id, addr string
	cmd      *exec.Cmd
	done     chan struct{}
	log      string // its output file
}

// startLLMDSim runs the simulator, with its own /etc/hosts when hf is set
// (see hfStub; without it the simulator tokenizes text with its dummy
// tokenizer, and only token-id prompts reach its KV cache as sent). podIP
// is what it names itself by in its KV event topic.
func startLLMDSim(t testing.TB, bin string, hf *hfStub, id, podIP string, port int, args ...string) *llmdSim {
	t.Helper()
	args = append([]string{"--port", fmt.Sprint(port)}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "POD_IP="+podIP)
	if hf != nil {
		script := `hosts=$0; mount --bind "$hosts" /etc/hosts && exec "$@"`
		cmd = exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, hf.hostsFile, bin}, args...)...)
		cmd.Env = append(os.Environ(), "POD_IP="+podIP, "SSL_CERT_FILE="+hf.caFile)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &llmdSim{id: id, addr: net.JoinHostPort(podIP, fmt.Sprint(port)), cmd: cmd, done: make(chan struct{}), log: logf.Name()}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(s.done) }()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("%s log tail:\n%s", id, s.logTail())
		}
	})
	return s
}

// logTail is the end of the simulator's output.
func (s *llmdSim) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

func (s *llmdSim) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// waitReady polls the simulator's /v1/models until it answers.
func (s *llmdSim) waitReady(ctx context.Context) error {
	for {
		resp, err := http.Get("http://" + s.addr + "/v1/models")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last error %w)", s.id, ctx.Err(), err)
		case <-s.done:
			return fmt.Errorf("%s exited: %s", s.id, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
