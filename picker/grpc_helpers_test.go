package picker

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/kvroute/kvroute/extproc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// These mirror extproc's own test helpers, for the benchmarks that drive a
// Picker through a real ext_proc server.

type hdr struct{ k, v string }

func headerMsg(mode, respMode extproc.BodyMode, eos bool, hs ...hdr) *pb.ProcessingRequest {
	m := &corev3.HeaderMap{}
	for _, h := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: h.k, RawValue: []byte(h.v)})
	}
	return &pb.ProcessingRequest{
		Request: &pb.ProcessingRequest_RequestHeaders{RequestHeaders: &pb.HttpHeaders{
			Headers: m, EndOfStream: eos,
		}},
		ProtocolConfig: &pb.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: respMode},
	}
}

// routed reports whether a response carries the route (a header mutation
// on the request path).
func routed(r *pb.ProcessingResponse) bool {
	var c *pb.CommonResponse
	switch x := r.Response.(type) {
	case *pb.ProcessingResponse_RequestHeaders:
		c = x.RequestHeaders.GetResponse()
	case *pb.ProcessingResponse_RequestBody:
		c = x.RequestBody.GetResponse()
	}
	return c.GetHeaderMutation() != nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startServer serves cfg on a loopback port and returns a connected client.
func startServer(t testing.TB, cfg extproc.ServerConfig) (*extproc.Server, *grpc.ClientConn) {
	t.Helper()
	srv, err := extproc.NewServer(cfg)
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
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return srv, cc
}
