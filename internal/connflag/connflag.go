// Package connflag registers the credential and TLS flags of the
// connections to NATS and etcd (--nats-creds, --nats-tls-ca, --etcd-cert,
// ...), so that kvroute, kvbridge and kvsim accept the same names, help
// and secret-file handling, and turns them into client options.
package connflag

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/kvroute/kvroute/bus"
	"github.com/nats-io/nats.go"
)

// NATS holds the NATS credential and TLS flags.
type NATS struct {
	CredsFile, NKeySeedFile string
	User, Password          string
	PasswordFile            string
	CA, Cert, Key           string
}

// RegisterNATS adds --nats-creds, --nats-nkey, --nats-user,
// --nats-password, --nats-password-file and --nats-tls-{ca,cert,key} to fs.
func RegisterNATS(fs *flag.FlagSet) *NATS {
	n := &NATS{}
	fs.StringVar(&n.CredsFile, "nats-creds", "", "NATS credentials `file` (JWT and NKey seed, as nsc writes it) for --nats-url")
	fs.StringVar(&n.NKeySeedFile, "nats-nkey", "", "NATS NKey seed `file` for --nats-url")
	fs.StringVar(&n.User, "nats-user", "", "NATS user for --nats-url")
	fs.StringVar(&n.Password, "nats-password", "", "NATS password (prefer --nats-password-file)")
	fs.StringVar(&n.PasswordFile, "nats-password-file", "", "`file` holding the NATS password (trailing newline ignored)")
	fs.StringVar(&n.CA, "nats-tls-ca", "", "CA `file` that signs the NATS server certificate (enables TLS)")
	fs.StringVar(&n.Cert, "nats-tls-cert", "", "client certificate `file` for NATS TLS")
	fs.StringVar(&n.Key, "nats-tls-key", "", "client key `file` for NATS TLS")
	return n
}

// Secret returns the password given inline or in its file.
func (n *NATS) Secret() (string, error) { return Secret("nats-password", n.Password, n.PasswordFile) }

// TLS returns the client TLS the flags ask for, or nil.
func (n *NATS) TLS() (*tls.Config, error) {
	if n.CA == "" && n.Cert == "" {
		return nil, nil
	}
	return ClientTLS("nats", n.Cert, n.Key, n.CA)
}

// Options returns the nats.Connect options of the flags: credentials
// and TLS.
func (n *NATS) Options() ([]nats.Option, error) {
	pw, err := n.Secret()
	if err != nil {
		return nil, err
	}
	t, err := n.TLS()
	if err != nil {
		return nil, err
	}
	return bus.Auth(n.CredsFile, n.NKeySeedFile, n.User, pw, t)
}

// Etcd holds the etcd credential and TLS flags.
type Etcd struct {
	Username, Password, PasswordFile string
	CA, Cert, Key                    string
}

// RegisterEtcd adds --etcd-username, --etcd-password,
// --etcd-password-file and --etcd-{ca,cert,key} to fs.
func RegisterEtcd(fs *flag.FlagSet) *Etcd {
	e := &Etcd{}
	fs.StringVar(&e.Username, "etcd-username", "", "etcd user")
	fs.StringVar(&e.Password, "etcd-password", "", "etcd password (prefer --etcd-password-file: a command line is visible to every user of the host)")
	fs.StringVar(&e.PasswordFile, "etcd-password-file", "", "`file` holding the etcd password (trailing newline ignored), e.g. a mounted Kubernetes Secret")
	fs.StringVar(&e.Cert, "etcd-cert", "", "client certificate `file` for etcd TLS")
	fs.StringVar(&e.Key, "etcd-key", "", "client key `file` for etcd TLS")
	fs.StringVar(&e.CA, "etcd-ca", "", "CA `file` that signs the etcd server certificate (enables TLS)")
	return e
}

// Secret returns the password given inline or in its file.
func (e *Etcd) Secret() (string, error) { return Secret("etcd-password", e.Password, e.PasswordFile) }

// TLS returns the client TLS the flags ask for, or nil.
func (e *Etcd) TLS() (*tls.Config, error) {
	if e.CA == "" && e.Cert == "" {
		return nil, nil
	}
	return ClientTLS("etcd", e.Cert, e.Key, e.CA)
}

// Secret returns the secret given inline or read from file (trailing
// newline dropped); both at once is an error naming flag and flag-file.
func Secret(flagName, inline, file string) (string, error) {
	if file == "" {
		return inline, nil
	}
	if inline != "" {
		return "", fmt.Errorf("give --%s or --%s-file, not both", flagName, flagName)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// ClientTLS builds the client TLS of a connection (what: "etcd", "nats")
// from a client certificate and key and a CA, each optional.
func ClientTLS(what, cert, key, ca string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s client certificate: %w", what, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s CA: %w", what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s CA %s holds no PEM certificate", what, ca)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
