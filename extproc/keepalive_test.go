package extproc

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// pingUntil speaks raw HTTP/2 to the server, as Envoy's keepalive does on an
// idle connection: no streams, a PING every interval. It reports whether
// the server answered with GOAWAY.
func pingUntil(t *testing.T, addr string, interval time.Duration, pings int) (goaway bool) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	var wmu sync.Mutex // the framer's write side is not safe for two goroutines
	write := func(f func() error) error { wmu.Lock(); defer wmu.Unlock(); return f() }
	if err := write(func() error { return fr.WriteSettings() }); err != nil {
		t.Fatal(err)
	}
	frames := make(chan http2.Frame, 64)
	go func() {
		defer close(frames)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				_ = write(fr.WriteSettingsAck)
			}
			frames <- f
		}
	}()
	for i := range pings {
		if err := write(func() error { return fr.WritePing(false, [8]byte{byte(i)}) }); err != nil {
			return true // the server closed the connection
		}
		deadline := time.After(interval)
	drain:
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					return true
				}
				if _, isGoAway := f.(*http2.GoAwayFrame); isGoAway {
					return true
				}
			case <-deadline:
				break drain
			}
		}
	}
	return false
}

func TestServerToleratesKeepalivePingsWithoutStreams(t *testing.T) {
	_, cc := startServer(t, ServerConfig{Decider: newFleet(), KeepaliveMinTime: 50 * time.Millisecond, Logger: discardLogger()})
	addr := cc.Target()
	if pingUntil(t, addr, 80*time.Millisecond, 6) {
		t.Fatal("pings at the allowed interval on an idle connection got GOAWAY")
	}
	// The policy is enforced: a client pinging far faster is cut off.
	if !pingUntil(t, addr, time.Millisecond, 30) {
		t.Fatal("a ping flood was tolerated")
	}
}

// A connection that never opens a stream is closed: one that never sends
// the HTTP/2 preface after the handshake timeout, one that does but opens
// no stream after the idle timeout (keepalive pings do not keep it).
func TestServerClosesIdleConnections(t *testing.T) {
	const idle = 300 * time.Millisecond
	_, cc := startServer(t, ServerConfig{Decider: newFleet(), KeepaliveMinTime: 50 * time.Millisecond, ConnIdleTimeout: idle, Logger: discardLogger()})
	addr := cc.Target()

	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	// The server writes its SETTINGS first; then it must hang up.
	if _, err := io.Copy(io.Discard, silent); err != nil || time.Since(start) > 3*time.Second {
		t.Fatalf("a connection that sent nothing: %v after %v, want it closed by the server", err, time.Since(start))
	}

	// Pings every 80 ms for 1.2 s: well past the idle timeout.
	if !pingUntil(t, addr, 80*time.Millisecond, 15) {
		t.Fatal("a connection with no stream was kept past the idle timeout")
	}
}
