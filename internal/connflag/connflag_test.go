package connflag

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecret(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("hunter2\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, inline, file, want, wantErr string
	}{
		{name: "none"},
		{name: "inline", inline: "a", want: "a"},
		{name: "file, newline dropped", file: file, want: "hunter2"},
		{name: "both", inline: "a", file: file, wantErr: "give --x or --x-file, not both"},
		{name: "missing file", file: "/nonexistent/pw", wantErr: "secret file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Secret("x", tt.inline, tt.file)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("%q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestFlagsAndTLS(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	n, e := RegisterNATS(fs), RegisterEtcd(fs)
	for _, name := range []string{"nats-creds", "nats-nkey", "nats-user", "nats-password", "nats-password-file", "nats-tls-ca", "nats-tls-cert", "nats-tls-key",
		"etcd-username", "etcd-password", "etcd-password-file", "etcd-ca", "etcd-cert", "etcd-key"} {
		if fs.Lookup(name) == nil {
			t.Errorf("--%s not registered", name)
		}
	}
	if c, err := n.TLS(); c != nil || err != nil {
		t.Errorf("TLS with no flags: %v, %v; want none", c, err)
	}
	if opts, err := n.Options(); len(opts) != 0 || err != nil {
		t.Errorf("options with no flags: %d, %v", len(opts), err)
	}
	_ = fs.Parse([]string{"--etcd-ca", "/nonexistent/ca.pem", "--nats-creds", "c", "--nats-user", "u"})
	if _, err := e.TLS(); err == nil || !strings.Contains(err.Error(), "etcd CA") {
		t.Errorf("etcd TLS with a missing CA: %v", err)
	}
	if _, err := n.Options(); err == nil || !strings.Contains(err.Error(), "one of") {
		t.Errorf("two NATS credentials: %v, want refused", err)
	}
	bad := filepath.Join(t.TempDir(), "ca.pem")
	_ = os.WriteFile(bad, []byte("not pem"), 0o600)
	if _, err := ClientTLS("nats", "", "", bad); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Errorf("a CA without PEM: %v", err)
	}
}
