package envoytest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvroute/kvroute/envoy"
	"github.com/kvroute/kvroute/envoy/envoytest"
)

// Run the Envoy stand-in in front of kvroute and its workers, as the
// all-in-one demo does.
func ExampleStartGateway() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	workers := []envoy.Worker{{Cluster: "w0", Address: "127.0.0.1:8100"}}
	g, err := envoytest.StartGateway(ctx, envoy.StyleClusterHeader, workers, "127.0.0.1:9002")
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	fmt.Println(g.URL() != "")
	// Output: true
}
