package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// KubeAPIServerEnv names the environment variable holding the path of a
// kube-apiserver binary (`make kube-apiserver` builds one from
// tools/kube-apiserver and the Makefile passes it to the tests).
const KubeAPIServerEnv = "KVROUTE_KUBE_APISERVER"

// KubeAPIServer is a real kube-apiserver over an embedded etcd.
type KubeAPIServer struct {
	// URL is the secure endpoint, "https://127.0.0.1:<port>".
	URL string
	// Token is a bearer token of a system:masters user.
	Token string
	// Kubeconfig is a kubeconfig file for URL and Token.
	Kubeconfig string
}

// StartKubeAPIServer starts the kube-apiserver named by KubeAPIServerEnv
// over a fresh embedded etcd, waits until it is ready and stops it when t
// ends. It fails the test when the variable is unset: tests that need it
// carry the kubeapiserver build tag, which the Makefile passes only with the
// binary built.
func StartKubeAPIServer(t testing.TB) *KubeAPIServer {
	t.Helper()
	bin := os.Getenv(KubeAPIServerEnv)
	if bin == "" {
		t.Fatalf("%s is not set: build the binary with `make kube-apiserver` (scripts/kube-apiserver.sh prints its path)", KubeAPIServerEnv)
	}
	etcd := StartEtcd(t)
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	token := rand.Text()
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(token + ",admin,1,system:masters\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := FreePort(t)
	logs := &syncWriter{w: new(bytes.Buffer)}
	cmd := exec.Command(bin,
		"--etcd-servers", etcd.Endpoints[0],
		"--secure-port", strconv.Itoa(port), "--bind-address", "127.0.0.1",
		"--cert-dir", filepath.Join(dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.96.0.0/12",
		// Pods are created by the tests; no admission plugin may wait on a
		// service account controller that is not running.
		"--disable-admission-plugins", "ServiceAccount",
	)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	exited := make(chan struct{}) // closed once the process is gone; waitErr says how
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	url := "https://127.0.0.1:" + strconv.Itoa(port)
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec: test server's self-signed cert
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err := cl.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-exited:
			t.Fatalf("kube-apiserver exited: %v\n%s", waitErr, tail(logs.String(), 4000))
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready after 90s\n%s", tail(logs.String(), 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, url, token)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &KubeAPIServer{URL: url, Token: token, Kubeconfig: kc}
}

// syncWriter lets the process's stdout and stderr share one buffer.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
