package vllmzmq

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pyzmq finds a Python with pyzmq (Debian: apt-get install python3-zmq).
// The interop tests need real libzmq on the other end; without it they
// skip, and the rest of the package still pins the wire format.
func pyzmq(t *testing.T) string {
	t.Helper()
	// KVROUTE_PYZMQ_PYTHON names another python with pyzmq, such as the
	// virtual environment scripts/vllm.sh installs.
	for _, py := range []string{os.Getenv("KVROUTE_PYZMQ_PYTHON"), "/usr/bin/python3", "python3"} {
		if py != "" && exec.Command(py, "-c", "import zmq").Run() == nil {
			return py
		}
	}
	t.Skip("no python3 with pyzmq (apt-get install python3-zmq) for the libzmq interop test")
	return ""
}

func freeTCP(t *testing.T) string {
	t.Helper()
	p, err := NewPublisher(context.Background(), PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Mode: Bind, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ep := p.Endpoint()
	_ = p.Close()
	return ep
}

type peer struct {
	cmd   *exec.Cmd
	lines chan string
}

func startPeer(t *testing.T, py string, stdin string, args ...string) *peer {
	t.Helper()
	cmd := exec.Command(py, append([]string{"testdata/libzmq_peer.py"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peer{cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("python stderr: %s", stderr.String())
		}
	})
	if l := p.next(t); l != "ready" {
		t.Fatalf("peer said %q, want ready", l)
	}
	return p
}

func (p *peer) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("python peer exited")
		}
		return l
	case <-time.After(15 * time.Second):
		t.Fatal("python peer said nothing for 15s")
	}
	return ""
}

// TestInteropLibzmqPublisherToSubscriber: a libzmq publisher speaking
// vLLM's protocol, including a gap only replay can fill, read by Subscriber.
func TestInteropLibzmqPublisherToSubscriber(t *testing.T) {
	py := pyzmq(t)
	pubEP, repEP := freeTCP(t), freeTCP(t)
	payloads := [][]byte{{0x93, 1}, {0x93, 2}, {0x93, 3}, {0x93, 4}, {0x93, 5}}
	var in strings.Builder
	for i, p := range payloads {
		if i == 2 {
			in.WriteString("drop ")
		}
		in.WriteString(hex.EncodeToString(p) + "\n")
	}
	s, err := Dial(context.Background(), SubscriberConfig{Endpoint: pubEP, ReplayEndpoint: repEP, Topic: "kv-events", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	startPeer(t, py, in.String(), "publish", pubEP, repEP, "kv-events")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seen []uint64
	for len(seen) < 4 {
		ev, err := s.Recv(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", seen, err)
		}
		if ev.Topic != "kv-events" || !bytes.Equal(ev.Payload, payloads[ev.Seq]) {
			t.Fatalf("event %+v does not match what libzmq published", ev)
		}
		seen = append(seen, ev.Seq)
	}
	if fmt.Sprint(seen) != "[0 1 3 4]" {
		t.Fatalf("live seqs %v, want [0 1 3 4] (2 was dropped)", seen)
	}
	got, err := s.Replay(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Seq != 2 || !bytes.Equal(got[0].Payload, payloads[2]) || got[2].Seq != 4 {
		t.Fatalf("replay from 2 = %+v, want seqs 2..4 with the dropped payload first", got)
	}
}

// TestInteropPublisherToLibzmqSubscriber: our Publisher read by a libzmq
// SUB, and its replay ROUTER asked by a libzmq DEALER.
func TestInteropPublisherToLibzmqSubscriber(t *testing.T) {
	py := pyzmq(t)
	p := startPublisher(t, PublisherConfig{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events"})
	pl := func(seq uint64) []byte { return []byte{0x93, byte(seq), 0xab} }
	peer := startPeer(t, py, "", "subscribe", p.Endpoint(), p.ReplayEndpoint(), "kv-events", "3", "0")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				if _, err := p.Publish(pl(p.NextSeq())); err != nil {
					return
				}
			}
		}
	}()
	for i := 0; i < 3; i++ {
		f := strings.Fields(peer.next(t))
		if len(f) != 4 || f[0] != "event" {
			t.Fatalf("peer line %q, want an event", f)
		}
		seq, _ := strconv.ParseUint(f[2], 10, 64)
		if f[1] != hex.EncodeToString([]byte("kv-events")) || f[3] != hex.EncodeToString(pl(seq)) {
			t.Fatalf("libzmq received topic %s payload %s for seq %d", f[1], f[3], seq)
		}
	}
	var n uint64
	for {
		f := strings.Fields(peer.next(t))
		if len(f) != 2 || f[0] != "replay" {
			t.Fatalf("peer line %q, want a replay reply", f)
		}
		frames := strings.Split(f[1], "|")
		if len(frames) != 4 || frames[0] != "" {
			t.Fatalf("replay reply frames %q, want empty delimiter, topic, sequence, payload", frames)
		}
		if frames[2] == "ffffffffffffffff" {
			if frames[1] != "" || frames[3] != "" {
				t.Fatalf("end marker carries topic %s payload %s, want both empty", frames[1], frames[3])
			}
			break
		}
		if frames[1] != hex.EncodeToString([]byte("kv-events")) || frames[2] != hex.EncodeToString(AppendSeq(nil, n)) || frames[3] != hex.EncodeToString(pl(n)) {
			t.Fatalf("replay reply %q, want topic kv-events, seq %d and its payload", frames, n)
		}
		n++
	}
	if n < 3 {
		t.Fatalf("replay from 0 returned %d batches, want every one published", n)
	}
}
