package bus

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Auth turns NATS credentials into connection options: at most one of a
// credentials file (JWT and NKey seed, as nsc writes it), an NKey seed
// file or a user and password, plus client TLS (nil: none).
func Auth(credsFile, nkeySeedFile, user, password string, t *tls.Config) ([]nats.Option, error) {
	var opts []nats.Option
	n := 0
	if credsFile != "" {
		opts, n = append(opts, nats.UserCredentials(credsFile)), n+1
	}
	if nkeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(nkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey: %w", err)
		}
		opts, n = append(opts, o), n+1
	}
	if user != "" || password != "" {
		opts, n = append(opts, nats.UserInfo(user, password)), n+1
	}
	if n > 1 {
		return nil, errors.New("nats: give one of a credentials file, an nkey seed or a user and password")
	}
	if t != nil {
		opts = append(opts, nats.Secure(t))
	}
	return opts, nil
}
