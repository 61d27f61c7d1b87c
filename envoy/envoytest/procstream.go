package envoytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Ways an exchange with the processor can end early. Envoy treats them
// differently: a timeout or gRPC error obeys failure_mode_allow, a clean
// close or a spurious message just stops processing.
var (
	errMessageTimeout = errors.New("ext_proc message timeout")
	errStreamClosed   = errors.New("ext_proc stream closed by the processor")
	errSpurious       = errors.New("ext_proc spurious message")
)

// armedNow is a closed channel: await starts its timer at once.
var armedNow = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

type recvResult struct {
	resp *extprocsvc.ProcessingResponse
	err  error
}

// procStream is one HTTP request's ext_proc gRPC stream.
type procStream struct {
	stream  extprocsvc.ExternalProcessor_ProcessClient
	cancel  context.CancelFunc
	timeout time.Duration
	recv    chan recvResult
	pumped  chan struct{} // closed when the receive pump exits

	mu        sync.Mutex // serializes Send: the duplex body sender runs beside the main flow
	sentFirst bool
	protocol  *extprocsvc.ProtocolConfiguration
	closed    bool
}

func openProcStream(ctx context.Context, client extprocsvc.ExternalProcessorClient, pc *procConfig) (*procStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	st, err := client.Process(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("open ext_proc stream: %w", err)
	}
	p := &procStream{
		stream: st, cancel: cancel, timeout: pc.messageTimeout,
		recv: make(chan recvResult, 1), pumped: make(chan struct{}),
		protocol: &extprocsvc.ProtocolConfiguration{
			RequestBodyMode:                         pc.mode.GetRequestBodyMode(),
			ResponseBodyMode:                        pc.mode.GetResponseBodyMode(),
			SendBodyWithoutWaitingForHeaderResponse: pc.sendBodyEarly,
		},
	}
	go p.pump(sctx)
	return p, nil
}

func (p *procStream) pump(ctx context.Context) {
	defer close(p.pumped)
	for {
		m, err := p.stream.Recv()
		select {
		case p.recv <- recvResult{m, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// send writes one message; the first carries protocol_config, as Envoy's does.
func (p *procStream) send(req *extprocsvc.ProcessingRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errStreamClosed
	}
	if !p.sentFirst {
		req.ProtocolConfig = p.protocol
		p.sentFirst = true
	}
	if err := p.stream.Send(req); err != nil {
		return fmt.Errorf("ext_proc send: %w", err)
	}
	return nil
}

// await returns the processor's next message. The message_timeout timer
// starts once armed is closed (armedNow for at once).
func (p *procStream) await(ctx context.Context, armed <-chan struct{}) (*extprocsvc.ProcessingResponse, error) {
	var timeout <-chan time.Time
	for {
		select {
		case r := <-p.recv:
			switch {
			case r.err == nil:
				return r.resp, nil
			case errors.Is(r.err, io.EOF):
				return nil, errStreamClosed
			case status.Code(r.err) == codes.OK:
				return nil, errStreamClosed
			}
			return nil, fmt.Errorf("ext_proc gRPC error: %w", r.err)
		case <-armed:
			t := time.NewTimer(p.timeout)
			defer t.Stop()
			timeout, armed = t.C, nil
		case <-timeout:
			return nil, errMessageTimeout
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// abort ends the stream at once (spurious message, timeout, error): Envoy
// stops talking to the processor for the rest of the request.
func (p *procStream) abort() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
}

// finish half-closes the stream at the end of the HTTP exchange and gives
// the processor up to grace to close its side before the stream is
// cancelled, like Envoy's deferred close. It returns at once; done is closed
// when the stream is gone.
func (p *procStream) finish(grace time.Duration) (done <-chan struct{}) {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	if !already {
		_ = p.stream.CloseSend()
	}
	p.mu.Unlock()
	d := make(chan struct{})
	go func() {
		defer close(d)
		defer p.cancel()
		if already {
			return
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		for {
			select {
			case r := <-p.recv:
				if r.err != nil {
					return
				}
			case <-p.pumped:
				return
			case <-t.C:
				return
			}
		}
	}()
	return d
}
